"""Review of round 36's seat transports (arena/run/seats.py): bugs found, each pinned here.

An episode's failure reason travels in the end-of-episode notice to a bus seat's agent host.
A reason longer than the wire takes (several seats failing at once, each with a long agent
error) made the notice unsendable: ``ProtocolError`` escaped ``Runner.play`` and ended the
whole run, where in-process seats record the failed episode and go on.

A record whose steps are built when first read (arena/run/episode.py's ``_PlayedRecord``)
is the record built at once, and compares equal to it: to the same record decoded from
MessagePack as a Ray worker ships it, either way round.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from parley.agents.base import Agent
from parley.arena.run.config import RunConfig
from parley.arena.run.records import EpisodeRecord
from parley.arena.run.runner import Runner, run
from parley.protocols.bus import BusConfig
from parley.protocols.messages import Action, Observation
from tests.arena.run.broadcast_fixture import register_broadcast

# Every seat acts every step: both seats fail in the same step, their reasons joined.
BROADCAST = register_broadcast("test/review-round36-broadcast-v0")

LIMIT = 16 * 1024  # the run's max_message_bytes
ERROR_CHARS = 10 * 1024  # each agent's error fits the wire; two of them joined do not


class _LongError(Agent):
    """Raises with a long message (it fits one reply; two joined exceed ``LIMIT``)."""

    closed = 0

    async def act(self, observation: Observation) -> Action:
        raise ValueError("x" * ERROR_CHARS)

    async def close(self) -> None:
        _LongError.closed += 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("over_bus", [False, True])
async def test_a_failure_reason_too_long_for_the_wire_still_fails_only_its_episode(
    over_bus: bool,
) -> None:
    config = RunConfig(
        scenario=BROADCAST,
        scenario_kwargs={"n_agents": 2},
        episodes=2,
        concurrency=1,
        progress=False,
        local_agents_over_bus=over_bus,
    )
    agents: dict[str, Any] = {"agent_0": _LongError, "agent_1": _LongError}
    runner = Runner(config, agents=agents, bus=BusConfig(max_message_bytes=LIMIT))
    runner.keep_records = True
    _LongError.closed = 0
    result = await runner.run()
    assert result.summary["episodes"] == {"total": 2, "ok": 0, "failed": 2}
    for record in result.records:
        assert len(record.failed) > LIMIT  # the whole reason is recorded
        assert record.failed.startswith("agent_0: agent_error: ValueError: xxx")
    # Every agent got its end notice (over the bus: one-way, so wait for it) and was closed.
    for _ in range(200):
        if _LongError.closed == 4:
            break
        await asyncio.sleep(0.01)
    assert _LongError.closed == 4


def test_a_record_built_late_equals_the_same_record_built_at_once() -> None:
    config = RunConfig(scenario="negotiation/simple-trade-v1", episodes=2, progress=False)
    records = run(config, keep_records=True).records
    first, second = records
    plain = msgspec.msgpack.Decoder(EpisodeRecord).decode(msgspec.msgpack.encode(first))
    assert type(plain) is EpisodeRecord
    assert first == plain
    assert plain == first
    assert first != second
    assert plain != second


def test_a_transport_whose_close_raises_still_closes_the_arena_and_its_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closing is each part's, whatever another part raises: the error reaches the caller
    and the arena's sockets and ZeroMQ context are closed all the same (no leaked fds)."""
    import zmq.asyncio

    from parley.arena.run import runner as runner_module
    from parley.arena.run.seats import InProcessSeats

    contexts: list[zmq.asyncio.Context] = []

    class Recorded(zmq.asyncio.Context):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            contexts.append(self)

    async def failing_close(self: InProcessSeats) -> None:
        await self.direct.close()
        raise RuntimeError("close failed")

    monkeypatch.setattr(runner_module.zmq.asyncio, "Context", Recorded)
    monkeypatch.setattr(InProcessSeats, "close", failing_close)
    config = RunConfig(scenario=BROADCAST, episodes=2, progress=False)
    with pytest.raises(RuntimeError, match="close failed"):
        run(config)
    assert len(contexts) == 1
    assert contexts[0].closed
