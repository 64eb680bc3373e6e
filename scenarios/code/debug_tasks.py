"""The bundled tasks of ``code/debug-v0``: a buggy function, its fix, visible and hidden tests.

The task data lives in ``debug_tasks.json`` next to this module (shipped as package data): a
list of records ``{"name", "description", "buggy", "fixed", "visible", "hidden"}``, where
``visible`` and ``hidden`` are lists of ``[call, expected]`` pairs. Every record is validated
when this module is imported.

A test is ``(call, expected)``: two Python expressions; it passes when ``call`` evaluated in
the solution's namespace equals ``expected``. Every buggy version fails at least one visible
and one hidden test; every fix passes all of them (``tests/scenarios/code/test_debug.py`` checks
both in the sandbox).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

__all__ = ["TASKS", "DebugTask"]

Test = tuple[str, str]

_DATA_FILE = "debug_tasks.json"
_STRING_FIELDS = ("name", "description", "buggy", "fixed")
_TEST_FIELDS = ("visible", "hidden")
_FIELDS = _STRING_FIELDS + _TEST_FIELDS


@dataclass(frozen=True)
class DebugTask:
    name: str
    description: str
    buggy: str
    fixed: str
    visible: tuple[Test, ...]
    hidden: tuple[Test, ...]


class TaskDataError(ValueError):
    """A record in ``debug_tasks.json`` is malformed."""


def _tests(label: str, field: str, value: Any) -> tuple[Test, ...]:
    if not isinstance(value, list) or not value:
        raise TaskDataError(
            f"{label}: field {field!r} must be a non-empty list of [call, expected]"
        )
    for j, pair in enumerate(value):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        ):
            raise TaskDataError(
                f"{label}: field {field!r}[{j}] must be a [call, expected] pair of strings, "
                f"got {pair!r}"
            )
    return tuple((call, expected) for call, expected in value)


def _task(index: int, record: Any) -> DebugTask:
    if not isinstance(record, dict):
        raise TaskDataError(f"{_DATA_FILE} record {index}: must be an object, got {record!r}")
    name = record.get("name")
    label = f"{_DATA_FILE} task {name!r}"
    if not isinstance(name, str):
        label = f"{_DATA_FILE} record {index}"
    missing = [f for f in _FIELDS if f not in record]
    if missing:
        raise TaskDataError(f"{label}: missing field(s) {', '.join(map(repr, missing))}")
    unknown = sorted(set(record) - set(_FIELDS))
    if unknown:
        raise TaskDataError(f"{label}: unknown field(s) {', '.join(map(repr, unknown))}")
    for field in _STRING_FIELDS:
        if not isinstance(record[field], str) or not record[field]:
            raise TaskDataError(f"{label}: field {field!r} must be a non-empty string")
    return DebugTask(
        name=record["name"],
        description=record["description"],
        buggy=record["buggy"],
        fixed=record["fixed"],
        visible=_tests(label, "visible", record["visible"]),
        hidden=_tests(label, "hidden", record["hidden"]),
    )


def _load() -> tuple[DebugTask, ...]:
    text = files(__package__).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    records = json.loads(text)
    if not isinstance(records, list) or not records:
        raise TaskDataError(f"{_DATA_FILE}: must be a non-empty list of task records")
    tasks = tuple(_task(i, record) for i, record in enumerate(records))
    seen: set[str] = set()
    for task in tasks:
        if task.name in seen:
            raise TaskDataError(f"{_DATA_FILE} task {task.name!r}: duplicate name")
        seen.add(task.name)
    return tasks


TASKS: tuple[DebugTask, ...] = _load()
