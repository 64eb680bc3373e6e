"""In-process and remote agents see the same messages and failures (arena/run/seats.py).

One set of checks, run over every :class:`SeatTransport` the runner chooses from: the
in-process one (the wire codec, no bus hop), the bus one (a real agent host on another
endpoint over ``inproc://``), and the bus one with batched frames. For the same agent each
must give:

- the agent the same observation (byte for byte, as the bus decodes it), and the runner the
  same action back;
- the same failure for an agent that raises, returns something other than an action,
  returns an action too large for the wire, or does not answer in time (the reason's kind,
  and for an agent's error its whole text: a timeout's wording names its route);
- the same order semantics: with ``pipeline`` every seat is asked and answers, without it
  the seats are asked in turn up to the first failure;
- the end-of-episode notice, with the reason the episode failed, at the agent host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq.asyncio
from rich.console import Console

from parley.agents.base import Agent
from parley.arena.bench.env import Chatter
from parley.arena.run.agent_host import AGENT_ACCEPTS, AgentHost, join_arena
from parley.arena.run.backpressure import failure_reason
from parley.arena.run.config import RunConfig
from parley.arena.run.direct import DirectAgents
from parley.arena.run.frames import FrameBatcher
from parley.arena.run.peers import AbsentPeers
from parley.arena.run.runner import Runner
from parley.arena.run.seats import (
    ARENA_NAME,
    LOCAL_HOST_NAME,
    BusSeats,
    InProcessSeats,
    SeatTransport,
)
from parley.arena.run.security import ARENA_ACCEPTS
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.codec import Codec
from parley.protocols.messages import Action, Envelope, Observation
from tests.arena.run.broadcast_fixture import register_broadcast

# Every seat acts every step: in-process and remote seats are asked in one step.
BROADCAST = register_broadcast("test/seat-transport-broadcast-v0")

LIMIT = 64 * 1024  # max_message_bytes of the codec and of both endpoints
TIMEOUT = 0.3
KINDS = ["in_process", "bus", "bus_batched"]


class _Echo(Agent):
    """Keeps the bytes of what it saw; answers with a move naming ``info["pair"]``."""

    seen: list[bytes] = []  # noqa: RUF012 -- shared on purpose: the test reads it

    async def act(self, observation: Observation) -> Action:
        _Echo.seen.append(msgspec.msgpack.encode(observation))
        if observation.info.get("suspend"):
            await asyncio.sleep(0.01)
        return Action(agent="", text=f"saw {observation.info.get('pair')!r} \u00e9")


class _Raise(Agent):
    async def act(self, observation: Observation) -> Action:
        raise ValueError("no move for this")


class _Garbage(Agent):
    async def act(self, observation: Observation) -> Action:
        return "a plain string"  # type: ignore[return-value]


class _Oversized(Agent):
    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text="\u00e9" * LIMIT)


class _Hang(Agent):
    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class _Host(AgentHost):
    """An agent host that keeps the end-of-episode notices it gets."""

    def __init__(self, endpoint: Endpoint | None, factories: dict[str, Any]) -> None:
        super().__init__(endpoint, factories)
        self.ended: list[tuple[str, str, str | None]] = []

    async def end(self, episode: str, seat: str, failed: str | None = None) -> None:
        self.ended.append((episode, seat, failed))
        await super().end(episode, seat, failed)


@contextlib.asynccontextmanager
async def _transport(kind: str, **factories: Any) -> AsyncIterator[tuple[SeatTransport, _Host]]:
    """``kind``'s transport to an agent host playing ``factories``, as the runner opens it."""
    if kind == "in_process":
        host = _Host(None, factories)
        direct = DirectAgents(host, Codec(max_message_bytes=LIMIT), name=LOCAL_HOST_NAME)
        transport = InProcessSeats(direct)
        try:
            yield transport, host
        finally:
            await transport.close()
        return
    bus = BusConfig(max_message_bytes=LIMIT)
    context = zmq.asyncio.Context()
    arena = Endpoint(ARENA_NAME, config=bus.accepting(ARENA_ACCEPTS | {"actions"}), context=context)
    agents = Endpoint(LOCAL_HOST_NAME, config=bus.accepting(AGENT_ACCEPTS), context=context)
    host = _Host(agents, factories)
    frames = FrameBatcher(arena) if kind == "bus_batched" else None
    transport = BusSeats(
        arena,
        dict.fromkeys(factories, LOCAL_HOST_NAME),
        scenario="s",
        absent=AbsentPeers(5.0, Console(quiet=True)),
        frames=frames,
    )
    try:
        address = await arena.bind("inproc://parley-test-seats")
        await agents.connect(address)
        await arena.wait_for_peer(LOCAL_HOST_NAME, timeout=5)
        yield transport, host
    finally:
        await transport.close()
        await host.close()
        await agents.close()
        await arena.close()
        context.destroy(linger=0)


def _obs(seat: str, **info: Any) -> Observation:
    return Observation(agent=seat, text="go \u2603", scenario="s", reward=0.5, info=info)


async def _ask(
    transport: SeatTransport, *requests: Observation, pipeline: bool = True
) -> list[Any]:
    return await transport.ask(
        list(requests), timeout=TIMEOUT, episode="e1", turn=0, pipeline=pipeline
    )


def _outcome(seat: str, result: Any) -> str:
    """What the runner makes of ``result``: the action's bytes, or the failure's reason
    (its kind only for a timeout: its wording names the route)."""
    if isinstance(result, Action):
        return msgspec.msgpack.encode(result).hex()
    reason = failure_reason(seat, result)
    kind = reason.split(": ")[1]
    return f"{seat}: {kind}" if kind == "timeout" else reason


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("suspend", [False, True])
async def test_the_agent_sees_the_wire_copy_and_the_runner_gets_the_same_action(
    kind: str, suspend: bool
) -> None:
    info = {"pair": (1, 2), "nested": {"x": [(3, None)]}, "big": 2**63, "suspend": suspend}
    obs = _obs("a", **info)
    codec = Codec(max_message_bytes=LIMIT)
    wire = codec.decode(codec.encode(Envelope(body=obs, sender=ARENA_NAME, episode="e1"))).body
    _Echo.seen.clear()
    async with _transport(kind, a=_Echo) as (transport, _):
        (result,) = await _ask(transport, obs)
    assert _Echo.seen == [msgspec.msgpack.encode(wire)]  # tuples are lists on the wire
    expected = Action(agent="a", text="saw [1, 2] \u00e9")
    assert _outcome("a", result) == msgspec.msgpack.encode(expected).hex()


FAILURES: list[tuple[type[Agent], str]] = [
    (_Raise, "a: agent_error: ValueError: no move for this"),
    (_Garbage, "a: agent_error: TypeError: _Garbage.act returned str, not an Action"),
    (_Hang, "a: timeout"),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("agent", "reason"), FAILURES, ids=["raises", "garbage", "hangs"])
async def test_an_agent_that_fails_fails_the_same_way(
    kind: str, agent: type[Agent], reason: str
) -> None:
    async with _transport(kind, a=agent) as (transport, _):
        (result,) = await _ask(transport, _obs("a"))
    assert _outcome("a", result) == reason


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
async def test_an_action_too_large_for_the_wire_fails_the_same_way(kind: str) -> None:
    async with _transport(kind, a=_Oversized, b=_Echo) as (transport, _):
        results = await _ask(transport, _obs("a"), _obs("b"))
    # (The size counts its envelope, which differs by route.)
    reason = re.sub(r"message of \d+ bytes", "message of N bytes", _outcome("a", results[0]))
    assert reason == (  # ("; " in a seat's reason reads ", ": it joins several seats')
        "a: agent_error: reply not sendable: message of N bytes exceeds the limit of 65536, "
        "send large payloads by path or raise max_message_bytes on both ends"
    )
    # The other seat's answer is not lost, in a batch's reply either (agent_host._fit_reply).
    assert isinstance(results[1], Action)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pipeline", [True, False])
async def test_pipelined_asks_everyone_and_sequential_stops_at_the_first_failure(
    kind: str, pipeline: bool
) -> None:
    _Echo.seen.clear()
    async with _transport(kind, a=_Echo, b=_Raise, c=_Echo) as (transport, _):
        results = await _ask(transport, _obs("a"), _obs("b"), _obs("c"), pipeline=pipeline)
    outcomes = [_outcome(seat, result) for seat, result in zip("abc", results, strict=False)]
    assert outcomes[1] == "b: agent_error: ValueError: no move for this"
    assert isinstance(results[0], Action)
    if pipeline:
        assert len(results) == 3
        assert isinstance(results[2], Action)
        assert len(_Echo.seen) == 2
    else:
        assert len(results) == 2  # c was not asked
        assert len(_Echo.seen) == 1


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("failed", [None, "b: timeout: no reply within 0.3 s"])
async def test_the_end_notice_reaches_the_host_with_the_failed_reason(
    kind: str, failed: str | None
) -> None:
    async with _transport(kind, a=_Echo) as (transport, host):
        await _ask(transport, _obs("a"))
        assert host.live_agents == 1
        await transport.end("e1", "a", failed)
        for _ in range(500):  # over the bus the notice is one-way: wait for it to arrive
            if host.ended:
                break
            await asyncio.sleep(0.01)
        assert host.ended == [("e1", "a", failed)]
        assert host.live_agents == 0


@pytest.mark.timeout(20)
async def test_a_bus_seat_whose_agent_is_away_is_missing_and_not_joined_in_time() -> None:
    async with Endpoint(ARENA_NAME) as arena:
        transport = BusSeats(
            arena,
            {"a": "agent-a", "b": "agent-b"},
            scenario="s",
            absent=AbsentPeers(0.2, Console(quiet=True)),
        )
        assert transport.missing(["a", "x"]) == ["a"]  # (x is not its seat)
        absent = await transport.join(["a"])
        assert list(absent) == ["a"]
        assert "agent-a" in str(absent["a"])


def _played(out: Path) -> list[Any]:
    rows = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
    return [(r["episode"], r["steps"], r["metrics"], r["status"]) for r in rows]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pipeline", [True, False])
async def test_in_process_and_remote_seats_in_one_run_play_the_same_episodes(
    tmp_path: Path, pipeline: bool
) -> None:
    """Seat agent_0 in-process, agent_1 joined over ipc:// (two transports in every step),
    asked together or in turn: the episodes of the same agents all in-process."""
    joined: list[asyncio.Task[None]] = []

    def on_listen(address: str) -> None:
        joined.append(asyncio.ensure_future(join_arena(address, {"agent_1": Chatter})))

    common: dict[str, Any] = {
        "scenario": BROADCAST, "scenario_kwargs": {"n_agents": 2, "steps": 3}, "episodes": 4,
        "progress": False, "pipeline": pipeline,
    }  # fmt: skip
    mixed = RunConfig(
        agents=["scripted", "remote"], listen=f"ipc://{tmp_path}/arena.sock",
        out=str(tmp_path / "mixed"), join_timeout=20.0, **common,
    )  # fmt: skip
    result = await Runner(mixed, on_listen=on_listen).run()
    await asyncio.wait_for(joined[0], 20)  # the arena said goodbye: the agent left
    assert result.summary["episodes"] == {"total": 4, "ok": 4, "failed": 0}
    await Runner(
        RunConfig(agents=["scripted", "scripted"], out=str(tmp_path / "local"), **common)
    ).run()
    assert _played(tmp_path / "mixed") == _played(tmp_path / "local")
