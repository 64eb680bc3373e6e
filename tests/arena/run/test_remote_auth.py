"""Who may take a seat (issue 11 §1, §3): an arena on tcp with CURVE keys, each seat bound
to its agent's key, intruders and squatters refused while the real agents play; open tcp
refused without keys; a seat whose agent never comes fails fast.

The agents are real ``parley agent`` processes started with the keys ``parley keys new``
made; the squatter is an in-process endpoint holding another seat's valid key.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import Runner, run
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import RemoteError
from parley.protocols.keys import load_public_key, load_secret_key
from tests.arena.run.test_runner import HERE, SCENARIO

ROOT = Path(__file__).resolve().parents[3]


def _parley(*args: str, wait: bool = True) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "parley.arena.cli", *args]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if wait:
        proc.wait(timeout=60)
    return proc


def _agent(address: str, seat: str, keys: Path, key_name: str, *, wait: float = 30) -> list[str]:
    return [
        "agent", "--connect", address, "--seat", seat, "--agent", f"{HERE}:TargetAgent",
        "--curve-key", str(keys / f"{key_name}.key_secret"),
        "--server-key", str(keys / "arena.key"), "--wait", str(wait),
    ]  # fmt: skip


@pytest.mark.timeout(120)
def test_curve_arena_admits_each_seat_only_from_its_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    made = _parley("keys", "new", "arena", "agent-a", "agent-b", "intruder", "--dir", str(keys))
    assert made.returncode == 0, made.stderr.read() if made.stderr else ""
    assert (keys / "agent-b.key_secret").stat().st_mode & 0o077 == 0  # private to its owner
    procs: list[subprocess.Popen[bytes]] = []
    refusals: list[str] = []

    async def squat(address: str) -> None:
        """Seat a's valid key, claiming seat b's name: refused, before b's agent joins."""
        public, secret = load_secret_key(keys / "agent-a.key_secret")
        config = BusConfig(
            curve_public_key=public,
            curve_secret_key=secret,
            curve_server_key=load_public_key(keys / "arena.key"),
        )
        squatter = Endpoint("agent-b", config=config)
        try:
            await squatter.connect(address, timeout=10)
        except RemoteError as exc:
            refusals.append(exc.code)
        finally:
            await squatter.close()

    def start_agents(address: str) -> None:
        procs.append(_parley(*_agent(address, "b", keys, "intruder", wait=3), wait=False))
        asyncio.get_running_loop().create_task(squat(address))
        procs.append(_parley(*_agent(address, "a", keys, "agent-a"), wait=False))
        procs.append(_parley(*_agent(address, "b", keys, "agent-b"), wait=False))

    config = RunConfig(
        scenario=SCENARIO, agents=["remote", "remote"], episodes=4, concurrency=2,
        listen="tcp://127.0.0.1:0", progress=False, join_timeout=60.0,
        curve_key=str(keys / "arena.key_secret"),
        seat_keys={"a": str(keys / "agent-a.key"), "b": str(keys / "agent-b.key")},
    )  # fmt: skip
    try:
        result = run(config, on_listen=start_agents)
        intruder, agent_a, agent_b = (p.wait(timeout=30) for p in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert result.summary["episodes"] == {"total": 4, "ok": 4, "failed": 0}
    assert refusals == ["not_admitted"]
    assert (agent_a, agent_b) == (0, 0)
    assert intruder == 1  # its key is not listed: no handshake, it gives up
    assert b"no Hello" in (procs[0].stderr.read() if procs[0].stderr else b"")


def test_seat_keys_must_match_the_remote_seats(tmp_path: Path) -> None:
    from parley.protocols.errors import ConfigError
    from parley.protocols.keys import make_key_pair

    make_key_pair(tmp_path, "arena")
    make_key_pair(tmp_path, "agent-b")
    base = {"scenario": SCENARIO, "agents": ["scripted", "remote"], "progress": False}
    secret = str(tmp_path / "arena.key_secret")
    with pytest.raises(ConfigError, match=r"seat_keys for \['b'\]"):
        Runner(RunConfig(**base, curve_key=secret))
    with pytest.raises(ConfigError, match="not remote seats"):
        Runner(RunConfig(**base, curve_key=secret, seat_keys={"a": str(tmp_path / "agent-b.key")}))
    with pytest.raises(ConfigError, match="need curve_key"):
        Runner(RunConfig(**base, seat_keys={"b": str(tmp_path / "agent-b.key")}))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["run", "serve"])
def test_open_tcp_without_keys_is_refused_by_the_cli(command: str) -> None:
    """Nothing is bound: the refusal comes first, with what to do instead."""
    if command == "run":
        args = ["run", "collaboration/referential-v0", "--agents", "scripted,remote",
                "--listen", "tcp://0.0.0.0:0", "--no-progress"]  # fmt: skip
    else:
        args = ["serve", "--model", "models/none", "--listen", "tcp://0.0.0.0:0"]
    proc = _parley(*args)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode == 2, stderr
    assert "without CURVE keys" in stderr
    assert "--insecure" in stderr


@pytest.mark.timeout(60)
def test_a_seat_whose_agent_never_comes_fails_fast() -> None:
    """Every episode shares one join_timeout wait, not one each."""
    config = RunConfig(
        scenario=SCENARIO, agents=["scripted", "remote"], episodes=8, concurrency=1,
        progress=False, join_timeout=1.0,
    )  # fmt: skip
    start = time.monotonic()
    result = run(config)
    wall = time.monotonic() - start
    assert result.summary["episodes"] == {"total": 8, "ok": 0, "failed": 8}
    assert wall < 1.0 + 3.0, f"{wall:.1f} s: each episode waited join_timeout again"


@pytest.mark.timeout(60)
def test_the_protocol_md_peer_learns_the_seat_name_and_plays(tmp_path: Path) -> None:
    """Written from PROTOCOL.md alone: a wrong name is refused with the names the arena
    waits for; the right one plays every episode (interleaved, ended by one-way notices)."""
    import threading

    from tests.protocols.test_interop import _example

    mini_peer = _example()["MiniPeer"]
    seen: dict[str, str] = {}
    stop = threading.Event()

    def play(address: str) -> None:
        try:
            mini_peer(address, "b")
        except RuntimeError as exc:
            seen["refusal"] = str(exc)
        peer = mini_peer(address, "agent-b", heartbeat=0.2)
        while not stop.is_set():
            peer.serve_once(0.02)
        peer.close()

    threads: list[threading.Thread] = []

    def start(address: str) -> None:
        threads.append(threading.Thread(target=play, args=(address,), daemon=True))
        threads[0].start()

    config = RunConfig(
        scenario=SCENARIO, agents=["scripted", "remote"], episodes=6, concurrency=3,
        listen=f"ipc://{tmp_path}/arena", progress=False, join_timeout=30.0,
    )  # fmt: skip
    try:
        result = run(config, on_listen=start)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert "not_admitted" in seen["refusal"]
    assert "agent-b" in seen["refusal"]
    assert result.summary["episodes"] == {"total": 6, "ok": 6, "failed": 0}
