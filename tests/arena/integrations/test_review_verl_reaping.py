"""Review (H9) of ParleyTool's reaping: an episode is reaped when no call of its
trajectory came in ``idle_calls`` calls of the tool; one whose call is still being played
(its partner slow to answer) is not idle, and was reaped from under its own call: the
trajectory's episode ended "reaped: no call in N tool calls" and its score was refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("verl.tools.base_tool")
pytest.importorskip("verl.experimental.agent_loop.tool_agent_loop")

from parley.agents.scripted.collaboration import CodeListener
from parley.agents.scripted.negotiation import DealNegotiator
from parley.arena.integrations.verl_tool import STATE_KEY, dataset_rows_async
from parley.protocols.messages import Action, Observation
from tests.arena.integrations.test_verl import (
    DOND,
    SEAT,
    _act,
    _call,
    _loop,
    _score,
    _tool,
    _trajectory,
)

pytestmark = pytest.mark.timeout(120)

REF = "collaboration/referential-v1"
_GATE: dict[str, asyncio.Event] = {}


class _SlowFirst(CodeListener):
    """The listener; the first one made answers only once the test opens the gate."""

    made = 0

    def __init__(self) -> None:
        super().__init__()
        _SlowFirst.made += 1
        self.slow = _SlowFirst.made == 1

    async def act(self, observation: Observation) -> Action:
        if self.slow:
            _GATE["asked"].set()
            await _GATE["open"].wait()
        return await super().act(observation)


async def test_an_episode_whose_call_is_being_played_is_not_idle(tmp_path: Path) -> None:
    _GATE.update(open=asyncio.Event(), asked=asyncio.Event())
    _SlowFirst.made = 0
    config = {"scenario": REF, "learner": "speaker"}
    tool = _tool(tmp_path, **config, agents=[f"{__name__}:_SlowFirst"], idle_calls=3)
    rows = await dataset_rows_async(config, 8, seed=1)
    loop = _loop(tool)
    slow = _trajectory(rows[0])
    playing = asyncio.ensure_future(_call(loop, slow, _act("ab")))
    await asyncio.wait_for(_GATE["asked"].wait(), 30)
    for row in rows[1:]:  # other trajectories' calls, while the slow one's is played
        await _call(loop, _trajectory(row), _act("ab"))
    _GATE["open"].set()
    text, _ = await asyncio.wait_for(playing, 30)
    state = slow.extra_fields[STATE_KEY]
    assert "reaped" not in str(state["failed"]), (text, state)
    assert state["done"]
    assert not state["failed"]
    assert _score(slow)["parley_finished"] == 1.0
    await tool.close()


class _SlowFirstDeal(DealNegotiator):
    """deal-or-no-deal's baseline; the first one made answers its first observation only
    once the test opens the gate."""

    made = 0

    def __init__(self) -> None:
        super().__init__()
        _SlowFirstDeal.made += 1
        self.slow = _SlowFirstDeal.made == 1

    async def act(self, observation: Observation) -> Action:
        if self.slow:
            self.slow = False
            _GATE["asked"].set()
            await _GATE["deal"].wait()
        return await super().act(observation)


async def test_idle_calls_count_from_a_calls_answer(tmp_path: Path) -> None:
    """A trajectory whose call took long (5 other calls meanwhile) and then made its next
    call 2 calls after its answer, with idle_calls 3, was reaped: idleness was counted
    from the call's start."""
    _GATE.update(deal=asyncio.Event(), asked=asyncio.Event())
    _SlowFirstDeal.made = 0
    config = {"scenario": DOND, "learner": SEAT}
    tool = _tool(tmp_path, agents=[f"{__name__}:_SlowFirstDeal"], idle_calls=3, max_sessions=16)
    rows = await dataset_rows_async(config, 8, seed=3)
    loop = _loop(tool)
    slow, *others = (_trajectory(row) for row in rows)
    playing = asyncio.ensure_future(_call(loop, slow, _act("hello")))
    await asyncio.wait_for(_GATE["asked"].wait(), 30)
    for data in others[:5]:
        await _call(loop, data, _act("hello"))
    _GATE["deal"].set()
    text, _ = await asyncio.wait_for(playing, 30)
    assert not slow.extra_fields[STATE_KEY]["done"], text
    for data in others[5:7]:
        await _call(loop, data, _act("hello"))
    text, _ = await _call(loop, slow, _act("hello"))
    assert "episode_over" not in text, slow.extra_fields[STATE_KEY]
    await tool.close()
