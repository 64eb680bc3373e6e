"""Seat replicas as plain ``parley agent`` processes (issue 15): requests spread across them,
and a replica killed mid-run loses no request and answers none twice.

Real processes (``python -m parley.arena.cli agent``) on a real ``ipc://`` listener; the
killed replica gets SIGKILL (no goodbye: the arena notices its closed connection) or
SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from parley.agents.base import Agent
from parley.arena.run.agent_host import AgentHost
from parley.arena.run.agent_specs import SeatContext
from parley.arena.run.bus_replicas import BusReplicas
from parley.arena.run.config import RunConfig
from parley.arena.run.ray_agents import resolve_replicas
from parley.arena.run.runner import Runner
from parley.protocols.bus import Endpoint
from parley.protocols.errors import ConfigError, RequestTimeout
from parley.protocols.messages import Action, Observation

SCENARIO = "negotiation/deal-or-no-deal-v0"
ROOT = Path(__file__).resolve().parents[3]
AGENT = "tests.arena.run.replica_agents:SlowNegotiator"


def _replica(address: str, seat: str, name: str, agent: str = AGENT) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "parley.arena.cli", "agent", "--connect", address,
            "--seat", seat, "--name", name, "--agent", agent, "--wait", "60"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE)


def _episodes(out: Path) -> dict[str, Any]:
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    return {f"{r['episode']}/{r['agent']}": r for r in rows}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
async def test_replica_processes_share_a_seat_and_a_killed_one_loses_nothing(
    tmp_path: Path, signum: int
) -> None:
    """SIGKILL (no goodbye: the arena notices the closed connection) or SIGTERM (the replica
    says goodbye, its acts in flight cancelled unanswered) of one of three replicas mid-run
    costs no episode."""
    folder = Path(tempfile.mkdtemp(prefix="parley-replicas-"))  # ipc paths must be short
    address = f"ipc://{folder}/seat.sock"
    config = RunConfig(
        scenario=SCENARIO, episodes=24, seed=5, concurrency=6, progress=False,
        agents=["scripted", f"replicas:3:{address}"], out=str(tmp_path / "replicas"),
        act_timeout=60.0,
    )  # fmt: skip
    runner = Runner(config)
    replicas = runner.sources["player_1"]
    assert isinstance(replicas, BusReplicas)
    procs = {f"agent-player_1-{k}": _replica(address, "player_1", f"agent-player_1-{k}")
             for k in (1, 2, 3)}  # fmt: skip
    victim = "agent-player_1-2"
    try:
        playing = asyncio.create_task(runner.run())
        # Kill one replica (no goodbye) once it is serving episodes.
        while replicas.served.get(victim, 0) < 3:
            assert not playing.done(), playing.result()
            await asyncio.sleep(0.02)
        procs[victim].send_signal(signum)
        result = await asyncio.wait_for(playing, 150)
        await replicas.close()
        for name, proc in procs.items():
            if name != victim:  # the arena left: the others exit by themselves
                assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await replicas.close()
    failures = [
        row.get("failed") or row.get("error") or row
        for row in map(json.loads, (tmp_path / "replicas/transcripts.jsonl").open())
        if row["status"] != "ok"
    ]
    assert result.summary["episodes"] == {"total": 24, "ok": 24, "failed": 0}, failures[:3]
    if signum == signal.SIGKILL:  # (a SIGTERMed one may have had no request pending)
        assert replicas.lost == [victim]
        assert replicas.failovers >= 1
    assert all(replicas.served.get(name, 0) > 0 for name in procs)  # spread over all three
    assert set(replicas.sessions.values()) == {0}  # every episode's session was closed
    # None lost, none twice: every episode is the one a single in-process agent plays
    # (the replica's agent is deterministic), and the replicas' answers add up to the
    # seat's actions exactly.
    local = tmp_path / "local"
    await Runner(config.replace(agents=["scripted", "scripted"], out=str(local))).run()
    got, want = _episodes(tmp_path / "replicas"), _episodes(local)
    assert got == want
    seat_actions = sum(len(r["turns"]) for k, r in got.items() if k.endswith("/player_1"))
    assert sum(replicas.served.values()) == seat_actions


@pytest.mark.timeout(120)
async def test_a_replica_that_leaves_before_the_last_joins_still_counts(tmp_path: Path) -> None:
    """The first wait is for N replicas to *join*: one of three that joined and left (SIGTERM)
    before the third joined had made the wait for three live ones hang past the act timeout
    (on a loaded machine the third replica's start is slow enough for this)."""
    folder = Path(tempfile.mkdtemp(prefix="parley-replicas-"))
    address = f"ipc://{folder}/seat.sock"
    config = RunConfig(
        scenario=SCENARIO, episodes=4, seed=2, concurrency=4, progress=False, out=str(tmp_path),
        agents=["scripted", f"replicas:3:{address}"], act_timeout=60.0, join_timeout=40.0,
    )  # fmt: skip
    runner = Runner(config)
    replicas = runner.sources["player_1"]
    assert isinstance(replicas, BusReplicas)
    playing = asyncio.create_task(runner.run())
    procs = [_replica(address, "player_1", f"agent-player_1-{k}") for k in (1, 2)]
    try:
        while len(replicas.live()) < 2:
            assert not playing.done(), playing.result()
            await asyncio.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(procs[1].wait, 30) == 128 + signal.SIGTERM
        while len(replicas.live()) > 1:  # noqa: ASYNC110 -- the bus has no leave event
            await asyncio.sleep(0.05)
        procs.append(_replica(address, "player_1", "agent-player_1-3"))
        result = await asyncio.wait_for(playing, 100)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await replicas.close()
    assert result.summary["episodes"] == {"total": 4, "ok": 4, "failed": 0}
    assert set(replicas.served) == {"agent-player_1-1", "agent-player_1-3"}


@pytest.mark.timeout(60)
async def test_a_stranger_is_refused_and_no_replica_fails_the_episode(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="parley-replicas-"))
    address = f"ipc://{folder}/seat.sock"
    config = RunConfig(
        scenario=SCENARIO, episodes=2, concurrency=2, progress=False, out=str(tmp_path),
        agents=["scripted", f"replicas:1:{address}"], agent_options={"replicas_join_timeout": 3},
    )  # fmt: skip
    runner = Runner(config)
    replicas = runner.sources["player_1"]
    assert isinstance(replicas, BusReplicas)
    # A peer under another seat's name is refused: it cannot take this seat.
    stranger = _replica(address, "player_1", "agent-player_0")
    try:
        result = await runner.run()
        assert await asyncio.to_thread(stranger.wait, 30) != 0
        refusal = stranger.stderr.read().decode() if stranger.stderr else ""
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait()
        await replicas.close()
    assert "agent-player_1-K" in refusal
    assert result.summary["episodes"]["failed"] == 2  # no replica joined: failed, not hung
    assert replicas.served == {}


def test_bad_replica_specs_say_what_to_write() -> None:
    seat = SeatContext(scenario=SCENARIO, seat="player_1", baseline="", options={})
    with pytest.raises(ConfigError, match="replicas:3:tcp://"):
        resolve_replicas("x:tcp://127.0.0.1:5600", seat)
    bad = SeatContext(scenario=SCENARIO, seat="player_1", baseline="",
                      options={"replicas_curve_key": "k.key_secret"})  # fmt: skip
    with pytest.raises(ConfigError, match="replicas_client_keys"):
        resolve_replicas("2:tcp://10.0.0.1:5600", bad)
    replicas = resolve_replicas("2:ipc:///tmp/x.sock", seat)
    with pytest.raises(TypeError, match="not on Ray"):
        pickle.dumps(replicas)


def test_a_ray_run_refuses_process_replicas_with_the_fix() -> None:
    from parley.arena.run.ray_runner import RayRunner

    config = RunConfig(scenario=SCENARIO, agents=["scripted", "replicas:2:ipc:///tmp/x.sock"])
    with pytest.raises(ConfigError, match="replicas:N:SPEC"):
        RayRunner(config.replace(ray="local"))


@pytest.mark.timeout(90)
async def test_an_agent_that_raises_fails_its_episode_not_the_replica(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="parley-replicas-"))
    address = f"ipc://{folder}/seat.sock"
    config = RunConfig(
        scenario=SCENARIO, episodes=8, seed=1, concurrency=4, progress=False, out=str(tmp_path),
        agents=["scripted", f"replicas:2:{address}"],
    )  # fmt: skip
    runner = Runner(config)
    replicas = runner.sources["player_1"]
    assert isinstance(replicas, BusReplicas)
    flaky = "tests.arena.run.replica_agents:FlakyNegotiator"
    procs = [_replica(address, "player_1", f"agent-player_1-{k}", flaky) for k in (1, 2)]
    try:
        result = await runner.run()
        await replicas.close()
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await replicas.close()
    rows = [json.loads(x) for x in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r["status"] != "ok"]
    seeds = {r["episode"]: r["agent_seeds"]["player_1"] for r in rows}
    assert failed  # the even seeds
    assert {r["episode"] for r in failed} == {e for e, s in seeds.items() if s % 2 == 0}
    assert all("flaky negotiator gave up" in json.dumps(r) for r in failed)
    assert result.summary["episodes"]["failed"] == len(failed)
    assert replicas.failovers == 0  # an agent's error is no dead replica
    assert replicas.lost == []


class _Tagged(Agent):
    """Answers each observation with its replica's tag and the observation's text."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def reset(self, seed: int | None = None) -> None:
        pass

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text=f"{self.tag}:{observation.text}")


@pytest.mark.timeout(60)
async def test_a_replica_gone_between_two_turns_of_a_session_costs_it_nothing() -> None:
    """A replica that leaves while a session it served waits for its next observation is no
    longer a bus peer at all; the session moves on, catching the other replica up. (Before:
    the next request raised an uncaught BusError "has no peer named ...": a failed episode.)"""
    folder = Path(tempfile.mkdtemp(prefix="parley-replicas-"))
    replicas = BusReplicas("player_1", f"ipc://{folder}/seat.sock", 2, join_timeout=30)
    hosts: dict[str, Endpoint] = {}
    try:
        starting = asyncio.create_task(replicas.start())
        while not replicas.bound:  # noqa: ASYNC110 -- the listener has no "bound" event
            await asyncio.sleep(0.01)
        for k in ("1", "2"):
            endpoint = Endpoint(f"agent-player_1-{k}")
            AgentHost(endpoint, {"player_1": lambda k=k: _Tagged(k)})
            await endpoint.connect(replicas.bound, timeout=10)
            hosts[endpoint.name] = endpoint
        await asyncio.wait_for(starting, 30)
        session = replicas()
        session.reset(1)
        first = await session.act(Observation(agent="player_1", text="one"))
        gone = session.replica
        assert gone is not None
        assert first.text == f"{gone[-1]}:one"
        await hosts.pop(gone).close()  # says Bye: the listener forgets the name
        while gone in replicas.live():  # noqa: ASYNC110 -- the bus has no "peer left" event
            await asyncio.sleep(0.01)
        second = await asyncio.wait_for(session.act(Observation(agent="player_1", text="two")), 10)
        (other,) = hosts
        assert second.text == f"{other[-1]}:two"
        assert (replicas.lost, replicas.failovers) == ([gone], 1)
        assert replicas.served == {gone: 1, other: 1}  # (the catch-up "one" is not counted)
        await session.close()
    finally:
        for endpoint in hosts.values():
            await endpoint.close()
        await replicas.close()


async def test_replica_seats_wait_the_runs_join_timeout_and_count_all_replicas() -> None:
    """``replicas:N`` seats wait ``--join-timeout`` (``replicas_join_timeout`` overrides it),
    and the message of a wait that ran out counts the N replicas. (Before: a fixed 60 s, and
    "0 of 1 replicas" for a seat of 3 after its first episode.)"""
    folder = Path(tempfile.mkdtemp(prefix="parley-replicas-"))
    address = f"ipc://{folder}/seat.sock"
    seat = SeatContext(scenario=SCENARIO, seat="player_1", join_timeout=0.3)
    replicas = resolve_replicas(f"3:{address}", seat)
    assert isinstance(replicas, BusReplicas)
    assert replicas.join_timeout == 0.3
    own = SeatContext(scenario=SCENARIO, seat="player_1", join_timeout=0.3,
                      options={"replicas_join_timeout": 5})  # fmt: skip
    assert resolve_replicas(f"3:{address}", own).join_timeout == 5
    try:
        with pytest.raises(RequestTimeout, match=r"0 of the 3 replicas .* within 0\.3 s"):
            await replicas.start()
        with pytest.raises(RequestTimeout, match="0 of the 3 replicas"):
            await replicas.pick()  # a later episode waits for one: still counts 3
    finally:
        await replicas.close()
