"""In-process agents' timeouts and failures (arena/run/direct.py), attacked: an act that
raises ``CancelledError`` while its episode is cancelled, one that cancels its own task, one
that outlives its timeout by swallowing the cancel; ``finish`` giving a stalled loop's time
back only when acts are pending and the loop stood still; no task left unretrieved."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import pytest

from parley.agents.base import Agent
from parley.arena.run.agent_host import AgentHost
from parley.arena.run.direct import DirectAgents
from parley.protocols.codec import Codec
from parley.protocols.errors import RemoteError, RequestTimeout
from parley.protocols.messages import Action, Observation

T = TypeVar("T")


def _agents(**factories: Any) -> DirectAgents:
    return DirectAgents(AgentHost(None, factories), Codec(), name="arena-agents")


def _run_clean(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a fresh loop; fail if the loop reports anything (a task destroyed
    while pending, an exception never retrieved), the loop closed and collected too."""
    reported: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        result = loop.run_until_complete(main)
        loop.run_until_complete(asyncio.sleep(0.05))
    finally:
        loop.close()
    gc.collect()
    assert reported == []
    return result


def _obs(*seats: str, **info: Any) -> list[Observation]:
    return [Observation(agent=seat, text="go", info=info) for seat in seats]


class _Quick(Agent):
    """Answers at once; counts its calls."""

    calls: ClassVar[list[str]] = []

    async def act(self, observation: Observation) -> Action:
        _Quick.calls.append(observation.agent)
        return Action(agent=observation.agent, text="ok")


class _Stubborn(Agent):
    """Sleeps past any timeout; when cancelled, answers anyway (or raises ``mode``)."""

    mode = "answer"

    async def act(self, observation: Observation) -> Action:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if _Stubborn.mode == "raise":
                raise ValueError("cleanup failed") from None
            if _Stubborn.mode == "reraise":
                raise
            if _Stubborn.mode == "fresh-cancel":
                raise asyncio.CancelledError("mine") from None
        return Action(agent=observation.agent, text="late")


class _CancelsItself(Agent):
    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # (an agent's own doing: no one cancels the episode)
        await asyncio.sleep(0)
        return Action(agent=observation.agent, text="unreachable")


class _Slow(Agent):
    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(observation.info["sleep"])
        return Action(agent=observation.agent, text="ok")


class _Blocker(Agent):
    """Blocks the event loop ``block`` seconds after its first suspension."""

    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(0.01)
        time.sleep(observation.info["block"])  # noqa: ASYNC251 -- the block is the attack
        return Action(agent=observation.agent, text="blocked")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("mode", ["reraise", "fresh-cancel", "raise"])
def test_an_act_raising_cancelled_while_its_episode_is_cancelled_ends_it(mode: str) -> None:
    _Stubborn.mode = mode
    direct = _agents(a=_Stubborn, b=_Quick)

    async def main() -> None:
        ask = asyncio.ensure_future(
            direct.ask_all(_obs("a", "b"), timeout=60, episode="e", sender="arena")
        )
        await asyncio.sleep(0.05)
        ask.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(ask, 2)
        await asyncio.sleep(0.01)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []  # (the act's task ended)

    _run_clean(main())


@pytest.mark.timeout(10)
def test_an_act_that_cancels_its_own_task_is_its_failure_not_the_runs() -> None:
    direct = _agents(a=_CancelsItself, b=_Quick)

    async def main() -> list[Any]:
        return await direct.ask_all(_obs("a", "b"), timeout=2, episode="e", sender="arena")

    results = _run_clean(main())
    assert isinstance(results[0], RemoteError)
    assert results[0].code == "handler_failed"
    assert "CancelledError" in results[0].remote_message
    assert isinstance(results[1], Action)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("mode", ["answer", "raise"])
def test_a_timed_out_act_that_outlives_its_cancel_changes_nothing_after(mode: str) -> None:
    """Seat a times out but its act, cancelled, answers (or raises) anyway: the results the
    runner got stay as they were, and no other seat's act is called again."""
    _Stubborn.mode = mode
    _Quick.calls.clear()
    direct = _agents(a=_Stubborn, b=_Quick, c=_Quick)

    async def main() -> list[Any]:
        results = await direct.ask_all(
            _obs("a", "b", "c"), timeout=0.1, episode="e", sender="arena"
        )
        seen = list(results)
        for _ in range(5):
            await asyncio.sleep(0.01)
        assert results == seen
        return results

    results = _run_clean(main())
    assert isinstance(results[0], RequestTimeout)
    assert [type(r) for r in results[1:]] == [Action, Action]
    assert _Quick.calls == ["b", "c"]


@pytest.mark.timeout(10)
def test_finish_waits_no_longer_when_all_are_done_or_the_loop_was_not_late() -> None:
    direct = _agents(a=_Slow, b=_Stubborn)
    _Stubborn.mode = "fresh-cancel"

    async def took(obs: list[Observation], limit: float) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await direct.ask_all(obs, timeout=limit, episode="e", sender="arena")
        return loop.time() - start

    async def main() -> None:
        assert await took(_obs("a", sleep=0.1), 2.0) < 0.5  # done: no second wait
        assert 0.2 <= await took(_obs("b"), 0.2) < 0.35  # not late: no time given back

    _run_clean(main())


@pytest.mark.timeout(10)
def test_a_blocked_loop_gives_its_time_back_to_the_act_still_pending() -> None:
    """Seat a blocks the loop 0.5 s past the 0.3 s timeout; seat b, which answers 0.2 s
    after it is asked, is not charged; a silent seat still times out, by twice its limit
    plus the block."""
    _Stubborn.mode = "fresh-cancel"
    direct = _agents(a=_Blocker, b=_Slow, c=_Stubborn)

    async def main() -> tuple[list[Any], float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        obs = [*_obs("a", block=0.8), *_obs("b", sleep=0.2), *_obs("c")]
        results = await direct.ask_all(obs, timeout=0.3, episode="e", sender="arena")
        return results, loop.time() - start

    results, took = _run_clean(main())
    assert [type(r) for r in results] == [Action, Action, RequestTimeout]
    assert took < 0.8 + 2 * 0.3 + 0.2


class _NamelessMeta(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name either")


class _Nameless(Exception, metaclass=_NamelessMeta):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class _RaisesNameless(Agent):
    async def act(self, observation: Observation) -> Action:
        if observation.info.get("sleep"):
            await asyncio.sleep(0.01)
        raise _Nameless


@pytest.mark.timeout(10)
@pytest.mark.parametrize("sleep", [False, True])
def test_an_exception_whose_class_name_raises_too_is_the_agents_failure(sleep: bool) -> None:
    direct = _agents(a=_RaisesNameless, b=_Quick)

    async def main() -> list[Any]:
        obs = [*_obs("a", sleep=sleep), *_obs("b")]
        return await direct.ask_all(obs, timeout=2, episode="e", sender="arena")

    results = _run_clean(main())
    assert isinstance(results[0], RemoteError)
    assert results[0].code == "handler_failed"
    assert "_Nameless" in results[0].remote_message
    assert isinstance(results[1], Action)
