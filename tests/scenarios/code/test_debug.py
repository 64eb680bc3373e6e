"""code/debug-v0: every bundled task is consistent, the oracle solves all, hostile code scores 0."""

from __future__ import annotations

import json
from typing import Any

import pytest

from parley.agents.scripted.code import DebugNaive, DebugOracle, DebugReviewer
from parley.scenarios import make
from parley.scenarios.code.debug_tasks import TASKS
from parley.scenarios.code.harness import run_tests
from parley.scenarios.conformance import play_episode
from parley.scenarios.tools.sandbox import Sandbox, SandboxLimits, isolation

ID = "code/debug-v0"
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(isolation() == "rlimits", reason="the sandbox has no isolation here"),
]


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(cpu_seconds=3, wall_seconds=8))


def test_at_least_30_tasks_with_distinct_names() -> None:
    assert len(TASKS) >= 30
    assert len({t.name for t in TASKS}) == len(TASKS)


@pytest.mark.parametrize("index", range(len(TASKS)), ids=[t.name for t in TASKS])
def test_bug_shows_in_both_test_sets_and_the_fix_passes_all(sandbox: Sandbox, index: int) -> None:
    task = TASKS[index]
    for tests in (task.visible, task.hidden):
        buggy = run_tests(sandbox, task.buggy, tests)
        fixed = run_tests(sandbox, task.fixed, tests)
        assert not buggy.problem
        assert not fixed.problem
        assert buggy.passed < len(tests), f"the bug of {task.name} passes {tests}"
        assert fixed.passed == len(tests), fixed.results


def _metrics(agents: dict[str, Any], task: int, **kwargs: Any) -> dict[str, float]:
    record = play_episode(ID, seed=0, agents=agents, task=task, **kwargs)
    return json.loads(record[-1][1])


def test_oracle_solves_every_task_and_naive_none() -> None:
    oracle = [_metrics({"coder": DebugOracle()}, i) for i in range(len(TASKS))]
    naive = [_metrics({"coder": DebugNaive()}, i) for i in range(len(TASKS))]
    assert [m["success"] for m in oracle] == [1.0] * len(TASKS)
    assert all(m["tool_calls"] == 1.0 for m in oracle)  # it ran the visible tests first
    assert sum(m["success"] for m in naive) == 0
    assert 0 < sum(m["hidden_pass_rate"] for m in naive) / len(TASKS) < 1


def test_reviewer_seat_runs_tests_and_the_coder_decides() -> None:
    agents = {"coder": DebugOracle(), "reviewer": DebugReviewer()}
    record = play_episode(ID, seed=0, agents=agents, task=5, reviewer=True)
    seats = [r[1] for r in record if len(r) == 4]
    assert seats == ["coder", "reviewer", "reviewer", "coder"]
    comment = next(r[3] for r in record if len(r) == 4 and r[1] == "reviewer" and "comment" in r[3])
    assert "visible tests passed" in comment
    assert json.loads(record[-1][1])["success"] == 1.0


def test_hostile_submissions_earn_nothing(sandbox: Sandbox) -> None:
    task = TASKS[0]  # digit_sum
    always_equal = (
        "class E:\n    def __eq__(self, other): return True\ndef digit_sum(n): return E()"
    )
    assert run_tests(sandbox, always_equal, task.hidden).passed == 0
    crash = run_tests(sandbox, "raise SystemExit(3)", task.hidden)
    assert crash.passed == 0
    assert "failed to import" in crash.results[0][1]
    looping = "def digit_sum(n):\n    while n == 9: pass\n    return sum(map(int, str(n)))"
    run = run_tests(sandbox, looping, task.hidden)
    assert run.results[0] == (False, "raised TimeoutError: the test took longer than 1 s")
    assert run.passed == len(task.hidden) - 1
    flood = run_tests(sandbox, "import sys\nwhile True: sys.stdout.write('x' * 9999)", task.hidden)
    assert flood.passed == 0
    assert "ended by output" in flood.problem


def test_tools_report_and_bad_actions_are_invalid() -> None:
    env = make(ID, task=0)
    env.reset(seed=0)
    calls = [
        {
            "name": "run_python",
            "arguments": {
                "code": "print(6 * 7)\nimport socket\nsocket.create_connection(('1.1.1.1', 80), 1)"
            },
        },
        {"name": "run_tests", "arguments": {"code": TASKS[0].buggy}},
    ]
    observations, _, _, _, infos = env.step({"coder": json.dumps({"tool_calls": calls})})
    text = observations["coder"]
    assert "exit code 1\nstdout:\n42\n" in text
    assert "PermissionError" in text  # no network in the sandbox
    assert "1/2 visible tests passed" in text
    assert "FAIL digit_sum(123) == 6: returned 5" in text
    _, _, _, _, infos = env.step({"coder": json.dumps({"comment": "hi"})})
    assert "submit" in infos["coder"]["invalid"]
    _, rewards, terminations, _, _ = env.step({"coder": json.dumps({"submit": TASKS[0].fixed})})
    assert terminations["coder"]
    assert rewards["coder"] == 1.0


def _task_reward(scenario: str, task: int, code: str) -> float:
    env = make(scenario, task=task)
    env.reset(seed=0)
    _, _, terminations, _, infos = env.step({"coder": json.dumps({"submit": code})})
    assert all(terminations.values())
    return float(infos["coder"]["components"]["task"])


def test_v2_pays_nothing_for_the_unfixed_code_and_everything_for_the_fix() -> None:
    """Found by review: submitting the buggy module unchanged paid 0.45 of the maximum on
    average (0.75 on 8 tasks) in v0/v1; v2 pays the improvement over it."""
    tasks = range(0, len(TASKS), 4)
    unchanged_v1 = [_task_reward("code/debug-v1", i, TASKS[i].buggy) for i in tasks]
    assert sum(unchanged_v1) / len(unchanged_v1) > 0.2  # what v2 takes away
    assert [_task_reward("code/debug-v2", i, TASKS[i].buggy) for i in tasks] == [0.0] * len(tasks)
    assert [_task_reward("code/debug-v2", i, TASKS[i].fixed) for i in tasks] == [1.0] * len(tasks)
    # A constant answer scores at most what it adds over the unfixed code.
    constant = "def f(*a, **k):\n    return 0\n" + "\n".join(
        f"{name} = f" for name in ("is_palindrome", "count_vowels", "fib", "digit_sum")
    )
    assert _task_reward("code/debug-v2", 0, constant) <= _task_reward("code/debug-v1", 0, constant)
    paid, task = max(zip(unchanged_v1, tasks, strict=True))
    env = make("code/debug-v2", task=task)
    env.reset(seed=0)
    env.step({"coder": json.dumps({"submit": TASKS[task].buggy})})
    assert env.episode_metrics()["buggy_pass_rate"] == paid > 0
