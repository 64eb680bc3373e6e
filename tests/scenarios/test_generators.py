"""Generated tasks with a difficulty (issue 32 s6): every seed a new task, difficulty
monotone in the scripted baseline's success and in the task's size, no answer in the
learner's view, and the conformance suite passes on the generated options."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import pytest

from parley.agents.scripted.tool_use import CalcOracle
from parley.scenarios import make, register, registry
from parley.scenarios.conformance import check_scenario, play_episode
from parley.scenarios.tool_use.calc_chain import CalcChainV1, accepted_answers, build_problem
from parley.scenarios.tool_use.calc_chain_gen import CHAIN, MAX_DIFFICULTY, draw_chain
from parley.scenarios.tools.calculator import format_number

CALC = "tool_use/calc-chain-v1"
SEEDS = range(12)


class CalcChainGenerated(CalcChainV1):
    """calc-chain-v1 under a test id (the conformance suite makes scenarios by id)."""

    metadata: ClassVar[dict[str, Any]] = {**CalcChainV1.metadata, "name": "test/calc-gen-v0"}


GENERATED = {"test/calc-gen-v0": (CalcChainGenerated, CALC, {"difficulty": 3})}
for _id, (_cls, _like, _kwargs) in GENERATED.items():
    register(
        _id,
        f"{__name__}:{_cls.__name__}",
        kwargs=_kwargs,
        baselines=dict(registry()[_like].baselines),
        override=True,
    )


def _metrics(scenario_id: str, seed: int, agents: dict[str, object], **kwargs: object) -> dict:
    return json.loads(play_episode(scenario_id, seed=seed, agents=agents, **kwargs)[-1][1])


def test_calc_chain_every_seed_is_a_new_task_of_the_difficulty_length() -> None:
    for difficulty in (0, 4, MAX_DIFFICULTY):
        drawn = [draw_chain(np.random.default_rng(seed), difficulty) for seed in range(30)]
        assert len({tuple(q) for q in drawn}) == 30
        problems = [build_problem(CHAIN, q) for q in drawn]
        assert {len(p.steps) for p in problems} == {difficulty + 1}
        assert all(p.steps[0].tool == "convert" for p in problems)


def test_calc_chain_oracle_success_falls_as_difficulty_rises() -> None:
    """One tool call per turn: at the default 6 turns the oracle solves chains of up to 5
    operations (difficulty 4) and none longer; with turns to spare it solves every one (the
    references are right)."""
    oracle = {"solver": CalcOracle()}
    success = [
        np.mean([_metrics(CALC, s, oracle, difficulty=d)["success"] for s in SEEDS])
        for d in range(MAX_DIFFICULTY + 1)
    ]
    assert success == sorted(success, reverse=True)
    assert success[0] == 1.0
    assert success[-1] == 0.0
    roomy = [_metrics(CALC, s, oracle, difficulty=9, max_turns=12) for s in SEEDS]
    assert all(m["success"] == 1.0 and m["difficulty"] == 9.0 for m in roomy)


def test_calc_chain_default_keeps_the_templates() -> None:
    env = make(CALC)
    _, infos = env.reset(seed=0)
    assert infos["solver"]["view"]["template"] != CHAIN
    assert env.unwrapped.difficulty is None
    for bad in (-1, MAX_DIFFICULTY + 1, 1.5, True):
        with pytest.raises(ValueError, match="difficulty"):
            make(CALC, difficulty=bad)


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"-?\d+(?:\.\d+)?", text))


def test_calc_chain_answer_is_not_in_the_first_observation_or_infos() -> None:
    """Attack: the rounded answer (and the exact one) appear nowhere the solver can read
    before it computes them (the view's quantities say what the text says, nothing more)."""
    for difficulty in range(MAX_DIFFICULTY + 1):
        for seed in SEEDS:
            env = make(CALC, difficulty=difficulty)
            observations, infos = env.reset(seed=seed)
            problem = env.unwrapped.s.problem
            answers = {format_number(a, 2) for a in accepted_answers(problem)}
            answers.add(format_number(Fraction(problem.exact)))
            seen = _numbers(observations["solver"] + json.dumps(infos))
            assert not answers & seen, (difficulty, seed, answers & seen)


@pytest.mark.parametrize("scenario_id", sorted(GENERATED))
def test_generated_options_pass_the_conformance_suite(scenario_id: str) -> None:
    report = check_scenario(scenario_id)
    assert all(v == "passed" or v.startswith("n/a") for v in report.values()), report
