"""``parley run --pool ADDRESS`` checks the pool once at start and fails in seconds."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq.asyncio

from parley.arena.inference.llm_spec import PoolUnreachable, check_pool, close_shared_pools
from parley.arena.inference.pool import POOL_ENDPOINT, InferencePool
from parley.protocols.bus import Endpoint
from parley.protocols.errors import ParleyError
from parley.protocols.messages import Envelope, Error, GenerateRequest

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(180)
def test_run_without_a_pool_fails_at_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "parley.arena.cli", "run", "negotiation/deal-or-no-deal-v0"]
    cmd += ["--agents", f"llm:{tiny_model_dir},scripted", "--pool", address]
    cmd += ["--episodes", "60", "--concurrency", "16", "--no-progress", "--out", str(tmp_path)]
    started = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=150, env={**os.environ, "COLUMNS": "300"}
    )
    took = time.monotonic() - started
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert address in lines[0]
    assert "parley serve" in lines[0]
    # The check waits 5 s; Python start-up, imports and the tokenizer take 6 s on an idle
    # 2-core machine and up to ~35 s on a loaded one. Without the check the run waited
    # 30 s per wave of 16 episodes (4 waves here: >= 120 s; measured 240 s for 60).
    assert "within 5 s" in lines[0]
    assert took < 75, f"took {took:.1f} s"
    assert not (tmp_path / "summary.json").exists()


async def test_check_pool_finds_policies(tiny_model_dir: Path) -> None:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    ctx = zmq.asyncio.Context()
    try:
        async with (
            InferencePool({"tiny": backend}) as pool,
            Endpoint(POOL_ENDPOINT, context=ctx) as server,
        ):
            pool.serve(server)
            address = await server.bind("tcp://127.0.0.1:0")
            await check_pool(address, ["tiny"], timeout=5)
            with pytest.raises(PoolUnreachable, match="does not serve policy 'other'"):
                await check_pool(address, ["tiny", "other"], timeout=5)
            await close_shared_pools()
        started = time.monotonic()
        with pytest.raises(PoolUnreachable, match=f"no inference pool answers at {address}"):
            await check_pool(address, ["tiny"], timeout=1)
        assert time.monotonic() - started < 5
    finally:
        await close_shared_pools()
        ctx.term()


async def test_a_bad_address_is_reported_as_it_is() -> None:
    """A malformed address is the user's mistake, not an absent pool: its own error."""
    try:
        with pytest.raises(
            ParleyError, match=r"cannot connect to tcp://127\.0\.0\.1:notaport"
        ) as e:
            await check_pool("tcp://127.0.0.1:notaport", ["tiny"], timeout=1)
        assert not isinstance(e.value, PoolUnreachable)
    finally:
        await close_shared_pools()


@pytest.mark.parametrize(
    ("code", "present"),
    [("closed", False), ("backend_failed", False), ("overloaded", True), ("bad_request", True)],
)
async def test_a_pool_answering_the_probe_with_an_error_is_not_taken_as_serving(
    code: str, present: bool
) -> None:
    """A hostile (or broken) pool answers every request with ``code``: only ``bad_request``
    and ``overloaded`` mean the policy is there; anything else is reported with its code."""

    async def answer(env: Envelope) -> Error:
        return Error(code=code, message=f"pool says {code}")

    ctx = zmq.asyncio.Context()
    try:
        async with Endpoint(POOL_ENDPOINT, context=ctx) as server:
            server.on(GenerateRequest, answer)
            address = await server.bind("tcp://127.0.0.1:0")
            if present:
                await check_pool(address, ["tiny"], timeout=5)
            else:
                with pytest.raises(PoolUnreachable, match=f"with {code}: pool says {code}"):
                    await check_pool(address, ["tiny"], timeout=5)
            await close_shared_pools()
    finally:
        await close_shared_pools()
        ctx.term()


async def test_a_stall_of_the_checking_process_is_not_the_pools_silence() -> None:
    """The probe's bound counts the time the checking process ran: its loop blocked 1 s
    (the process stopped, or starved on a loaded host) right as it sends a probe bounded
    by 0.3 s, the pool's answer waiting in the socket, the check passes (before: the
    probe's timer fired first on resuming, "did not answer a probe within 0.3 s")."""

    async def answer(env: Envelope) -> Error:
        return Error(code="bad_request", message="empty prompt")

    ctx = zmq.asyncio.Context()
    try:
        async with Endpoint(POOL_ENDPOINT, context=ctx) as server:
            server.on(GenerateRequest, answer)
            address = await server.bind("tcp://127.0.0.1:0")
            await check_pool(address, ["tiny"], timeout=5)  # (connected: the next one probes)
            for _ in range(3):
                asyncio.get_running_loop().call_soon(time.sleep, 1.0)
                await check_pool(address, ["tiny"], timeout=0.3)
    finally:
        await close_shared_pools()
        ctx.term()
