"""``parley agent`` against an arena that stalls, dies or comes back (issue 28 §2).

Real processes: ``parley run ... --listen`` (the arena) and ``parley agent`` (one seat). An
arena paused with SIGSTOP for 7 s loses no episode and keeps its agent; an arena killed
(no goodbye) and started again on the same address is rejoined, and the agent exits 0 only
when an arena says goodbye; an arena that never comes back makes it exit 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = "negotiation/deal-or-no-deal-v0"
SLOW = "tests.arena.run.replica_agents:SlowNegotiator"  # 30 ms per action: a run lasts
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _parley(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "parley.arena.cli", *argv],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _arena(address: str, out: Path, episodes: int) -> subprocess.Popen[bytes]:
    return _parley("run", SCENARIO, "--agents", "scripted,remote", "--listen", address,
                   "--episodes", str(episodes), "--concurrency", "2", "--out", str(out),
                   "--no-progress", "--json")  # fmt: skip


def _agent(address: str, *flags: str) -> subprocess.Popen[bytes]:
    return _parley("agent", "--connect", address, "--seat", "player_1", "--agent", SLOW,
                   "--wait", "60", *flags)  # fmt: skip


def _statuses(out: Path) -> list[str]:
    path = out / "transcripts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["status"] for line in path.read_text().splitlines() if line]


def _until_played(out: Path, count: int, arena: subprocess.Popen[bytes]) -> None:
    """Wait (up to 60 s) until ``count`` episodes of the arena at ``out`` are written."""
    deadline = time.monotonic() + 60
    while len(_statuses(out)) < count:
        assert arena.poll() is None, arena.stderr.read() if arena.stderr else ""
        assert time.monotonic() < deadline, f"{len(_statuses(out))} episodes in 60 s"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode()


def _address() -> str:
    return f"ipc://{tempfile.mkdtemp(prefix='parley-rejoin-')}/arena.sock"  # short ipc path


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_arena_paused_7_s_keeps_its_agent_and_loses_no_episode(tmp_path: Path) -> None:
    """Before: the agent declared the arena dead after 5 s, said "the arena closed; done"
    (exit 0), and every later episode failed waiting for it."""
    address, out = _address(), tmp_path / "run"
    arena = _arena(address, out, episodes=40)
    agent = _agent(address)
    try:
        _until_played(out, 3, arena)
        arena.send_signal(signal.SIGSTOP)
        time.sleep(7)
        arena.send_signal(signal.SIGCONT)
        arena_status, arena_err = _finish(arena, 90)
        agent_status, agent_err = _finish(agent, 30)
    finally:
        for proc in (arena, agent):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    statuses = _statuses(out)
    assert arena_status == 0, arena_err
    assert statuses == ["ok"] * 40, arena_err
    assert agent_status == 0, agent_err
    assert "the arena said goodbye" in agent_err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_agent_rejoins_a_restarted_arena_and_gives_up_on_a_lost_one(tmp_path: Path) -> None:
    """An arena killed mid-run (no goodbye) and started again on the same address is joined
    again, and plays every episode; the agent exits 0 at its goodbye. An agent whose arena
    is killed and never comes back exits 1 after --rejoin-window. (Before: both agents
    left for good, exit 0, when the killed arena fell silent.)"""
    address = _address()
    first = _arena(address, tmp_path / "first", episodes=1000)
    agent = _agent(address)
    procs = [first, agent]
    try:
        _until_played(tmp_path / "first", 2, first)
        first.kill()
        first.wait()
        time.sleep(1.5)  # the agent notices the closed connection: the arena is lost
        assert agent.poll() is None  # (it waits for the arena to come back)
        config = RunConfig(
            scenario=SCENARIO, agents=["scripted", "remote"], episodes=6, concurrency=2,
            listen=address, out=str(tmp_path / "again"), progress=False, join_timeout=60.0,
        )  # fmt: skip
        result = run(config)
        assert result.summary["episodes"] == {"total": 6, "ok": 6, "failed": 0}
        status, err = _finish(agent, 30)
        assert status == 0, err
        assert "the arena said goodbye" in err
        # An arena that never comes back: a non-zero exit once the window is over.
        address = _address()
        last = _arena(address, tmp_path / "last", episodes=1000)
        agent = _agent(address, "--rejoin-window", "2")
        procs += [last, agent]
        _until_played(tmp_path / "last", 1, last)
        last.kill()
        last.wait()
        status, err = _finish(agent, 30)
        assert status == 1, err
        assert "lost the arena" in err
        assert "--rejoin-window" in err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
