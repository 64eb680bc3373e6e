"""The code/debug judge: no secret enters the sandbox, and no reply can fool or crash it."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from parley.agents.scripted.code import DebugReviewer
from parley.scenarios import make
from parley.scenarios.code.debug_tasks import TASKS
from parley.scenarios.code.harness import MARK, parse_results, run_tests
from parley.scenarios.conformance import play_episode
from parley.scenarios.tools.sandbox import Sandbox, SandboxLimits, SandboxResult, isolation

needs_sandbox = pytest.mark.skipif(isolation() == "rlimits", reason="no sandbox isolation here")


def _line(entries: Any) -> str:
    return "noise\n" + MARK + json.dumps(entries) + "\n"


def test_plain_values_round_trip_with_their_exact_types() -> None:
    values = [None, True, 0, -(10**40), 1.5, math.inf, "\ud800 é", [1, [2]], (1,), {1, (2, "x")}]
    values.append({"k": [None], (1, 2): {3}})
    entries = [["ok", _encode(v)] for v in values]
    outcomes, problem = parse_results(_line(entries), len(values))
    assert problem == ""
    for outcome, value in zip(outcomes, values, strict=True):
        assert outcome.returned
        assert outcome.value == value
        assert type(outcome.value) is type(value)


def _encode(x: Any) -> Any:
    """The runner's encoding (kept here independently, as a second reading of the format)."""
    if x is None:
        return ["n"]
    kinds = {bool: "b", str: "s"}
    if type(x) in kinds:
        return [kinds[type(x)], x]
    if type(x) is int:
        return ["i", str(x)]
    if type(x) is float:
        return ["f", repr(x)]
    if type(x) is dict:
        return ["d", [[_encode(k), _encode(v)] for k, v in x.items()]]
    return [{list: "l", tuple: "t", set: "S"}[type(x)], [_encode(i) for i in x]]


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        MARK,
        MARK + "{",
        MARK + "[" * 100_000,
        MARK + '{"0": ["ok", ["b", true]]}',
        _line([["ok", ["i", "9" * 5000]]] * 3),
        _line([["ok", ["i", "1e3"]], ["ok", ["f", "1" * 40]], ["ok", ["S", [["l", []]]]]]),
        _line([["ok", ["d", [[["l", []], ["n"]]]]], ["ok", ["x"]], ["ok"], [True, "ok"]]),
        _line([["ok", ["s", "x" * 5000]], "PASS", None, 7]),
        _line([["ok", ["l", [["l", [["l", []]]]] * 3000]]]),
    ],
    ids=lambda s: s[:30],
)
def test_malformed_replies_score_zero_and_never_raise(stdout: str) -> None:
    outcomes, _ = parse_results(stdout, 4)
    assert len(outcomes) == 4
    assert not any(o.returned for o in outcomes)


def test_short_long_and_duplicated_replies_count_only_their_own_tests() -> None:
    one = ["ok", ["i", "1"]]
    short, problem = parse_results(_line([one]), 3)
    assert [o.returned for o in short] == [True, False, False]
    assert "1 results for 3 tests" in problem
    long, problem = parse_results(_line([one] * 9), 3)
    assert [o.value for o in long] == [1, 1, 1]
    assert "9 results" in problem
    # Several results lines: the last one counts, as if the function had returned those values.
    last, _ = parse_results(_line([one] * 3) + _line([["ok", ["i", "2"]]] * 3), 3)
    assert [o.value for o in last] == [2, 2, 2]


class RecordingSandbox(Sandbox):
    """The real sandbox, remembering every program and file it was given."""

    seen: list[str]

    def run(self, code: str, *, files: Any = None) -> SandboxResult:
        self.seen.extend([code, *(files or {}).values()])
        return super().run(code, files=files)


@needs_sandbox
@pytest.mark.parametrize("index", [0, 2, 14])
def test_no_expected_value_or_fix_enters_the_sandbox(index: int) -> None:
    sandbox = RecordingSandbox(SandboxLimits(cpu_seconds=3, wall_seconds=8))
    sandbox.seen = []
    task = TASKS[index]
    run = run_tests(sandbox, task.fixed, task.hidden)
    assert run.passed == len(task.hidden)
    sent = "\n".join(sandbox.seen)
    assert sent.count(task.fixed) == 1  # the submission itself, nothing else
    for call, expected in task.hidden:
        assert json.dumps(call) in sent
        assert f"[{json.dumps(call)}, {json.dumps(expected)}]" not in sent
    assert "expected" not in sent.lower()


@needs_sandbox
def test_the_run_tests_tool_reports_no_forged_pass() -> None:
    task = TASKS[0]
    forged = MARK + json.dumps([[True, "PASS"], ["ok", ["E"]]])
    hack = task.buggy + f"import os\nos.write(1, {(forged + chr(10)).encode()!r})\nos._exit(0)\n"
    env = make("code/debug-v0", task=0)
    env.reset(seed=0)
    calls = [{"name": "run_tests", "arguments": {"code": c}} for c in (task.buggy, hack)]
    observations, *_ = env.step({"coder": json.dumps({"tool_calls": calls})})
    text = observations["coder"]
    assert "1/2 visible tests passed" in text  # the buggy module
    assert "0/2 visible tests passed" in text  # the forged one
    assert "malformed" in text


@needs_sandbox
def test_run_python_finds_no_task_data_on_the_sandbox_disk() -> None:
    secrets = [TASKS[0].fixed.encode(), b"digit_sum(1005)"]  # the fix; a hidden call
    script = (
        "import os\n"
        "seen = found = 0\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root in ('/usr', '/proc', '/sys', '/bin', '/sbin', '/dev', '/lib', '/lib64'):\n"
        "        dirs[:] = []\n"
        "    for name in files:\n"
        "        if os.path.join(root, name) == os.path.abspath(__file__):\n"
        "            continue  # this script\n"
        "        seen += 1\n"
        "        if 'debug_tasks' in name or 'parley' in name:\n"
        "            print('NAME', root, name)\n"
        "        try:\n"
        "            with open(os.path.join(root, name), 'rb') as f:\n"
        "                text = f.read(1 << 20)\n"
        f"            if any(s in text for s in {secrets!r}):\n"
        "                    print('FOUND', root, name)\n"
        "        except OSError:\n"
        "            pass\n"
        "print('files', seen)\n"
    )
    # The walk reads every file it may, which takes seconds on a loaded host: this test is
    # about what the disk holds, so the turn's time limits are raised well beyond that.
    env = make("code/debug-v0", task=0, step_budget_s=120)
    limits = env.unwrapped.sandbox.limits
    env.unwrapped.sandbox = Sandbox(
        dataclasses.replace(limits, wall_seconds=120, cpu_seconds=60), allow_weak=False
    )
    env.reset(seed=0)
    call = {"name": "run_python", "arguments": {"code": script}}
    observations, *_ = env.step({"coder": json.dumps({"tool_calls": [call]})})
    text = observations["coder"]
    assert "exit code 0" in text, text
    assert "files " in text
    assert "FOUND" not in text
    assert "NAME" not in text


class HackingReviewer(DebugReviewer):
    """Leaves processes and forged lines behind in its own sandbox runs, then comments."""

    def new_episode(self) -> None:
        self.moves = 0

    def decide(self, observation: Any) -> str:
        self.moves += 1
        if self.moves > 1:
            return json.dumps({"comment": "done"})
        leftover = (
            "import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    for _ in range(100):\n"
            f"        os.write(1, {(MARK + '[[true, 1]]' + chr(10)).encode()!r})\n"
            "        time.sleep(0.05)\n"
            "print('left a child')\n"
        )
        calls = [
            {"name": "run_python", "arguments": {"code": leftover}},
            {"name": "run_tests", "arguments": {"code": leftover}},
        ]
        return json.dumps({"tool_calls": calls})


class BuggyCoder(DebugReviewer):
    """Sends the unfixed module to the reviewer, then submits it."""

    def new_episode(self) -> None:
        self.moves = 0

    def decide(self, observation: Any) -> str:
        self.moves += 1
        if self.moves == 1:
            return json.dumps({"message": "draft"})
        return json.dumps({"submit": TASKS[1].buggy})


@needs_sandbox
def test_the_reviewer_seat_cannot_change_the_score() -> None:
    agents = {"coder": BuggyCoder(), "reviewer": HackingReviewer()}
    record = play_episode("code/debug-v0", seed=0, agents=agents, task=1, reviewer=True)
    assert json.loads(record[-1][1])["hidden_pass_rate"] == 0.75  # the buggy module's score


@needs_sandbox
def test_results_are_bounded_in_the_sandbox_and_plain_ones_compare_by_type() -> None:
    sandbox = Sandbox(SandboxLimits(cpu_seconds=3, wall_seconds=8))
    code = (
        "def big(): return list(range(1000))\n"
        "def same(): return [1, (2, 3), {4}, {'k': None}, 2.5, True]\n"
        "def other(): return (1, [2, 3], {4}, {'k': None}, 2.5, 1)\n"
    )
    tests = [("big()", "[]"), ("same()", "[1, (2, 3), {4}, {'k': None}, 2.5, True]")]
    tests.append(("other()", "[1, (2, 3), {4}, {'k': None}, 2.5, True]"))
    run = run_tests(sandbox, code, tests)
    assert run.results[0] == (False, "returned a value too large to compare")
    assert run.results[1][0]
    assert not run.results[2][0]  # a tuple is not a list, even with equal items
    assert run.problem == ""
