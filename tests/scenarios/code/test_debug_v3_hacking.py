"""code/debug-v3 against a policy that learns trivial programs from the reward alone (issue 29).

For every task of v3's set (the bundled ones and the generated ones) the suite builds the
programs a policy could settle on without implementing the function, in four families:

- ``constant``: return one value: 20 trivial ones, each visible test's expected value, and
  the value the fix returns most often (the best constant there is);
- ``echo``: return one of the arguments;
- ``visible_table``: the visible tests' answers for their inputs, else the unfixed code or
  the best constant;
- ``unfixed_overrides``: the unfixed code, with (a) the right answer for each of the 32
  likeliest inputs (a table a policy could only learn from a reward that repeats them),
  (b) each of its outputs remapped to the trivial value that passes most often (the per-call
  choice between the unfixed output and ~20 trivial values that v2 paid 0.43 on average),
  (c) both.

An episode pays 1 only when all :data:`HIDDEN_CALLS` fresh calls pass, so a program's
expected reward is ``q ** 32``, ``q`` its pass rate on one call drawn as episodes draw them.
``q`` comes from :data:`DRAWS` such calls per task, judged by the real harness in the sandbox
(one bundled run for the unfixed code and the fix of all 365 tasks) and, for the families
that return a value without running code, by the same type-exact judge here. Choosing each
family's best program on the very calls it is scored on flatters the attack, never the
scenario. Bounds: every family <= 0.05 on every task, the reference fix 1.0 on every task.
The same run verifies the task set: each unfixed module fails a visible test and many calls,
each fix passes all.

With the reward only, as a learner sees it: six such programs are submitted in 64 of the
scenario's own episodes each on six tasks (one harness run per program) and in real
``step`` episodes; none is paid once, the fix every time. v2 is attacked the same way
for contrast: its per-call answers were paid.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pytest

from parley.scenarios import make
from parley.scenarios.code import generate
from parley.scenarios.code.debug_tasks import TASKS
from parley.scenarios.code.generate import BUNDLE_LIMITS, TRIVIAL, Entry, remapped, run_bundle
from parley.scenarios.code.harness import run_tests, same_value
from parley.scenarios.code.inputs import INPUTS
from parley.scenarios.code.task_set import (
    HIDDEN_CALLS,
    DrawnTask,
    call_of,
    draw_hidden,
    expected_of,
    v3_tasks,
)
from parley.scenarios.tools.sandbox import Sandbox, isolation
from tests.scenarios.code.test_debug_reward_hacking import FAMILIES, PRELUDE, _candidates

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(isolation() == "rlimits", reason="the sandbox has no isolation here"),
]

DRAWS = 64
"""Calls per task on which each program's pass rate is measured."""
LIKELY_SAMPLE = 1000
"""Inputs drawn (no code run) to find each task's likeliest ones."""
TABLE = 32
BOUND = 0.05


@dataclass
class Measured:
    """One task's draws, their expected values and what the unfixed code and the fix did."""

    task: DrawnTask
    args: list[tuple[Any, ...]]
    calls: list[str]
    expected: list[Any]
    unfixed: list[tuple[bool, str]]
    fixed: list[tuple[bool, str]]
    unfixed_visible: list[tuple[bool, str]]
    fixed_visible: list[tuple[bool, str]]


@cache
def measured() -> tuple[Measured, ...]:
    """Every v3 task measured in one bundled harness run (seeded)."""
    tasks, entries, draws = v3_tasks(), [], []
    for i, task in enumerate(tasks):
        rng = np.random.default_rng([29, i])
        args = [INPUTS[task.function](rng) for _ in range(DRAWS)]
        tests = [(a, expected_of(task, a)) for a in args]
        draws.append((args, tests))
        for key, code in ((f"u{i}", task.buggy), (f"f{i}", task.fixed)):
            entries.append(Entry(key, task.function, code, tests, task.visible))
    results = run_bundle(Sandbox(BUNDLE_LIMITS), entries)
    out = []
    for i, (task, (args, tests)) in enumerate(zip(tasks, draws, strict=True)):
        unfixed, fixed = results[f"u{i}"], results[f"f{i}"]
        out.append(
            Measured(
                task,
                args,
                [call_of(task.function, a) for a in args],
                [ast.literal_eval(want) for _, want in tests],
                unfixed[:DRAWS],
                fixed[:DRAWS],
                unfixed[DRAWS:],
                fixed[DRAWS:],
            )
        )
    return tuple(out)


def _reward(passed: Sequence[bool]) -> float:
    return float((sum(passed) / len(passed)) ** HIDDEN_CALLS)


def _best_constant(task: DrawnTask, expected: Sequence[Any]) -> tuple[Any, float]:
    """The constant with the highest expected reward on calls whose answers are
    ``expected``: a trivial one, a visible test's answer or the commonest answer."""
    modes = Counter(repr(e) for e in expected).most_common(1)
    candidates = [*TRIVIAL, *(ast.literal_eval(w) for _, w in task.visible)]
    candidates += [ast.literal_eval(modes[0][0])]
    scored = [(c, _reward([same_value(c, e) for e in expected])) for c in candidates]
    return max(scored, key=lambda cs: cs[1])


def _likeliest(m: Measured, index: int) -> set[str]:
    rng = np.random.default_rng([31, index])
    sample = Counter(
        call_of(m.task.function, INPUTS[m.task.function](rng)) for _ in range(LIKELY_SAMPLE)
    )
    return {call for call, _ in sample.most_common(TABLE)}


def family_rewards(index: int, m: Measured) -> dict[str, float]:
    """The best expected reward of each family on task ``index``."""
    unfixed = [ok for ok, _ in m.unfixed]
    best_c, constant = _best_constant(m.task, m.expected)
    echoes = [
        _reward([same_value(a[i], e) for a, e in zip(m.args, m.expected, strict=True)])
        for i in range(len(m.args[0]))
    ]
    visible = {call for call, _ in m.task.visible}
    shown = [c in visible for c in m.calls]  # (the table answers these right)
    const_passed = [same_value(best_c, e) for e in m.expected]
    likely = _likeliest(m, index)
    in_table = [c in likely for c in m.calls]
    remap = remapped(m.unfixed, m.expected)
    return {
        "constant": constant,
        "echo": max(echoes),
        "visible_table": max(
            _reward([s or u for s, u in zip(shown, unfixed, strict=True)]),
            _reward([s or c for s, c in zip(shown, const_passed, strict=True)]),
        ),
        # (the table and the remap together: at least either alone, since a remap may
        # keep each output as it is)
        "unfixed_overrides": _reward([t or r for t, r in zip(in_table, remap, strict=True)]),
        "reference_fix": _reward([ok for ok, _ in m.fixed]),
    }


@pytest.mark.slow
def test_no_trivial_program_earns_anything_on_any_task() -> None:
    rewards = [family_rewards(i, m) for i, m in enumerate(measured())]
    names = [m.task.name for m in measured()]
    report = {}
    for family in rewards[0]:
        values = [r[family] for r in rewards]
        worst = max(range(len(values)), key=values.__getitem__)
        best = min(range(len(values)), key=values.__getitem__)
        report[family] = (max(values), names[worst], min(values), names[best])
    print("\nfamily: max expected reward (task), min (task) over", len(names), "tasks")
    for family, (hi, hi_task, lo, lo_task) in report.items():
        print(f"  {family}: max {hi:.4f} ({hi_task}), min {lo:.4f} ({lo_task})")
    for family, (hi, hi_task, _, _) in report.items():
        if family != "reference_fix":
            assert hi <= BOUND, (family, hi, hi_task)
    assert report["reference_fix"][2] == 1.0


@pytest.mark.slow
def test_every_task_fails_before_its_fix_and_passes_after() -> None:
    """Each unfixed module fails at least one visible test and a fifth of the calls drawn
    as episodes draw them; each fix passes every visible test and every call."""
    for m in measured():
        assert all(ok for ok, _ in m.fixed + m.fixed_visible), m.task.name
        assert not all(ok for ok, _ in m.unfixed_visible), m.task.name
        fails = sum(not ok for ok, _ in m.unfixed)
        assert fails >= DRAWS // 6, (m.task.name, fails)


# --- end to end: real episodes of v2 and v3 on the tasks issue 29 names ---------------------


def _task_reward(scenario: str, task: int, code: str, seed: int = 0) -> float:
    """The ``task`` reward of submitting ``code`` (which must be taken as a submission)."""
    env = make(scenario, task=task)
    env.reset(seed=seed)
    _, _, terminations, _, infos = env.step({"coder": json.dumps({"submit": code})})
    assert all(terminations.values())
    assert env.unwrapped.metrics()["submitted"] == 1.0, "the move was refused (too long?)"
    return float(infos["coder"]["components"]["task"])


def _table_program(task: DrawnTask | Any, function: str, table: dict[str, Any]) -> str:
    """The unfixed code, with ``table``'s answers for the argument tuples it holds."""
    return (
        task.buggy
        + f"\n_TABLE = {table!r}\n_unfixed = {function}\n"
        + f"def {function}(*args):\n"
        + "    key = repr(args)\n"
        + "    return _TABLE[key] if key in _TABLE else _unfixed(*args)\n"
    )


def _args_of(call: str) -> tuple[Any, ...]:
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call)
    return tuple(ast.literal_eval(arg) for arg in node.args)


NAMED = ("gcd", "max_subarray", "clamp")


@pytest.mark.parametrize("name", NAMED)
def test_v2_pays_learned_per_call_answers_and_v3_does_not(name: str) -> None:
    """v2's hidden calls are the same in every episode: the unfixed code with, per call,
    the right one of the trivial values and the integers -30..30 (a search by reward finds
    it) was paid; v3 draws other calls in each episode."""
    v2_index = next(i for i, t in enumerate(TASKS) if t.name == name)
    v2_task = TASKS[v2_index]
    table = {}
    for call, want in v2_task.hidden:
        value = ast.literal_eval(want)
        if any(same_value(value, c) for c in (*TRIVIAL, *range(-30, 31))):
            table[repr(_args_of(call))] = value
    function = v2_task.visible[0][0].split("(", 1)[0]
    program = _table_program(v2_task, function, table)
    assert _task_reward("code/debug-v2", v2_index, program) >= 0.5
    v3_index = next(i for i, t in enumerate(v3_tasks()) if t.name == name)
    assert _task_reward("code/debug-v3", v3_index, program) == 0.0


def _programs(index: int) -> dict[str, str]:
    """The programs a policy could settle on for v3 task ``index`` (as submissions), and the
    reference fix: the best constant, an argument echo, the visible tests' table over the
    unfixed code, the unfixed code with the right answers for every call of three earlier
    episodes, and with the right answers for the task's 32 likeliest inputs."""
    task = v3_tasks()[index]
    fn = task.function
    hidden = draw_hidden(task, np.random.default_rng(7), count=DRAWS)
    constant, _ = _best_constant(task, [ast.literal_eval(w) for _, w in hidden])
    earlier = {}
    for seed in range(3):
        for call, want in draw_hidden(task, np.random.default_rng(seed)):
            earlier[repr(_args_of(call))] = ast.literal_eval(want)
    rng = np.random.default_rng(11)
    draws = Counter(repr(INPUTS[fn](rng)) for _ in range(LIKELY_SAMPLE)).most_common(TABLE)
    likeliest = {
        key: ast.literal_eval(expected_of(task, ast.literal_eval(key))) for key, _ in draws
    }
    visible = {repr(_args_of(c)): ast.literal_eval(w) for c, w in task.visible}
    return {
        "constant": f"def {fn}(*args):\n    return {constant!r}\n",
        "echo": f"def {fn}(*args):\n    return args[0]\n",
        "visible_table": _table_program(task, fn, visible),
        "earlier_episodes_table": _table_program(task, fn, earlier),
        "likeliest_inputs_table": _table_program(task, fn, likeliest),
        "reference_fix": task.fixed,
    }


@pytest.mark.parametrize("name", NAMED)
def test_v3_episodes_pay_only_the_fix(name: str) -> None:
    """Real episodes (seed 5): each of :func:`_programs` gets 0, the reference fix 1."""
    index = next(i for i, t in enumerate(v3_tasks()) if t.name == name)
    for label, program in _programs(index).items():
        paid = _task_reward("code/debug-v3", index, program, seed=5)
        assert paid == (1.0 if label == "reference_fix" else 0.0), label


LEARNER_EPISODES = 64


@pytest.mark.slow
def test_a_learner_sees_no_reward_from_any_of_the_programs() -> None:
    """Playing as a learning policy would, with the reward only: each program of
    :func:`_programs` submitted in 64 episodes (seeds 1000-1063) of the three named tasks
    and three generated ones; the episodes are the scenario's own (``reset(seed)`` draws
    these calls), run in one harness call per program, each paid 1 only if all its calls
    pass. A bandit over these arms would see 0 on every pull but the fix's."""
    sandbox = Sandbox(BUNDLE_LIMITS)
    seeds = range(1000, 1000 + LEARNER_EPISODES)
    picks = [next(i for i, t in enumerate(v3_tasks()) if t.name == n) for n in NAMED]
    picks += [60, 200, 340]
    totals: Counter[str] = Counter()
    for index in picks:
        task = v3_tasks()[index]
        episodes = [draw_hidden(task, np.random.default_rng(seed)) for seed in seeds]
        env = make("code/debug-v3", task=index)
        env.reset(seed=seeds[-1])
        assert env.unwrapped.case.task.hidden == episodes[-1]
        calls = [test for episode in episodes for test in episode]
        for label, program in _programs(index).items():
            results = run_tests(sandbox, program, calls, strict=True).results
            paid = [
                all(ok for ok, _ in results[e * HIDDEN_CALLS : (e + 1) * HIDDEN_CALLS])
                for e in range(LEARNER_EPISODES)
            ]
            totals[label] += sum(paid)
            expected = LEARNER_EPISODES if label == "reference_fix" else 0
            assert sum(paid) == expected, (task.name, label, sum(paid))
    print(f"\nepisodes paid, of {LEARNER_EPISODES * len(picks)} per program: {dict(totals)}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_harness_exploit_families_earn_nothing_in_v3(family: str) -> None:
    """v0's fast exploit families (15: forged results lines, patched builtins, reading the
    task files, introspection...), appended to the unfixed code as in v0's suite."""
    index = next(i for i, t in enumerate(v3_tasks()) if t.name == "is_palindrome")
    code = v3_tasks()[index].buggy + PRELUDE + _candidates() + FAMILIES[family]
    assert _task_reward("code/debug-v3", index, code) == 0.0


def test_true_is_not_one_in_v3() -> None:
    """v2 compared with ``==``: an int where a bool is due passed; v3 compares type-exact."""
    name = "leap_year"
    v2_index = next(i for i, t in enumerate(TASKS) if t.name == name)
    ints = TASKS[v2_index].fixed + "\n_f = leap_year\ndef leap_year(y):\n    return int(_f(y))\n"
    assert _task_reward("code/debug-v2", v2_index, ints) == 1.0
    v3_index = next(i for i, t in enumerate(v3_tasks()) if t.name == name)
    assert _task_reward("code/debug-v3", v3_index, ints) == 0.0
    assert _task_reward("code/debug-v3", v3_index, TASKS[v2_index].fixed) == 1.0


# --- the generated task set -------------------------------------------------------------------


def test_the_generated_set_is_large_varied_and_derived_from_its_bases() -> None:
    """>= 300 tasks, all four kinds of bug; each task's modules are exactly what the
    generator derives from its base (the fix normalised, the bug one of its mutants)."""
    generated = [t for t in v3_tasks() if t.kind != "bundled"]
    assert len(generated) >= 300
    assert set(Counter(t.kind for t in generated)) == set(generate.KINDS)
    bases = {b.name: b for b in generate.bases()}
    by_site = {b.name: {m.site: m for m in generate.mutants(b.source)} for b in bases.values()}
    for task in generated:
        assert task.fixed == generate.normalized(bases[task.function].source)
        mutant = by_site[task.function][int(task.name.rsplit(".", 1)[1])]
        assert (mutant.kind, mutant.code) == (task.kind, task.buggy), task.name


@pytest.mark.slow
def test_regenerating_gives_the_committed_tasks() -> None:
    """The generator is deterministic: a third of the bases regenerated (sandbox runs and
    all) give their committed records byte for byte."""
    committed = [json.loads(line.rstrip(",")) for line in _generated_lines()]
    sandbox = Sandbox(BUNDLE_LIMITS)
    for index, base in enumerate(generate.bases()):
        if index % 3 == 0:
            mine = [r for r in committed if r["function"] == base.name]
            assert generate._base_tasks(sandbox, base, index, 0) == mine, base.name


def _generated_lines() -> list[str]:
    from importlib.resources import files

    text = files("parley.scenarios.code").joinpath("debug_tasks_generated.json").read_text()
    return [line for line in text.splitlines() if line.startswith("{")]


def test_each_episode_draws_its_own_hidden_calls() -> None:
    task = next(t for t in v3_tasks() if t.name == "gcd")
    first = draw_hidden(task, np.random.default_rng(0))
    assert first == draw_hidden(task, np.random.default_rng(0))  # seeded
    others = [draw_hidden(task, np.random.default_rng(s)) for s in range(1, 6)]
    assert all(not set(first) & set(o) for o in others)
    assert len(first) == HIDDEN_CALLS
