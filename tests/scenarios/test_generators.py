"""Generated tasks with a difficulty (issue 32 s6): every seed a new task, difficulty
monotone in the scripted baseline's success and in the task's size, no answer in the
learner's view, and the conformance suite passes on the generated options."""

from __future__ import annotations

import difflib
import json
import re
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import pytest

from parley.agents.scripted.code import DebugNaive
from parley.agents.scripted.tool_use import CalcOracle
from parley.scenarios import make, register, registry
from parley.scenarios.code.debug import CodeDebugV3
from parley.scenarios.code.debug_gen import MAX_DIFFICULTY as DEBUG_MAX
from parley.scenarios.code.debug_gen import draw_generated
from parley.scenarios.conformance import (
    ConformanceFailure,
    check_noninterference,
    check_scenario,
    play_episode,
)
from parley.scenarios.tool_use.calc_chain import CalcChainV1, accepted_answers, build_problem
from parley.scenarios.tool_use.calc_chain_gen import CHAIN, MAX_DIFFICULTY, draw_chain
from parley.scenarios.tool_use.retail_desk_v3 import RetailDeskV3
from parley.scenarios.tool_use.retail_gen import MAX_DIFFICULTY as RETAIL_MAX
from parley.scenarios.tool_use.retail_gen import build_generated_task
from parley.scenarios.tools.calculator import format_number

CALC = "tool_use/calc-chain-v1"
RETAIL = "tool_use/retail-desk-v3"
DEBUG = "code/debug-v3"
SEEDS = range(12)


class CalcChainGenerated(CalcChainV1):
    """calc-chain-v1 under a test id (the conformance suite makes scenarios by id)."""

    metadata: ClassVar[dict[str, Any]] = {**CalcChainV1.metadata, "name": "test/calc-gen-v0"}


class RetailDeskGenerated(RetailDeskV3):
    """retail-desk-v3 under a test id."""

    metadata: ClassVar[dict[str, Any]] = {**RetailDeskV3.metadata, "name": "test/retail-gen-v0"}


class DebugGenerated(CodeDebugV3):
    """code/debug-v3 under a test id."""

    metadata: ClassVar[dict[str, Any]] = {**CodeDebugV3.metadata, "name": "test/debug-gen-v0"}


class RetailGeneratedLeak(RetailDeskGenerated):
    """A leak the check must catch: the generated task's facts in the assistant's view."""

    metadata: ClassVar[dict[str, Any]] = {**RetailDeskV3.metadata, "name": "test/retail-leak-v0"}

    def view(self, agent: str) -> dict[str, Any]:
        return {**super().view(agent), "facts": list(self.desk.task.facts)}


GENERATED = {
    "test/calc-gen-v0": (CalcChainGenerated, CALC, {"difficulty": 3}),
    "test/retail-gen-v0": (RetailDeskGenerated, RETAIL, {"difficulty": 3}),
    "test/retail-leak-v0": (RetailGeneratedLeak, RETAIL, {"difficulty": 3}),
    "test/debug-gen-v0": (DebugGenerated, DEBUG, {"difficulty": 2}),
}
for _id, (_cls, _like, _kwargs) in GENERATED.items():
    register(
        _id,
        f"{__name__}:{_cls.__name__}",
        kwargs=_kwargs,
        baselines=dict(registry()[_like].baselines),
        override=True,
    )


def _metrics(
    scenario_id: str, seed: int, agents: dict[str, Any] | None, **kwargs: object
) -> dict[str, float]:
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
            problem = env.unwrapped.chain.problem
            answers = {format_number(a, 2) for a in accepted_answers(problem)}
            answers.add(format_number(Fraction(problem.exact)))
            seen = _numbers(observations["solver"] + json.dumps(infos))
            assert not answers & seen, (difficulty, seed, answers & seen)


def _retail_size(difficulty: int, index: int) -> tuple[int, int, int, int]:
    """Customers in the store, orders of the customer served, reference actions, fields."""
    env = make(RETAIL, difficulty=difficulty, task=index)
    env.reset(seed=0)
    db, task = env.unwrapped.db, env.unwrapped.desk.task
    (customers,) = db.conn.execute("SELECT COUNT(*) FROM customers").fetchone()
    (orders,) = db.conn.execute(
        "SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id WHERE c.email=?",
        (task.email,),
    ).fetchone()
    return customers, orders, len(task.actions), len(task.ask)


def test_retail_task_size_rises_with_difficulty_and_every_seed_is_new() -> None:
    sizes = [
        np.mean([_retail_size(d, index) for index in range(6)], axis=0)
        for d in range(RETAIL_MAX + 1)
    ]
    for column in zip(*sizes, strict=True):
        assert list(column) == sorted(column), sizes
    assert [s[2] for s in sizes] == [d + 1.0 for d in range(RETAIL_MAX + 1)]  # requests
    assert sizes[-1][0] > sizes[0][0]
    assert sizes[-1][1] > sizes[0][1]
    openings = {make(RETAIL, difficulty=2).reset(seed=s)[1]["user"]["view"]["opening"]
                for s in range(10)}  # fmt: skip
    assert len(openings) == 10


def test_retail_answerer_solves_every_difficulty() -> None:
    """The scripted answerer (privileged reference actions; facts read from its tool
    results) solves each generated task: the references and facts agree with the tools."""
    for difficulty in range(RETAIL_MAX + 1):
        for seed in range(3):
            metrics = _metrics(RETAIL, seed, None, difficulty=difficulty)  # the baselines
            assert metrics["success"] == 1.0, (difficulty, seed)
            assert metrics["difficulty"] == difficulty


def test_retail_amounts_are_not_in_the_assistants_observation_or_infos() -> None:
    """Attack: no amount the answer needs is shown to the assistant before its tools run
    (the opening it reads names orders and products only)."""
    for difficulty in range(RETAIL_MAX + 1):
        for seed in range(6):
            env = make(RETAIL, difficulty=difficulty)
            observations, infos = env.reset(seed=seed)
            task = env.unwrapped.desk.task
            amounts = {f for f in task.facts if f.startswith("$")}
            shown = observations["assistant"] + json.dumps(infos["assistant"]) + task.opening
            assert not {a for a in amounts if a in shown or a[1:] in _numbers(shown)}
            assert build_generated_task(task.index, difficulty) == task  # pure


def _changed_lines(task: Any) -> int:
    diff = difflib.ndiff(task.fixed.splitlines(), task.buggy.splitlines())
    return sum(line.startswith("+ ") for line in diff)


def test_debug_bug_count_and_changed_lines_rise_with_difficulty() -> None:
    """d + 1 validated bugs at distinct sites, each one visible (leaving any out changes the
    module); every seed a new task; the lines a fix must change rise with d."""
    changed = []
    for difficulty in range(DEBUG_MAX + 1):
        tasks = [draw_generated(np.random.default_rng(seed), difficulty) for seed in range(16)]
        assert all(len(t.kind.split("+")) == difficulty + 1 for t in tasks)
        assert len({t.buggy for t in tasks}) >= 14  # (d = 0: 341 single bugs to draw from)
        assert all(t.fixed != t.buggy for t in tasks)
        changed.append(np.mean([_changed_lines(t) for t in tasks]))
    assert changed == sorted(changed), changed
    assert changed[-1] > changed[0]


def test_debug_fix_and_hidden_calls_are_not_in_the_coders_view() -> None:
    """Attack: neither the reference fix nor any hidden call reaches the coder's first
    observation or infos (the task's name says the function and the bug count only)."""
    for difficulty in range(DEBUG_MAX + 1):
        for seed in range(4):
            env = make(DEBUG, difficulty=difficulty, allow_weak_sandbox=True)
            observations, infos = env.reset(seed=seed)
            task = env.unwrapped.case.task
            shown = observations["coder"] + json.dumps(infos["coder"])
            assert task.fixed not in shown
            assert task.buggy.split("\n")[1] in shown  # (the buggy module is shown)
            visible = {call for call, _ in task.visible}
            assert not any(call in shown for call, _ in task.hidden if call not in visible)
            assert env.unwrapped.metrics() == {}  # (not ended)
    with pytest.raises(ValueError, match="task pins"):
        make(DEBUG, difficulty=1, task=0)


@pytest.mark.parametrize("scenario_id", ["test/calc-gen-v0", "test/retail-gen-v0"])
def test_generated_options_pass_the_conformance_suite(scenario_id: str) -> None:
    report = check_scenario(scenario_id)
    assert all(v == "passed" or v.startswith("n/a") for v in report.values()), report
    if "retail" in scenario_id:  # the customer's goal is hidden: the redraw check ran
        assert report["noninterference"] == "passed"


def test_the_leak_check_catches_a_generated_task_in_the_view() -> None:
    with pytest.raises(ConformanceFailure, match="depends on data it may not know"):
        check_noninterference("test/retail-leak-v0")


@pytest.mark.long
@pytest.mark.timeout(300)
def test_debug_unfixed_code_passes_less_and_the_fix_everything_and_conformance() -> None:
    """In the sandbox: the unfixed module's hidden pass rate (DebugNaive submits it) is
    lower with 4 bugs than with 1 over the same seeds; the reference fix (the oracle)
    passes every hidden call at difficulty 3; the conformance suite (hidden calls redrawn
    by the noninterference check) passes on a generated id."""
    naive = {}
    for d in (0, DEBUG_MAX):
        rates = [
            _metrics(DEBUG, s, {"coder": DebugNaive()}, difficulty=d)["hidden_pass_rate"]
            for s in range(10)
        ]
        naive[d] = np.mean(rates)
    assert naive[DEBUG_MAX] < naive[0], naive
    assert all(_metrics(DEBUG, s, None, difficulty=DEBUG_MAX)["success"] == 1.0 for s in range(4))
    report = check_scenario("test/debug-gen-v0")
    assert all(v == "passed" or v.startswith("n/a") for v in report.values()), report
    assert report["noninterference"] == "passed"
