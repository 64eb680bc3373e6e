"""code/debug-v0 — fix a buggy Python function; the score is the share of hidden tests passed.

The coder gets a small function with a bug, its description and its visible tests (33 bundled
tasks, :mod:`parley.scenarios.code.debug_tasks`; v3: 373, most of them generated;
``reset(seed=...)`` draws one, ``task`` pins one). It may run code and the visible tests in the
sandbox (:mod:`parley.scenarios.tools.sandbox`: no network, no host files, CPU, memory, output and
process limits) and submits a fixed module; the hidden tests run against it in the sandbox.

Seats: ``coder``, and with ``reviewer=True`` also ``reviewer`` (collaboration: the reviewer can run
the tests and comment; only the coder submits).

Tools (both seats; results arrive in the caller's next observation):

- ``run_tests(code)`` — the visible tests against ``code`` (the whole module), one line per
  test: ``PASS call == expected`` or ``FAIL ...: returned X`` / ``raised E``;
- ``run_python(code)`` — runs ``code`` as a script; shows how it ended, stdout and stderr.

Actions, one JSON object per turn (the syntax of :mod:`parley.scenarios.tools.tool`):

- coder: ``{"tool_calls": [...], "submit": "def f(x):\\n    ..."}`` ends the episode;
  ``{"message": "..."}`` (with a reviewer) goes to the reviewer and passes the turn;
  tool calls alone keep the turn.
- reviewer: ``{"tool_calls": [...], "comment": "..."}``; the comment goes to the coder and
  passes the turn back; tool calls alone keep the turn.

An object with none of these keys, or not JSON, is an invalid move. After ``max_steps`` actions
without a submission the episode ends with reward 0.

Observations: the task (description, buggy code, visible tests) first, then tool results and the
other seat's messages. ``infos[seat]["view"]``: ``name``, ``description``, ``code`` (the buggy
module), ``visible`` (``[call, expected]`` pairs), ``reviewer`` (bool), ``last_message``,
``tools``, ``tool_results``, ``hidden_problem`` (empty, or after the submission why the hidden
tests gave no or partial results); ``infos[seat]["constraint"]`` is a ``json`` constraint for
structured output (the tool-call form or the seat's final form). Scripted oracles get the fix
through the privileged ``oracle`` hook (``{"fixed": ...}``), which the runner gives only to
in-process agents marked ``privileged``.

What "hidden" means: the hidden tests and the fix are in no observation, view or tool result; only
the hidden calls enter the sandbox of the submission's run (its output is never shown: code that
prints them is not heard). They are not secret from a policy that can read the installed package:
the task table (:mod:`parley.scenarios.code.debug_tasks`) ships with it, and the view's ``name``
and buggy ``code`` identify the task as surely as an index would. Scores are honest for agents that
see only their observations; for secrecy against code with access to the host, evaluate with a
held-out task file that is not installed where the policy runs.

Each sandbox run (a tool call, the hidden tests) takes about 0.1-0.2 s inside ``step``. The tool
calls of one step share a wall-time budget of ``step_budget_s`` (4 s) of the runs' own time
(waiting for a CPU on a loaded host is not charged; see the sandbox): each call runs with a wall
limit of what is left (at most 8 s), and a call made after the budget is spent returns the error
``this turn's sandbox time budget (4 s) is spent`` without running; the next step has a fresh
budget. The hidden-test run at submission keeps its own 8 s limit, so one ``step`` takes at most
about ``step_budget_s`` + 8 s (``max_step_wall_s``) on an idle host (up to 5x that where its runs
wait for a CPU). Because ``step`` waits on subprocesses, the class sets ``metadata["blocking_step"]
= True``. A sandbox failure (:class:`~parley.scenarios.tools.SandboxError`) in a tool call is that
call's error; at submission it means no results: score 0, the reason in ``view``'s
``hidden_problem`` and the metric ``sandbox_failed`` 1 (in the weak mode the code itself can end
the sandbox without a report, so this is not an infrastructure error of the episode).

Rewards (both seats, on submission or at the step limit):

=========  ===================================================================
component  value
=========  ===================================================================
task       fraction of the hidden tests the submission passes (0 without one); v2: the
           improvement over the unfixed code's fraction; v3: 1 when every one of the
           episode's 32 hidden calls passes, else 0 (see the version history)
invalid    -``invalid_penalty`` (0.05) per invalid move
=========  ===================================================================

Metrics: ``success`` (all hidden tests pass), ``hidden_pass_rate``, ``submitted``, ``tool_calls``,
``sandbox_failed`` (the hidden-test run failed in the sandbox itself).

The score depends only on what the submitted functions return
(:mod:`parley.scenarios.code.harness`): the sandbox gets the submission and the test calls, never
an expected value, the fix or a secret; it sends back each call's result as bounded plain data
(``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple``, ``set``, ``dict``) or the
error it raised, and this process rebuilds those values and compares them with ``==`` to the
expected ones. Whatever the code does to the harness in its own process (forged lines, patched
builtins, exits, hostile objects) can at best claim results that an honest function could have
returned; malformed, missing or extra results score 0 for their tests and never raise out of
``step`` (``tests/scenarios/code/test_debug_reward_hacking.py``: 14 exploit families).

Arguments: ``task`` (None: drawn by the seed), ``reviewer`` (False), ``max_steps`` (12),
``invalid_penalty``, ``max_cycles``, ``render_mode``, ``allow_weak_sandbox`` (False: refuse to run
where the sandbox has no namespace isolation; also set by ``PARLEY_SANDBOX_ALLOW_WEAK=1``),
``step_budget_s`` (4.0: wall seconds of sandbox time for the tool calls of one step); v3 only:
``difficulty`` (None; 0-3: each seed draws a generated task of ``difficulty + 1`` validated bugs
injected together into one of the 50 bases, :mod:`parley.scenarios.code.debug_gen`; metrics then
include ``difficulty``).

    >>> env = make("code/debug-v0", reviewer=True)

Version history: v0 — first version. The judge moved out of the sandbox (issue 10) without a
version bump: a submission whose functions return plain values passes exactly the tests it passed
before (same calls, 1 s per call, limits, ``==``); ``run_tests`` shows a non-plain result as
``returned a T, not a plain built-in value``; a result encoding over 1,500 characters fails, and
the results line (up to ~6 KB) shares the 20,000-byte stdout cap with the code's prints.
v1 — a move the action space refuses uses up the seat's turn (:mod:`parley.scenarios.refusals`).
v2 — the ``task`` reward is the improvement over the unfixed code: ``max(0, (pass - pass_buggy) /
(1 - pass_buggy))``, ``pass_buggy`` the hidden pass rate of the task's buggy module (measured in
the sandbox once per task and process; the metric ``buggy_pass_rate``). Submitting the code
unchanged had paid 0.45 on average over the 33 tasks, a constant 0.36; ``quote_messages`` is on.
v3 — hidden tests drawn per episode, compared type-exact, paid all or nothing (issue 29). v2's four
hidden calls were the same in every episode, so the unfixed code with a learned answer per call
was paid like a fix (0.43 on average, 1.0 on 9 of 33 tasks), and ``True == 1`` passed. Each v3
episode draws 32 calls from the function's input generator (:mod:`parley.scenarios.code.inputs`,
seeded by ``reset``), expected values from the reference fix run in the scenario's process
(:mod:`parley.scenarios.code.task_set`); results compare type-exact
(:func:`~parley.scenarios.code.harness.same_value`: ``True`` is not ``1``, ``5.0`` is not ``5``;
floats within 1e-9); ``task`` is 1 only when all 32 pass. Tasks: the bundled ones but ``average``
(its bug is one input), visible tests with the fix's exact values (``c_to_f(100) == 212.0``), 341
generated by bug injection (:mod:`parley.scenarios.code.generate`): 373. Programs a learning policy
would settle on without implementing the function earn at most 0.025 in expectation. The
brief's code and tests show as ``| code`` and ``- call == expected`` lines; a line of a scenario
notice or tool result that starts with white space or a seat's name gets ``| `` before it (a
quoted message line can no longer equal a brief line, as in v2). Hidden output cap: 64,000 bytes.
Without a version bump (all versions): the per-step tool budget (a 4-8 s script times out at 4 s),
``sandbox_failed``, ``hidden_problem``, a sandbox failure at submission scoring 0, not raising.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario, printable
from parley.scenarios.code.debug_gen import MAX_DIFFICULTY, draw_generated
from parley.scenarios.code.debug_tasks import TASKS, DebugTask
from parley.scenarios.code.harness import hidden_pass_rate, run_tests
from parley.scenarios.code.task_set import DrawnTask, draw_hidden, v3_tasks
from parley.scenarios.difficulty import check_difficulty
from parley.scenarios.refusals import RefusedMoveTakesTurn
from parley.scenarios.registry import registered
from parley.scenarios.tools.sandbox import Sandbox, SandboxError, SandboxLimits
from parley.scenarios.tools.tool import (
    ToolBox,
    ToolFailure,
    action_constraint,
    ascii_text,
    parse_turn,
    render_result,
    result_dicts,
    tool,
)

log = logging.getLogger(__name__)

__all__ = ["CodeDebugV0", "CodeDebugV1", "CodeDebugV2", "CodeDebugV3"]

T = TypeVar("T")

HIDDEN_WALL_SECONDS = 8.0
"""Wall limit of the hidden-test run at submission (outside the per-step tool budget)."""


@dataclasses.dataclass
class DebugState:
    task: DebugTask
    index: int
    speaker: str = "coder"
    steps: int = 0
    submitted: bool = False
    hidden_passed: float = 0.0
    ended: bool = False
    tool_calls: int = 0
    hidden_problem: str = ""
    sandbox_failed: bool = False
    last_message: dict[str, str] = dataclasses.field(default_factory=dict)
    last_results: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)


_SCRIPTED = "parley.agents.scripted.code"
_BASELINES = {"coder": f"{_SCRIPTED}:DebugOracle", "reviewer": f"{_SCRIPTED}:DebugReviewer"}
_ABOUT = (
    "Fix a buggy Python function with a sandboxed test runner; reward = "
    "share of hidden tests passed. Optional reviewer seat."
)


@registered(baselines=_BASELINES, description=_ABOUT)
class CodeDebugV0(Scenario):
    """Fix a buggy function, scored by hidden tests in the sandbox; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "code/debug-v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
        "blocking_step": True,
    }
    max_action_length = 6000
    default_invalid_penalty = 0.05
    max_output_bytes: ClassVar[int] = 20_000
    """The sandbox's stdout cap (the hidden run's results line shares it with the code's prints)."""
    strict: ClassVar[bool] = False
    """Compare results type-exact (:func:`~parley.scenarios.code.harness.same_value`)."""
    case: DebugState

    @classmethod
    def task_list(cls) -> tuple[DebugTask, ...]:
        """The tasks this version draws from (``task`` indexes them)."""
        return TASKS

    def __init__(
        self,
        task: int | None = None,
        reviewer: bool = False,
        max_steps: int = 12,
        *,
        allow_weak_sandbox: bool = False,
        step_budget_s: float = 4.0,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        seats = ["coder", "reviewer"] if reviewer else ["coder"]
        super().__init__(
            seats, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        count = len(self.task_list())
        if task is not None and not 0 <= task < count:
            raise ConfigError(f"task must be in 0..{count - 1}, got {task}")
        if max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {max_steps}")
        if not 0 < step_budget_s <= 600:
            raise ConfigError(f"step_budget_s must be in (0, 600], got {step_budget_s}")
        self.fixed_task, self.has_reviewer, self.max_steps = task, reviewer, max_steps
        self.step_budget_s = float(step_budget_s)
        self._budget_left = self.step_budget_s
        self._weak = allow_weak_sandbox or os.environ.get("PARLEY_SANDBOX_ALLOW_WEAK") == "1"
        limits = SandboxLimits(
            cpu_seconds=3, wall_seconds=HIDDEN_WALL_SECONDS, max_output_bytes=self.max_output_bytes
        )
        self.sandbox = Sandbox(limits, allow_weak=self._weak)
        self.tools = ToolBox([tool(self.run_tests), tool(self.run_python)])
        text = {"type": "string"}
        coder = {"submit": text, "message": text} if reviewer else {"submit": text}
        self._constraints = {
            "coder": action_constraint(self.tools, coder),
            "reviewer": action_constraint(self.tools, {"comment": text}),
        }

    @property
    def max_step_wall_s(self) -> float:
        """Most wall time one ``step`` can take: the tool budget, the hidden-test run, slack."""
        return self.step_budget_s + HIDDEN_WALL_SECONDS + 2.0

    # --- tools -----------------------------------------------------------------------------

    def _sandboxed(self, run: Callable[[Sandbox], T]) -> T:
        """Run a tool's sandbox work within what is left of this step's time budget."""
        left = self._budget_left
        if left < 0.05:
            raise ToolFailure(
                f"this turn's sandbox time budget ({self.step_budget_s:g} s) is spent; "
                "call again next turn"
            )
        wall = min(self.sandbox.limits.wall_seconds, left)
        sandbox = Sandbox(
            dataclasses.replace(self.sandbox.limits, wall_seconds=wall), allow_weak=self._weak
        )
        start = time.monotonic()
        try:
            return run(sandbox)
        except SandboxError as exc:
            # Reported to the caller as a tool error, deliberately: in the weak mode the code
            # itself can end the sandbox without a report (it can kill its supervisor), so the
            # failure may be the caller's doing and must not end the episode as an
            # infrastructure error; a host failure also shows up in every later run, including
            # the hidden tests (see _end), where it is recorded in the metrics.
            raise ToolFailure(f"the sandbox failed: {str(exc)[:300]}") from exc
        finally:
            # The budget is the runs' own time: waiting for a CPU on a loaded host is not
            # charged, so load does not refuse calls an idle machine would run.
            self._budget_left -= time.monotonic() - start - sandbox.queued_seconds

    def run_tests(self, code: str) -> str:
        """Run the visible tests against a version of the module (the whole file).

        Args:
            code: the full Python module to test
        """
        visible = self.case.task.visible
        run = self._sandboxed(lambda sandbox: run_tests(sandbox, code, visible, strict=self.strict))
        lines = [f"{run.passed}/{len(run.results)} visible tests passed"]
        if run.problem:
            lines.append(run.problem)
        for (call, expected), (ok, detail) in zip(self.case.task.visible, run.results, strict=True):
            lines.append(
                f"PASS {call} == {expected}" if ok else f"FAIL {call} == {expected}: {detail}"
            )
        return "\n".join(lines)

    def run_python(self, code: str) -> str:
        """Run a Python script in the sandbox; shows how it ended, its stdout and stderr.

        Args:
            code: the script
        """
        run = self._sandboxed(lambda sandbox: sandbox.run(code))
        status = (
            f"exit code {run.exit_code}" if run.ended_by == "exit" else f"ended by {run.ended_by}"
        )
        return f"{status}\nstdout:\n{run.stdout[-1500:]}\nstderr:\n{run.stderr[-1500:]}"

    # --- the scenario ----------------------------------------------------------------------

    def new_episode(self, rng: np.random.Generator) -> None:
        task, index = self.draw_task(rng)
        self.case = DebugState(self.episode_task(task, rng), index)
        self._budget_left = self.step_budget_s
        for agent in self.possible_agents:
            self.tell(agent, self.brief_text(self.case.task))

    def draw_task(self, rng: np.random.Generator) -> tuple[DebugTask, int]:
        """The episode's task and its index in :meth:`task_list` (-1: generated)."""
        tasks = self.task_list()
        index = self.fixed_task if self.fixed_task is not None else int(rng.integers(len(tasks)))
        return tasks[index], index

    def episode_task(self, task: DebugTask, rng: np.random.Generator) -> DebugTask:
        """The task as this episode plays it (v3 draws its hidden tests here)."""
        return task

    def brief_text(self, task: DebugTask) -> str:
        """The first observation: the task, the buggy module, the visible tests, the tools."""
        tests = "\n".join(f"  {call} == {expected}" for call, expected in task.visible)
        return (
            f"Task: {task.description}\nThe current module (it has a bug):\n{task.buggy}"
            f"Visible tests:\n{tests}\nTools:\n{self.tools.describe()}"
        )

    def acting(self) -> list[str]:
        return [self.case.speaker]

    def play(self, seat: str, action: str) -> str | None:
        self.case.steps += 1
        self._budget_left = self.step_budget_s
        reason = self._play(seat, action)
        if not self.case.ended and self.case.steps >= self.max_steps:
            self.announce("Step limit reached without a submission.")
            self._end(None)
        return reason

    def _play(self, seat: str, action: str) -> str | None:
        parsed = parse_turn(action, turn=self.turn)
        self.case.last_results[seat] = []
        if isinstance(parsed, str):
            return parsed
        keys = {"coder": ("submit", "message"), "reviewer": ("comment",)}[seat]
        if not self.has_reviewer:
            keys = ("submit",)
        unknown = set(parsed.fields) - set(keys)
        if unknown or not (parsed.calls or parsed.fields):
            return f"use tool_calls and/or {' / '.join(keys)} (string values)"
        results = [self.tools.call(call) for call in parsed.calls]
        self.case.tool_calls += len(results)
        self.case.last_results[seat] = result_dicts(results)
        for result in results:
            self.tell(seat, self.scenario_text(ascii_text(render_result(result))))
        text = next((parsed.fields[k] for k in keys if k in parsed.fields), None)
        if text is None:
            return None
        if not isinstance(text, str):
            return f"{' / '.join(keys)} must be a string"
        if "submit" in parsed.fields:
            self._end(text)
        else:
            other = "reviewer" if seat == "coder" else "coder"
            self.say(seat, ascii_text(text, limit=4000))
            self.case.last_message[other] = text
            self.case.speaker = other
        return None

    def _end(self, code: str | None) -> None:
        self.case.ended = True
        if code is not None:
            self.case.submitted = True
            try:
                run = run_tests(
                    self.sandbox, code, self.case.task.hidden, hidden=True, strict=self.strict
                )
            except SandboxError as exc:
                # In the weak mode the submission can end the sandbox without a report (it
                # can kill its supervisor): no results, score 0. The reason goes to the log,
                # not the view: it can quote what the code printed (the hidden calls).
                self.case.sandbox_failed = True
                self.case.hidden_problem = "the sandbox failed (the reason is in the log)"
                log.warning("%s: the hidden tests' sandbox failed: %s", self.case.task.name, exc)
            else:
                self.case.hidden_passed = run.passed / len(run.results)
                self.case.hidden_problem = run.problem[:300]
        task_reward = self._task_reward()
        for agent in self.possible_agents:
            self.reward(agent, "task", task_reward)
        self.announce(f"Hidden tests passed: {self.case.hidden_passed:.0%}.")
        self.finish()

    def _task_reward(self) -> float:
        """The ``task`` reward of the submission (v0, v1: its hidden pass rate)."""
        return self.case.hidden_passed

    def scenario_text(self, text: str) -> str:
        """A scenario notice as shown (v3 marks its lines apart from the seats')."""
        return text

    def prompt(self, seat: str) -> str:
        if seat == "reviewer":
            return 'Your move: {"tool_calls": [...], "comment": "..."} (JSON).'
        finals = '"submit": "<module>"' + (' or "message": "..."' if self.has_reviewer else "")
        return f'Your move: {{"tool_calls": [...]}} and/or {{{finals}}} (JSON).'

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return dict(self._constraints[seat])

    def view(self, seat: str) -> dict[str, Any]:
        task = self.case.task
        return {
            "name": task.name,
            "description": task.description,
            "code": task.buggy,
            "visible": [list(t) for t in task.visible],
            "reviewer": self.has_reviewer,
            "last_message": printable(self.case.last_message.get(seat, "")),
            "tools": self.tools.specs(),
            "tool_results": self.case.last_results.get(seat, []),
            "hidden_problem": printable(self.case.hidden_problem),
        }

    def oracle(self, seat: str) -> dict[str, Any]:
        """Privileged (see :meth:`Scenario.oracle`): the reference fix, for the coder."""
        return {"fixed": self.case.task.fixed} if seat == "coder" else {}

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """The hidden tests, the fix and the task's index (both seats see the same task)."""
        index = (self.case.index + 1 + int(rng.integers(len(TASKS) - 1))) % len(TASKS)
        other = TASKS[index]
        self.case.task = dataclasses.replace(self.case.task, fixed=other.fixed, hidden=other.hidden)
        self.case.index = index
        return True

    def system_prompt(self, seat: str) -> str:
        common = (
            "Tools run Python in a sandbox (no network, no files outside its directory). Each "
            "turn reply with one JSON object. Tool calls: "
            '{"tool_calls": [{"name": "run_tests", "arguments": {"code": "..."}}]}; results '
            "arrive next turn.\nTools:\n" + str(self.tools.describe())
        )
        if seat == "reviewer":
            return (
                "You review a coder's fix of a buggy Python function. Run the tests, then "
                'send a comment with {"comment": "..."}. The coder decides what to submit. '
                + common
            )
        ask = ' You may send your draft to a reviewer with {"message": "..."}.'
        return (
            "You fix a bug in a small Python module. Submit the whole fixed module with "
            '{"submit": "<module source>"}; hidden tests decide your score.'
            + (ask if self.has_reviewer else "")
            + " "
            + common
        )

    def snapshot(self) -> Any:
        return {"task": self.case.index, "steps": self.case.steps, "ended": self.case.ended}

    def metrics(self) -> dict[str, float]:
        if not self.case.ended:
            return {}
        return {
            "success": float(self.case.hidden_passed == 1.0),
            "hidden_pass_rate": self.case.hidden_passed,
            "submitted": float(self.case.submitted),
            "tool_calls": float(self.case.tool_calls),
            "sandbox_failed": float(self.case.sandbox_failed),
        }


@registered(baselines=_BASELINES, description=_ABOUT + " v1: a refused move uses up the turn.")
class CodeDebugV1(RefusedMoveTakesTurn, CodeDebugV0):
    """v1: a move the action space refuses uses up the turn (:mod:`parley.scenarios.refusals`)."""

    metadata: ClassVar[dict[str, Any]] = {**CodeDebugV0.metadata, "name": "code/debug-v1"}


@registered(
    baselines=_BASELINES,
    description="code/debug-v1 whose reward is the improvement over the unfixed code's "
    "share of hidden tests (submitting it unchanged paid 0.45 on average).",
)
class CodeDebugV2(CodeDebugV1):
    """v2: the ``task`` reward is the improvement over the unfixed code's hidden pass rate."""

    metadata: ClassVar[dict[str, Any]] = {**CodeDebugV0.metadata, "name": "code/debug-v2"}
    quote_messages = True

    def _task_reward(self) -> float:
        base = self._buggy_passed()
        if base >= 1.0:  # (no task is like this; a replaced task table might be)
            return self.case.hidden_passed
        return max(0.0, (self.case.hidden_passed - base) / (1.0 - base))

    def _buggy_passed(self) -> float:
        """The unfixed code's hidden pass rate (once per task and process)."""
        task = self.case.task
        try:
            return hidden_pass_rate(self.sandbox, task.name, task.buggy, task.hidden)
        except SandboxError as exc:  # unknown: the plain pass rate, as in v1
            log.warning("%s: the unfixed code's run failed: %s", task.name, exc)
            return 0.0

    def metrics(self) -> dict[str, float]:
        metrics = super().metrics()
        if metrics:
            metrics["buggy_pass_rate"] = self._buggy_passed()
        return metrics


@registered(
    baselines=_BASELINES,
    description="code/debug with 373 tasks (341 generated by bug injection), 32 hidden "
    "calls drawn per episode, type-exact; reward 1 only when all pass.",
)
class CodeDebugV3(CodeDebugV1):
    """v3: fresh hidden calls per episode, type-exact, paid only when every one passes."""

    metadata: ClassVar[dict[str, Any]] = {**CodeDebugV0.metadata, "name": "code/debug-v3"}
    quote_messages = True
    strict = True
    max_output_bytes = 64_000  # 32 results of up to 1,500 characters each

    def __init__(
        self,
        task: int | None = None,
        reviewer: bool = False,
        max_steps: int = 12,
        *,
        difficulty: int | None = None,
        **kwargs: Any,
    ) -> None:
        check_difficulty(difficulty, MAX_DIFFICULTY)
        if difficulty is not None and task is not None:
            raise ConfigError("task pins one of the task set; drop it to draw generated tasks")
        super().__init__(task, reviewer, max_steps, **kwargs)
        self.difficulty = difficulty

    @classmethod
    def task_list(cls) -> tuple[DebugTask, ...]:
        return v3_tasks()

    def draw_task(self, rng: np.random.Generator) -> tuple[DebugTask, int]:
        if self.difficulty is None:
            return super().draw_task(rng)
        return draw_generated(rng, self.difficulty), -1  # (debug_gen: difficulty + 1 bugs)

    def episode_task(self, task: DebugTask, rng: np.random.Generator) -> DebugTask:
        assert isinstance(task, DrawnTask)  # (v3_tasks holds only these)
        return dataclasses.replace(task, hidden=draw_hidden(task, rng))

    def brief_text(self, task: DebugTask) -> str:
        code = "\n".join(f"| {line}" for line in task.buggy.rstrip("\n").split("\n"))
        tests = "\n".join(f"- {call} == {expected}" for call, expected in task.visible)
        return self.scenario_text(
            f"Task: {task.description}\nThe current module (it has a bug):\n{code}\n"
            f"Visible tests:\n{tests}\nTools:\n{self.tools.describe()}"
        )

    def scenario_text(self, text: str) -> str:
        """``text`` with ``| `` before each line that could pass for a seat's: one that
        starts with white space (a quoted message's lines do) or with a seat's name."""
        seats = tuple(f"{a}{end}" for a in self.possible_agents for end in (":", " ("))
        return "\n".join(
            f"| {line}" if line[:1].isspace() or line.startswith(seats) else line
            for line in text.split("\n")
        )

    def _task_reward(self) -> float:
        return 1.0 if self.case.hidden_passed == 1.0 else 0.0

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """The hidden calls, drawn again (the fix is that of the task both seats see)."""
        task = self.case.task if self.case.index < 0 else self.task_list()[self.case.index]
        self.case.task = self.episode_task(task, rng)
        return True

    def metrics(self) -> dict[str, float]:
        figures = super().metrics()
        if figures and self.difficulty is not None:  # (absent by default, as pinned)
            figures["difficulty"] = float(self.difficulty)
        return figures


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
CodeDebug = CodeDebugV0
