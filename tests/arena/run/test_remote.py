"""Agents in another process: whole episodes over ipc:// and tcp://, and an agent that dies.

The remote side is a real second Python process: ``parley agent`` (the command line) over
ipc, :func:`parley.arena.run.agent_host.join_arena` over tcp, and a process that kills itself
with SIGKILL in the middle of an episode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from parley.protocols.bus import BusConfig
from parley.protocols.messages import Action, Observation
from tests.arena.run.test_runner import HERE, SCENARIO, TargetAgent

ROOT = Path(__file__).resolve().parents[3]


class DyingAgent(TargetAgent):
    """Plays well, then kills its own process (SIGKILL: no goodbye) at its 5th action."""

    acts = 0  # per process: every episode's instance counts towards the same death

    async def act(self, observation: Observation) -> Action:
        DyingAgent.acts += 1
        if DyingAgent.acts == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return await super().act(observation)


# Heartbeats: in the kill test both sides beat every 0.2 s and give up after 2 s, so the
# death is seen long before the 20 s act timeout; the other tests keep the defaults (a closed
# connection is dead after 2.5 s, an open but silent one after 60 s), so that a loaded
# machine stalling a process for a moment cannot fake a death.
KILL_BUS = BusConfig(heartbeat_interval=0.2, peer_timeout=2.0, request_timeout=5.0)

_JOIN = """
import asyncio, sys
from parley.arena.run.agent_host import join_arena
from parley.arena.run.agent_specs import load_object
from parley.protocols.bus import BusConfig
beat, timeout, most = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
bus = BusConfig(heartbeat_interval=beat, peer_timeout=timeout, max_message_bytes=most)
asyncio.run(join_arena(sys.argv[1], {"b": load_object(sys.argv[2])}, bus=bus,
                       connect_timeout=30))
"""


def _join_argv(agent: str, bus: BusConfig) -> list[str]:
    beat, timeout, most = (
        str(bus.heartbeat_interval),
        str(bus.peer_timeout),
        str(bus.max_message_bytes),
    )
    return [sys.executable, "-c", _JOIN, "ADDRESS", agent, beat, timeout, most]


def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE)


def _steps(out: Path) -> list[Any]:
    rows = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
    return [(r["episode"], r["steps"], r["metrics"], r["status"]) for r in rows]


def _remote_run(
    out: Path,
    listen: str,
    argv: list[str],
    *,
    concurrency: int = 2,
    bus: BusConfig | None = None,
    **kw: Any,
) -> Any:
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(address: str) -> None:
        procs.append(_spawn([arg.replace("ADDRESS", address) for arg in argv]))

    config = RunConfig(
        scenario=SCENARIO, agents=["scripted", "remote"], episodes=4, concurrency=concurrency,
        listen=listen, out=str(out), progress=False, **{"join_timeout": 30.0, **kw},
    )  # fmt: skip
    try:
        result = run(config, bus=bus, on_listen=spawn, keep_records=True)
        # The arena said goodbye on closing: the remote agent leaves by itself.
        status = procs[0].wait(timeout=20)
        stderr = procs[0].stderr.read().decode() if procs[0].stderr else ""
        assert status in (0, -signal.SIGKILL), stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return result, procs[0]


@pytest.mark.timeout(90)
def test_remote_agent_over_ipc_with_the_parley_agent_command(tmp_path: Path) -> None:
    listen = f"ipc://{tmp_path}/arena.sock"
    argv = [sys.executable, "-m", "parley.arena.cli", "agent", "--connect", "ADDRESS",
            "--seat", "b", "--agent", f"{HERE}:TargetAgent", "--wait", "30"]  # fmt: skip
    result, proc = _remote_run(tmp_path / "remote", listen, argv)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert result.endpoint == listen
    assert result.summary["episodes"] == {"total": 4, "ok": 4, "failed": 0}
    # The same episodes as with the agent in-process.
    local = tmp_path / "local"
    run(RunConfig(scenario=SCENARIO, episodes=4, out=str(local), progress=False))
    assert _steps(tmp_path / "remote") == _steps(local)


@pytest.mark.timeout(90)
def test_remote_agent_over_tcp_with_join_arena(tmp_path: Path) -> None:
    argv = _join_argv(f"{HERE}:TargetAgent", BusConfig())
    result, proc = _remote_run(tmp_path, "tcp://127.0.0.1:0", argv)
    assert proc.returncode == 0
    assert result.endpoint.startswith("tcp://127.0.0.1:")
    assert result.summary["episodes"]["ok"] == 4
    assert result.summary["metrics"]["success"]["mean"] == 1.0
    tokens = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert tokens[1]["agent"] == "b"
    assert tokens[1]["turns"][0]["tokens"][0]["logprobs"] == [-0.5]


@pytest.mark.timeout(90)
def test_a_remote_agent_killed_mid_episode_fails_that_episode_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    argv = _join_argv("tests.arena.run.test_remote:DyingAgent", KILL_BUS)
    # One episode at a time: the 5th action of seat b falls in episode 1 (b acts 3 times
    # per episode). Nobody rejoins after the kill: later episodes wait join_timeout, fail.
    result, proc = _remote_run(
        tmp_path,
        f"ipc://{tmp_path}/a.sock",
        argv,
        concurrency=1,
        bus=KILL_BUS,
        act_timeout=20.0,
        join_timeout=6.0,
    )
    assert proc.returncode == -signal.SIGKILL
    statuses = [r.failed.split(": ")[:2] for r in result.records]
    assert statuses[0] == [""]
    assert statuses[1] == ["b", "peer_dead"]  # found dead long before the 20 s act timeout
    assert statuses[2:] == [["b", "not_joined"]] * 2
    assert result.summary["episodes"]["failed"] == 3
    assert result.summary["metrics"]["success"]["n"] == 1
    rows = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    assert len(rows) == 4  # every episode has its record, failed ones included
