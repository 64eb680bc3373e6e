"""The stage order of a training run as a state machine: every path, no model."""

from __future__ import annotations

from typing import Any

import pytest

from parley.arena.training.config import RestartConfig, StageConfig
from parley.arena.training.stage_plan import Done, Play, Restart, StagePlan, Step


def stage(name: str, restart: dict[str, Any] | None = None) -> StageConfig:
    rule = RestartConfig(**restart) if restart is not None else None
    return StageConfig(name=name, train=["p"], restart=rule)


def walk(plan: StagePlan, stalls: list[bool]) -> list[Step]:
    """Play the plan; the i-th stage played that may restart stalls as ``stalls`` says."""
    steps = [plan.first()]
    while not isinstance(steps[-1], Done):
        step = steps[-1]
        if isinstance(step, Play):
            stalled = step.may_restart and bool(stalls) and stalls.pop(0)
            steps.append(plan.played(restart=stalled))
        else:
            steps.append(plan.restarted())
    return steps


def test_without_rules_the_stages_run_once_in_order() -> None:
    steps = walk(StagePlan([stage("a"), stage("b"), stage("c")]), [])
    assert steps == [
        Play(0, 0, snapshot=False, may_restart=False),
        Play(1, 0, snapshot=False, may_restart=False),
        Play(2, 0, snapshot=False, may_restart=False),
        Done(),
    ]


def test_a_stage_restarts_itself_until_its_rule_is_spent() -> None:
    rule = {"after": 1, "below": 1.0, "max": 2, "reinit": ["p"]}
    steps = walk(StagePlan([stage("a"), stage("b", rule)]), [True, True])
    assert steps == [
        Play(0, 0, snapshot=False, may_restart=False),
        Play(1, 0, snapshot=True, may_restart=True),
        Restart(stage=1, back_to=1, count=1, reinit=("p",)),
        Play(1, 1, snapshot=True, may_restart=True),
        Restart(stage=1, back_to=1, count=2, reinit=("p",)),
        Play(1, 2, snapshot=True, may_restart=False),  # no restart left: it runs on
        Done(),
    ]


def test_back_to_an_earlier_stage_replays_every_stage_between() -> None:
    stages = [stage("a"), stage("b"), stage("c", {"after": 1, "below": 1.0, "back_to": "a"})]
    plan = StagePlan(stages)
    steps = walk(plan, [True, False])
    assert steps == [
        Play(0, 0, snapshot=True, may_restart=False),
        Play(1, 0, snapshot=False, may_restart=False),
        Play(2, 0, snapshot=False, may_restart=True),
        Restart(stage=2, back_to=0, count=1, reinit=()),
        Play(0, 1, snapshot=True, may_restart=False),
        Play(1, 1, snapshot=False, may_restart=False),
        Play(2, 1, snapshot=False, may_restart=True),  # max 2: one left, not used
        Done(),
    ]
    assert plan.restarts == 1


def test_back_to_names_the_latest_stage_of_that_name() -> None:
    rule = {"after": 1, "below": 1.0, "back_to": "x"}
    stages = [stage("x"), stage("y"), stage("x"), stage("z", rule)]
    steps = walk(StagePlan(stages), [True])
    assert Restart(stage=3, back_to=2, count=1, reinit=()) in steps


def test_two_rules_keep_their_own_budgets() -> None:
    one = {"after": 1, "below": 1.0, "max": 1}
    stages = [stage("a", one), stage("b", one)]
    steps = walk(StagePlan(stages), [True, True, True])
    restarts = [s for s in steps if isinstance(s, Restart)]
    assert [(r.stage, r.count) for r in restarts] == [(0, 1), (1, 2)]


def test_misuse_is_refused() -> None:
    plan = StagePlan([stage("a")])
    plan.first()
    with pytest.raises(ValueError, match="no restart left"):
        plan.played(restart=True)
    with pytest.raises(ValueError, match="without a pending Restart"):
        StagePlan([stage("a")]).restarted()
