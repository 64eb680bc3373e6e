"""code/debug: one ``step`` cannot hold the caller for long, and a sandbox that ends without
a report at submission scores 0 instead of raising out of ``step``."""

from __future__ import annotations

import json

import pytest

from parley.scenarios import make
from parley.scenarios.code.debug import CodeDebugV0
from parley.scenarios.tools.sandbox import SandboxError, isolation

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(isolation() == "rlimits", reason="the sandbox has no isolation here"),
]

SLEEP = "import time\ntime.sleep(99)\n"
LOOP = "while True:\n    pass\n"


def _ran(results: list[dict[str, object]]) -> int:
    """How many of a step's tool calls ran (the others were refused: the budget was spent)."""
    return sum("time budget" not in str(result.get("error", "")) for result in results)


def _calls(name: str, code: str, count: int) -> str:
    call = {"name": name, "arguments": {"code": code}}
    return json.dumps({"tool_calls": [call] * count})


@pytest.mark.parametrize(("name", "code"), [("run_python", SLEEP), ("run_tests", LOOP)])
def test_eight_slow_calls_take_one_budget_not_eight_wall_limits(name: str, code: str) -> None:
    env = make("code/debug-v1", task=0, step_budget_s=1.5)
    env.reset(seed=0)
    env.step({"coder": _calls(name, code, 8)})
    # Counted, not timed (a loaded machine stretches the sandbox's start and kill): the
    # first call spends the step's budget and the other seven are refused unrun.
    assert _ran(env.unwrapped.case.last_results["coder"]) == 1
    # The next step has a fresh budget: a quick call runs.
    env.step({"coder": _calls("run_python", "print(6 * 7)", 1)})
    assert "42" in json.dumps(env.unwrapped.case.last_results["coder"])


def test_calls_after_the_budget_is_spent_are_refused_with_a_reason() -> None:
    env = make("code/debug-v1", task=0, step_budget_s=1.0)
    env.reset(seed=0)
    env.step({"coder": _calls("run_python", SLEEP, 3)})
    results = env.unwrapped.case.last_results["coder"]
    assert len(results) == 3
    assert "ended by timeout" in json.dumps(results[0])
    for later in results[1:]:
        assert "time budget (1 s) is spent" in json.dumps(later)


def test_the_default_budget_bounds_a_step_of_sleeping_calls() -> None:
    env = make("code/debug-v0", task=0)
    env.reset(seed=0)
    env.step({"coder": _calls("run_python", SLEEP, 8)})
    assert _ran(env.unwrapped.case.last_results["coder"]) == 1  # the rest refused unrun
    assert env.unwrapped.max_step_wall_s < 20
    assert CodeDebugV0.metadata["blocking_step"] is True


def test_honest_calls_all_run_within_the_budget() -> None:
    env = make("code/debug-v0", task=0)
    env.reset(seed=0)
    buggy = env.unwrapped.case.task.buggy
    calls = [{"name": "run_tests", "arguments": {"code": buggy}}] * 4
    calls += [{"name": "run_python", "arguments": {"code": f"print({i})"}} for i in range(4)]
    env.step({"coder": json.dumps({"tool_calls": calls})})
    results = env.unwrapped.case.last_results["coder"]
    assert len(results) == 8
    assert not any(r.get("error") for r in results), results


def test_submission_whose_sandbox_ends_without_a_report_scores_zero(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Fault injection: in the weak mode the submission can kill the sandbox's supervisor
    # (kill(getppid(), 9)), which the parent sees as this SandboxError.
    env = make("code/debug-v0", task=0)
    env.reset(seed=0)
    scenario = env.unwrapped

    def ended_without_report(*args: object, **kwargs: object) -> None:
        raise SandboxError('the sandbox ended without a report; its stderr: ["digit_sum(9)"]')

    monkeypatch.setattr(scenario.sandbox, "run", ended_without_report)
    submit = json.dumps({"submit": scenario.case.task.fixed})
    _, rewards, terminations, _, infos = env.step({"coder": submit})
    assert terminations["coder"]
    assert rewards["coder"] == 0.0
    # The reason (which can quote what the code printed: the hidden calls) is logged for
    # the operator, never shown in the view (and so in no transcript).
    assert (
        infos["coder"]["view"]["hidden_problem"] == "the sandbox failed (the reason is in the log)"
    )
    assert "ended without a report" in caplog.text
    assert scenario.metrics()["sandbox_failed"] == 1.0
    assert scenario.metrics()["hidden_pass_rate"] == 0.0


def test_a_tool_call_whose_sandbox_fails_is_a_tool_error() -> None:
    env = make("code/debug-v0", task=0)
    env.reset(seed=0)
    scenario = env.unwrapped

    def fail(*args: object, **kwargs: object) -> None:
        raise SandboxError("the sandbox ended without a report; its stderr: ")

    # Every tool run builds its sandbox from the scenario's; make that class's run fail.
    mp = pytest.MonkeyPatch()
    with mp.context() as patch:
        patch.setattr("parley.scenarios.tools.sandbox.Sandbox.run", fail)
        env.step({"coder": _calls("run_python", "print(1)", 1)})
    (result,) = scenario.case.last_results["coder"]
    assert "the sandbox failed" in json.dumps(result)


def test_the_budget_must_be_positive() -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            CodeDebugV0(step_budget_s=bad)
