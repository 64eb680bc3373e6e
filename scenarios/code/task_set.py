"""code/debug-v3's tasks, and the hidden tests it draws for each episode.

The task set is the bundled tasks (:mod:`parley.scenarios.code.debug_tasks`) but one, then
the generated ones (``debug_tasks_generated.json``, written by
:mod:`parley.scenarios.code.generate`: bugs injected into correct functions). Each task
names the function its hidden calls call; :func:`draw_hidden` draws those calls from the
function's input generator (:data:`parley.scenarios.code.inputs.INPUTS`) with the episode's
generator, and takes each expected value from the reference fix, run here, in the
scenario's process (the fix is this package's code, never the submission). So no two
episodes share their hidden calls, and knowing the calls of earlier episodes (the
submission sees them as its arguments) tells nothing about the next one.

Left out of v3: ``average``. Its bug shows on one input only (``average([])`` raises), so
special-casing that input *is* the fix; no draw of inputs can both catch the unfixed code
and keep a table of one input from being paid. Visible tests keep their calls, with the
fix's exact values as the expected ones (``c_to_f(100) == 212.0``, not ``212``: v3
compares type-exact).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any

import numpy as np

from parley.scenarios.code.debug_tasks import TASKS, DebugTask, TaskDataError, Test, _tests
from parley.scenarios.code.inputs import INPUTS

__all__ = ["EXCLUDED", "GENERATED_FILE", "HIDDEN_CALLS", "DrawnTask", "draw_hidden", "v3_tasks"]

HIDDEN_CALLS = 32
"""Hidden calls per episode; the ``task`` reward is 1 only when all of them pass."""
GENERATED_FILE = "debug_tasks_generated.json"
EXCLUDED = {"average": "its bug shows on one input, so a table of that input is the fix"}
"""Bundled tasks v3 leaves out, with the reason."""
_GENERATED_FIELDS = ("name", "function", "kind", "description", "buggy", "fixed", "visible")


@dataclasses.dataclass(frozen=True)
class DrawnTask(DebugTask):
    """A v3 task: ``hidden`` is empty here; :func:`draw_hidden` draws an episode's."""

    function: str
    """The function the hidden calls call (and the key of its input generator)."""
    kind: str
    """``"bundled"``, or the kind of the injected bug (:data:`generate.KINDS`)."""


@cache
def _namespace(fixed: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(fixed, "<reference fix>", "exec"), namespace)  # this package's own code
    return namespace


def oracle(fixed: str, function: str) -> Callable[..., Any]:
    """The reference fix's ``function``, compiled once per fix (trusted code only)."""
    fn = _namespace(fixed)[function]
    if not callable(fn):
        raise TaskDataError(f"the reference fix defines no function {function!r}")
    return fn  # type: ignore[no-any-return]


def expected_of(task: DrawnTask, args: tuple[Any, ...]) -> str:
    """The fix's value for ``args`` as a literal (a copy of ``args`` goes in: a fix may
    change its argument)."""
    try:
        value = oracle(task.fixed, task.function)(*copy.deepcopy(args))
    except Exception as exc:
        raise TaskDataError(
            f"task {task.name!r}: the reference fix raised {exc!r} on {args!r}, drawn by "
            f"its input generator (a bug in parley's task set: please report it)"
        ) from exc
    return repr(value)


def call_of(function: str, args: tuple[Any, ...]) -> str:
    """The call expression of ``function`` on ``args`` (plain values: ``repr`` is a literal)."""
    return f"{function}({', '.join(map(repr, args))})"


def draw_hidden(
    task: DrawnTask, rng: np.random.Generator, count: int = HIDDEN_CALLS
) -> tuple[Test, ...]:
    """``count`` fresh hidden tests of ``task``: calls drawn from its input generator with
    ``rng``, expected values from its reference fix."""
    draw = INPUTS[task.function]
    tests = []
    for _ in range(count):
        args = draw(rng)
        tests.append((call_of(task.function, args), expected_of(task, args)))
    return tuple(tests)


def _function(code: str) -> str:
    name = code.split("def ", 1)[1].split("(", 1)[0] if "def " in code else ""
    if name not in INPUTS:
        raise TaskDataError(f"no input generator for the function {name!r}")
    return name


def _bundled(task: DebugTask) -> DrawnTask:
    namespace = dict(_namespace(task.fixed))
    visible = tuple((call, repr(eval(call, namespace))) for call, _ in task.visible)
    return DrawnTask(
        name=task.name,
        description=task.description,
        buggy=task.buggy,
        fixed=task.fixed,
        visible=visible,
        hidden=(),
        function=_function(task.fixed),
        kind="bundled",
    )


def _generated(index: int, record: Any) -> DrawnTask:
    label = f"{GENERATED_FILE} record {index}"
    if not isinstance(record, dict) or sorted(record) != sorted(_GENERATED_FIELDS):
        raise TaskDataError(f"{label}: must be an object with the fields {_GENERATED_FIELDS}")
    if not all(isinstance(record[f], str) and record[f] for f in _GENERATED_FIELDS[:-1]):
        raise TaskDataError(f"{label}: every field but 'visible' must be a non-empty string")
    visible = _tests(label, "visible", record["visible"])
    if record["function"] not in INPUTS:
        raise TaskDataError(f"{label}: no input generator for {record['function']!r}")
    return DrawnTask(
        name=record["name"],
        description=record["description"],
        buggy=record["buggy"],
        fixed=record["fixed"],
        visible=visible,
        hidden=(),
        function=record["function"],
        kind=record["kind"],
    )


def generated_tasks() -> tuple[DrawnTask, ...]:
    """The generated tasks, as committed (validated on load)."""
    records = json.loads(files(__package__).joinpath(GENERATED_FILE).read_text("utf-8"))
    if not isinstance(records, list):
        raise TaskDataError(f"{GENERATED_FILE}: must be a list of task records")
    return tuple(_generated(i, record) for i, record in enumerate(records))


@cache
def v3_tasks() -> tuple[DrawnTask, ...]:
    """code/debug-v3's task set: the bundled tasks but :data:`EXCLUDED`, then the generated
    ones (loaded on first use: importing this module reads no file)."""
    tasks = tuple(_bundled(t) for t in TASKS if t.name not in EXCLUDED) + generated_tasks()
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise TaskDataError("code/debug-v3: task names must be unique")
    return tasks
