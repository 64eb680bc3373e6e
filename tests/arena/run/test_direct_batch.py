"""A step's seats asked together in-process: one copy of the step, each seat's own outcome.

:meth:`DirectAgents.ask_all` copies a step's observations in one round trip and awaits the
acts in turn in one coroutine it drives itself; these tests pin that each seat still gets
what it would alone: its own protocol error, its own timeout, its decoded copy, and that an
act that suspends does not hold back the acts of the seats after it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from parley.agents.base import Agent
from parley.arena.run.agent_host import AgentHost
from parley.arena.run.direct import DirectAgents
from parley.protocols.codec import Codec
from parley.protocols.errors import ProtocolError, RemoteError, RequestTimeout
from parley.protocols.messages import Action, Observation


class _Log(Agent):
    """Answers with its seat; logs when each act starts and ends; sleeps or hangs when asked."""

    events: list[str] = []  # noqa: RUF012 -- shared on purpose: the order of every seat's act

    async def act(self, observation: Observation) -> Action:
        seat = observation.agent
        _Log.events.append(f"start {seat}")
        if observation.info.get("sleep"):
            await asyncio.sleep(observation.info["sleep"])
        if observation.info.get("raise"):
            raise ValueError(f"no move for {seat}")
        _Log.events.append(f"end {seat}")
        return Action(agent=seat, text=f"{seat} saw {observation.info.get('pair')!r}")


def _direct(seats: str, codec: Codec | None = None) -> DirectAgents:
    return DirectAgents(
        AgentHost(None, dict.fromkeys(seats, _Log)), codec or Codec(), name="arena-agents"
    )


def _ask_all(direct: DirectAgents, observations: list[Observation], timeout: float = 2.0) -> Any:
    async def ask() -> Any:
        return await direct.ask_all(observations, timeout=timeout, episode="e1", sender="arena")

    return asyncio.run(ask())


@pytest.mark.timeout(10)
def test_a_seat_the_wire_cannot_carry_fails_alone_and_the_others_get_copies() -> None:
    _Log.events.clear()
    observations = [
        Observation(agent="a", text="go", info={"pair": (1, 2)}),
        Observation(agent="b", text="go", info={"weird": object()}),
        Observation(agent="c", text="go", info={"pair": (3,)}),
    ]
    results = _ask_all(_direct("abc"), observations)
    assert isinstance(results[1], ProtocolError)
    assert [r.text for r in (results[0], results[2])] == ["a saw [1, 2]", "c saw [3]"]
    assert _Log.events == ["start a", "end a", "start c", "end c"]  # b's agent saw nothing


@pytest.mark.timeout(10)
def test_a_step_over_the_size_limit_whose_seats_fit_alone_is_answered() -> None:
    """The step's list is copied at once only within the limit; past it, seat by seat."""
    codec = Codec(max_message_bytes=4096)
    text = "x" * 1500  # each fits in 4 kB; the three together do not
    observations = [Observation(agent=seat, text=text) for seat in "abc"]
    results = _ask_all(_direct("abc", codec), observations)
    assert [type(r) for r in results] == [Action, Action, Action]
    too_big = Observation(agent="a", text="y" * 5000)
    (alone,) = _ask_all(_direct("a", codec), [too_big])
    assert isinstance(alone, ProtocolError)


@pytest.mark.timeout(10)
def test_an_act_that_suspends_does_not_hold_back_the_seats_after_it() -> None:
    _Log.events.clear()
    observations = [
        Observation(agent="a", text="go"),
        Observation(agent="b", text="go", info={"sleep": 0.05}),
        Observation(agent="c", text="go"),
        Observation(agent="d", text="go", info={"sleep": 0.01, "raise": True}),
        Observation(agent="e", text="go"),
    ]
    results = _ask_all(_direct("abcde"), observations)
    # Every act started before any suspended one was awaited (as bus requests all go out).
    last_start = max(_Log.events.index(f"start {seat}") for seat in "abcde")
    assert last_start < _Log.events.index("end b")
    assert [type(r) for r in results] == [Action, Action, Action, RemoteError, Action]
    assert results[1].text == "b saw None"
    assert results[3].code == "handler_failed"
    assert results[3].remote_message == "ValueError: no move for d"


@pytest.mark.timeout(10)
def test_start_all_answers_at_once_and_leaves_only_the_suspended_acts_to_finish() -> None:
    """The runner's in-process step: :meth:`DirectAgents.start_all` on its own thread, then
    :meth:`DirectAgents.finish` only for the acts that suspended; the same results as
    ``ask_all``'s, in order."""
    _Log.events.clear()
    plain = [Observation(agent=seat, text="go", info={"pair": (1,)}) for seat in "ab"]
    direct = _direct("abc")

    async def steps() -> tuple[Any, Any, Any]:
        at_once, none_waiting = direct.start_all(plain, episode="e1", sender="arena")
        observations = [*plain, Observation(agent="c", text="go", info={"sleep": 0.01})]
        results, waiting = direct.start_all(observations, episode="e2", sender="arena")
        assert [index for index, *_ in waiting] == [2]  # c's act is still running
        await direct.finish(waiting, results, 2.0)
        return at_once, none_waiting, results

    at_once, none_waiting, results = asyncio.run(steps())
    assert none_waiting == []
    assert [r.text for r in at_once] == ["a saw [1]", "b saw [1]"]
    assert [r.text for r in results] == ["a saw [1]", "b saw [1]", "c saw None"]
    assert results == _ask_all(_direct("abc"), [*plain, Observation(agent="c", text="go")])


@pytest.mark.timeout(10)
def test_a_hang_among_seats_times_out_alone() -> None:
    observations = [
        Observation(agent="a", text="go", info={"sleep": 3600}),
        Observation(agent="b", text="go", info={"sleep": 0.01}),
        Observation(agent="c", text="go"),
    ]
    results = _ask_all(_direct("abc"), observations, timeout=0.2)
    assert isinstance(results[0], RequestTimeout)
    assert "(a) within 0.2 s" in str(results[0])
    assert [r.text for r in results[1:]] == ["b saw None", "c saw None"]


class _Odd(Agent):
    """Answers for another seat, or with a non-ASCII text: the runner's copy is rebuilt."""

    async def act(self, observation: Observation) -> Action:
        if observation.info.get("stale"):
            return Action(agent="someone else", text="ok")
        return Action(agent=observation.agent, text="héllo")


@pytest.mark.timeout(10)
def test_an_action_that_is_not_plain_comes_back_as_the_wire_copy_in_its_seat() -> None:
    direct = DirectAgents(AgentHost(None, {"a": _Odd, "b": _Odd}), Codec(), name="h")
    observations = [
        Observation(agent="a", text="go", info={"stale": True}),
        Observation(agent="b", text="go"),
    ]
    stale, accented = _ask_all(direct, observations)
    assert (stale.agent, stale.text) == ("a", "ok")
    assert (accented.agent, accented.text) == ("b", "héllo")


@pytest.mark.timeout(10)
def test_an_ended_seat_gets_a_new_agent_if_asked_again() -> None:
    direct = _direct("a")

    async def play() -> None:
        obs = Observation(agent="a", text="go")
        await direct.ask_all([obs], timeout=1, episode="e1", sender="arena")
        first = direct.host.agent("e1", obs)
        await direct.end("e1", "a")
        assert direct.host.live_agents == 0
        await direct.ask_all([obs], timeout=1, episode="e1", sender="arena")
        assert direct.host.live_agents == 1
        assert direct.host.agent("e1", obs) is not first
        await direct.close()

    asyncio.run(play())


class _Recorder(Agent):
    """Says one line; keeps every ``info`` it was shown, as its items in order."""

    shown: dict[bool, list[Any]] = {}  # noqa: RUF012 -- shared on purpose: per transport
    over_bus = False

    async def act(self, observation: Observation) -> Action:
        _Recorder.shown.setdefault(_Recorder.over_bus, []).append(
            (observation.agent, list(observation.info.items()))
        )
        return Action(agent=observation.agent, text=f"hi from {observation.agent}")


def _play(over_bus: bool, seeds: dict[str, int] | None = None) -> Any:
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import EpisodePlan, Runner
    from tests.arena.run.broadcast_fixture import register_broadcast

    scenario = register_broadcast("test/broadcast-seeds-v0")
    config = RunConfig(
        scenario=scenario,
        scenario_kwargs={"n_agents": 3, "steps": 4},
        progress=False,
        local_agents_over_bus=over_bus,
    )
    _Recorder.over_bus = over_bus
    runner = Runner(config, agents=dict.fromkeys(["agent_0", "agent_1", "agent_2"], _Recorder))
    agent_seeds = seeds or {"agent_0": 2**64 - 1, "agent_1": -(2**63), "agent_2": 7}

    async def play() -> Any:
        async with runner.open():
            return await runner.play(
                EpisodePlan(0, task=0, trial=0, seed=3, agent_seeds=agent_seeds)
            )

    return asyncio.run(play())


@pytest.mark.timeout(30)
def test_in_process_agents_see_their_seed_where_the_bus_puts_it() -> None:
    """In-process requests go without the agent seed, which the agent's copy gets set; the
    info each agent sees is the bus's, key order included (the seed last)."""
    _Recorder.shown.clear()
    assert not _play(over_bus=False).failed
    assert not _play(over_bus=True).failed
    direct, bus = _Recorder.shown[False], _Recorder.shown[True]
    assert len(direct) == 12
    assert sorted(direct, key=repr) == sorted(bus, key=repr)
    assert all(items[-1][0] == "agent_seed" for _, items in direct)


@pytest.mark.timeout(30)
def test_a_seed_the_wire_cannot_carry_fails_the_episode_in_process_as_over_the_bus() -> None:
    seeds = {"agent_0": 2**64, "agent_1": 1, "agent_2": 2}
    direct, bus = _play(over_bus=False, seeds=seeds), _play(over_bus=True, seeds=seeds)
    assert direct.failed.startswith("agent_0: protocol_error: cannot encode Observation")
    assert direct.failed == bus.failed
