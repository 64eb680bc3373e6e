"""``parley serve`` in its own process; an arena and the openai client connect to it."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from parley.agents.llm import BusPoolClient
from parley.arena.cli import main
from parley.protocols.messages import GenerateRequest, GenerateResult, SamplingParams

pytest.importorskip("torch")


def _read_line(proc: subprocess.Popen[bytes], prefix: str, timeout: float) -> str:
    """The first stdout line starting with ``prefix``, within ``timeout`` seconds.

    stdout is unbuffered (``bufsize=0``), so ``select`` sees every byte not yet read.
    """
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not sel.select(left):
            break
        line = proc.stdout.readline().decode()
        if not line:
            break
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    raise AssertionError(f"parley serve printed no {prefix!r} line within {timeout} s")


@pytest.fixture
def served(tiny_model_dir: Path) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    cmd = [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(tiny_model_dir)]
    cmd += ["--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0", "--policy", "tiny"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, bufsize=0, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        address = _read_line(proc, "pool listening on ", 90)
        url = _read_line(proc, "openai api on ", 10)
        yield address, url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.timeout(300)
def test_an_arena_uses_a_served_pool(
    served: tuple[str, str, subprocess.Popen[bytes]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    address, url, proc = served
    agents = f"llm:{tiny_model_dir}?policy=tiny&max_tokens=6,scripted"
    status = main(
        [
            *("run", "negotiation/deal-or-no-deal-v0", "--agents", agents, "--pool", address),
            *("--episodes", "2", "--no-progress", "--out", str(tmp_path), "-s", "max_turns=2"),
        ]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert status == 0
    assert summary["episodes"]["ok"] == 2
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    reply = client.completions.create(model="tiny", prompt="deal", max_tokens=3)
    assert len(reply.choices) == 1
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0


@pytest.mark.timeout(300)
def test_a_stopped_server_does_not_time_out_the_requests_it_had(
    served: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    """``parley serve`` stopped (SIGSTOP) past its requests' ``timeout`` while it holds them
    (queued or generating): once resumed, it answers them, not ``timeout`` errors. The
    pool's timers count the time it ran (before: every request still held on SIGCONT was
    answered ``timeout``, in 3 of 3 rounds). A request it cannot finish still times out:
    ``test_pool_limits``."""
    address, _, proc = served

    async def round_(client: BusPoolClient) -> list[str]:
        asks = [
            GenerateRequest(
                policy="tiny",
                prompt=f"deal {i}",
                params=SamplingParams(max_tokens=32, temperature=1.0, seed=i),
                timeout=LIMIT_S,
            )
            for i in range(48)
        ]
        calls = [asyncio.ensure_future(client.generate(ask)) for ask in asks]
        await asyncio.sleep(0.1)  # (the server reads them and starts generating)
        proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(2 * LIMIT_S)
        finally:
            proc.send_signal(signal.SIGCONT)
        got = await asyncio.gather(*calls, return_exceptions=True)
        return [type(r).__name__ + str(r)[:80] for r in got if not isinstance(r, GenerateResult)]

    async def main_() -> list[list[str]]:
        client = await BusPoolClient.connect(address, timeout=60.0)
        try:
            return [await round_(client) for _ in range(3)]
        finally:
            await client.close()

    failed = asyncio.run(main_())
    assert failed == [[], [], []]


LIMIT_S = 2.0
"""Each request's own ``timeout``; the server is stopped for twice as long."""
