"""In-process agents called without the bus keep the bus's messages and failures.

:class:`DirectAgents` must be indistinguishable from a bus round trip for an agent and for
the runner: decoded copies in and out, ``handler_failed`` for an agent that raises, a
timeout (and a cancelled ``act``) for one that hangs, a protocol error for a value the
wire cannot carry, and an agent per (episode, seat) closed when its episode ends.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from parley.agents.base import Agent
from parley.arena.run.agent_host import AgentHost
from parley.arena.run.direct import DirectAgents
from parley.protocols.codec import Codec
from parley.protocols.errors import ProtocolError, RemoteError, RequestTimeout
from parley.protocols.messages import Action, Observation


class _Echo(Agent):
    """Answers with what it saw of ``info`` (to show it got the wire's decoded copy)."""

    seen: list[Any] = []  # noqa: RUF012 -- shared on purpose: the test reads what agents saw
    closed: list[Any] = []  # noqa: RUF012

    async def act(self, observation: Observation) -> Action:
        if observation.info.get("sleep"):
            await asyncio.sleep(observation.info["sleep"])
        if observation.info.get("raise"):
            raise ValueError("no move for this")
        _Echo.seen.append(observation)
        return Action(agent=observation.agent, text=repr(observation.info.get("pair")))

    async def close(self) -> None:
        _Echo.closed.append(self)


class _NotAnAction(Agent):
    async def act(self, observation: Observation) -> Action:
        return "a plain string"  # type: ignore[return-value]


class _Hang(Agent):
    cancelled = False

    async def act(self, observation: Observation) -> Action:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _Hang.cancelled = True
            raise
        raise AssertionError("unreachable")


def _agents(**factories: Any) -> DirectAgents:
    return DirectAgents(AgentHost(None, factories), Codec(), name="arena-agents")


def _ask(direct: DirectAgents, seat: str, timeout: float = 2.0, **info: Any) -> Any:
    obs = Observation(agent=seat, text="go", info=info)

    async def ask() -> Any:
        return await direct.request(obs, timeout=timeout, episode="e1", sender="arena")

    return asyncio.run(ask())


@pytest.mark.timeout(10)
def test_the_agent_sees_the_wire_copy_and_the_runner_gets_one_back() -> None:
    _Echo.seen.clear()
    direct = _agents(a=_Echo)
    action = _ask(direct, "a", pair=(1, 2))
    assert isinstance(action, Action)
    # msgpack has no tuples: over the bus the agent gets a list, and so it does here.
    assert action.text == "[1, 2]"
    assert _Echo.seen[0].info["pair"] == [1, 2]


@pytest.mark.timeout(10)
def test_an_agent_that_suspends_is_finished_and_answers() -> None:
    action = _ask(_agents(a=_Echo), "a", sleep=0.01, pair=3)
    assert isinstance(action, Action)
    assert action.text == "3"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("sleep", [0, 0.01])  # raising before and after a suspension
def test_an_agent_that_raises_is_handler_failed_as_over_the_bus(sleep: float) -> None:
    with pytest.raises(RemoteError) as caught:
        _ask(_agents(a=_Echo), "a", sleep=sleep, **{"raise": True})
    assert caught.value.code == "handler_failed"
    assert caught.value.remote_message == "ValueError: no move for this"
    with pytest.raises(RemoteError, match="returned str, not an Action"):
        _ask(_agents(a=_NotAnAction), "a")


@pytest.mark.timeout(10)
def test_an_agent_that_hangs_times_out_and_its_act_is_cancelled() -> None:
    _Hang.cancelled = False
    with pytest.raises(RequestTimeout, match=r"within 0\.2 s"):
        _ask(_agents(a=_Hang), "a", timeout=0.2)
    assert _Hang.cancelled


@pytest.mark.timeout(10)
def test_a_cancelled_request_cancels_the_agents_act() -> None:
    """An episode cancelled mid-request (a run interrupted, a sampler that stops) leaves no
    agent task running on, to fail later with an exception nobody retrieves."""
    _Hang.cancelled = False
    direct = _agents(a=_Hang)

    async def cancel_mid_act() -> None:
        obs = Observation(agent="a", text="go")
        request = asyncio.ensure_future(
            direct.request(obs, timeout=60, episode="e1", sender="arena")
        )
        await asyncio.sleep(0.05)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0)  # the agent's task runs its cancellation
        assert _Hang.cancelled

    asyncio.run(cancel_mid_act())


@pytest.mark.timeout(10)
def test_a_value_the_wire_cannot_carry_is_a_protocol_error_and_no_agent_sees_it() -> None:
    _Echo.seen.clear()
    with pytest.raises(ProtocolError, match="cannot encode Observation"):
        _ask(_agents(a=_Echo), "a", weird=object())
    assert _Echo.seen == []


@pytest.mark.timeout(10)
def test_one_agent_per_episode_and_seat_closed_when_its_episode_ends() -> None:
    _Echo.closed.clear()
    direct = _agents(a=_Echo, b=_Echo)

    async def play() -> None:
        for episode in ("e1", "e2"):
            for seat in ("a", "b"):
                obs = Observation(agent=seat, text="go")
                await direct.request(obs, timeout=1, episode=episode, sender="arena")
        assert direct.host.live_agents == 4
        await direct.end("e1", "a")
        await direct.end("e1", "b")
        assert direct.host.live_agents == 2
        await direct.close()
        assert direct.host.live_agents == 0

    asyncio.run(play())
    assert len(_Echo.closed) == 4


class _Vandal(Agent):
    """Scribbles over everything it is shown, as a policy hunting for reward might."""

    async def act(self, observation: Observation) -> Action:
        observation.info["view"]["hand"].append("ace")
        observation.info["view"]["score"] = 99
        observation.info.clear()
        return Action(agent=observation.agent, text="ok")


@pytest.mark.timeout(10)
def test_an_agent_cannot_reach_the_runners_objects_through_what_it_is_shown() -> None:
    view = {"hand": ["two"], "score": 1}
    obs = Observation(agent="a", text="go", info={"view": view})

    async def ask() -> Any:
        return await _agents(a=_Vandal).request(obs, timeout=1, episode="e", sender="arena")

    assert asyncio.run(ask()).text == "ok"
    assert view == {"hand": ["two"], "score": 1}  # the scenario's state, untouched
    assert obs.info == {"view": view}


class _BadClose(Agent):
    """Plays, then raises when closed at the end of each episode."""

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text="ok")

    async def close(self) -> None:
        raise RuntimeError("close failed")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("over_bus", [False, True])
def test_an_agent_whose_close_raises_ends_no_run(over_bus: bool) -> None:
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run
    from tests.arena.run.test_runner import SCENARIO

    config = RunConfig(
        scenario=SCENARIO, episodes=4, progress=False, local_agents_over_bus=over_bus
    )
    result = run(config, agents={"a": _BadClose, "b": _BadClose})
    assert result.summary["episodes"] == {"total": 4, "ok": 4, "failed": 0}


class _HangingClose(Agent):
    """Plays, then hangs in close() for an hour (and, with ``stubborn``, ignores the first
    cancel too)."""

    closes: list[str] = []  # noqa: RUF012 -- shared on purpose: the test reads how they ended
    stubborn = False

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text="ok")

    async def close(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _HangingClose.closes.append("cancelled")
            if not _HangingClose.stubborn:
                raise
            await asyncio.sleep(3600)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("over_bus", [False, True])
def test_an_agent_whose_close_hangs_holds_no_episode_and_is_cancelled_at_the_end(
    over_bus: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each episode's close is not waited for (in-process it held the episode's worker for
    ever: 8 episodes at concurrency 2 never finished); the host's close waits
    CLOSE_GRACE_S for them, then cancels them."""
    import time

    from parley.arena.run import agent_host
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run
    from tests.arena.run.test_runner import SCENARIO

    monkeypatch.setattr(agent_host, "CLOSE_GRACE_S", 0.5)
    _HangingClose.closes.clear()
    config = RunConfig(
        scenario=SCENARIO, episodes=8, concurrency=2, progress=False,
        local_agents_over_bus=over_bus,
    )  # fmt: skip
    started = time.monotonic()
    result = run(config, agents={"a": _HangingClose, "b": _HangingClose})
    assert result.summary["episodes"] == {"total": 8, "ok": 8, "failed": 0}
    assert _HangingClose.closes == ["cancelled"] * 16  # every agent's close, at the end
    assert time.monotonic() - started < 50  # not the hour (a bound, not a timing claim)


@pytest.mark.timeout(60)
def test_a_close_that_ignores_its_cancel_still_lets_the_host_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from parley.arena.run import agent_host

    monkeypatch.setattr(agent_host, "CLOSE_GRACE_S", 0.2)
    monkeypatch.setattr(_HangingClose, "stubborn", True)
    _HangingClose.closes.clear()
    host = AgentHost(None, {"a": _HangingClose})

    async def scenario() -> list[asyncio.Task[Any]]:
        await host.answer("e1", Observation(agent="a", text="go"))
        await host.end("e1", "a")
        await host.close()  # returns, though the close still runs
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    async def outer() -> None:
        left = await scenario()
        assert len(left) == 1  # the stubborn close, left to the loop's own shutdown
        for task in left:
            task.cancel()  # (its second sleep takes this one)

    asyncio.run(outer())
    assert _HangingClose.closes == ["cancelled"]


class _Closing(Agent):
    closed: ClassVar[list[str]] = []

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text="ok")

    async def close(self) -> None:
        _Closing.closed.append("closed")


@pytest.mark.timeout(30)
def test_end_now_closes_and_forgets_the_agent_before_it_returns() -> None:
    """The runner ends in-process seats with ``end_now`` (no coroutine per seat): the agent
    is closed and forgotten by then, as awaiting ``end`` does; the next episode gets a new
    one."""
    _Closing.closed.clear()
    direct = DirectAgents(AgentHost(None, {"a": _Closing}), Codec(), name="local")

    go = [Observation(agent="a", text="go")]

    async def scenario() -> None:
        await direct.ask_all(go, timeout=5, episode="e1", sender="x")
        first = direct._held["e1"]["a"]
        direct.end_now("e1", "a")
        assert _Closing.closed == ["closed"]
        assert "e1" not in direct._held
        await direct.ask_all(go, timeout=5, episode="e1", sender="x")
        assert direct._held["e1"]["a"] is not first
        await direct.close()

    asyncio.run(scenario())
    assert _Closing.closed == ["closed", "closed"]


class _PlainDef(Agent):
    """``act`` a plain function: returns an Action, raises StopIteration, or returns a
    future the loop resolves later (what an agent may hand a runner that awaits it)."""

    def act(self, observation: Observation) -> Any:
        how = observation.info["how"]
        if how == "action":
            return Action(agent=observation.agent, text="not awaitable")
        if how == "stop":
            raise StopIteration("out of moves")
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, Action(agent="a", text="later"))
        return future


async def _await_error(value: Any) -> str:
    """What awaiting ``value`` raises, as the bus's handler words it."""
    try:
        await value
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("awaited")


@pytest.mark.timeout(10)
def test_an_act_that_is_no_coroutine_fails_or_answers_as_when_awaited() -> None:
    """Acts are driven without a coroutine around them (issue 33 §5): one that returns a
    non-awaitable, or raises StopIteration before any await, fails with the words the bus's
    handler (which awaits it) gives; one that returns a future is awaited."""
    expected = asyncio.run(_await_error(Action(agent="a", text="not awaitable")))
    with pytest.raises(RemoteError) as caught:
        _ask(_agents(a=_PlainDef), "a", how="action")
    assert caught.value.code == "handler_failed"
    assert caught.value.remote_message == expected
    with pytest.raises(RemoteError) as caught:
        _ask(_agents(a=_PlainDef), "a", how="stop")
    assert caught.value.remote_message == "StopIteration: out of moves"
    action = _ask(_agents(a=_PlainDef), "a", how="future")
    assert isinstance(action, Action)
    assert action.text == "later"
