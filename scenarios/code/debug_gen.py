"""Generated code/debug tasks with a difficulty: ``difficulty + 1`` bugs injected at once.

``make("code/debug-v3", difficulty=d)`` draws each episode's task here instead of from the
task set: a base function (``debug_bases.json``) and ``d + 1`` of its *validated* single bugs
(the mutants :mod:`parley.scenarios.code.generate` kept in ``debug_tasks_generated.json``:
each fails at least a quarter of the input draws and cannot be undone by a table or an
output remap), at distinct sites, injected together (:func:`~parley.scenarios.code.generate.
inject`). Each bug must still show in the module: leaving any one out changes the code. The
fix is the base; the visible tests are those of the first bug's record (their expected
values are the base's); the hidden calls are drawn per episode as in v3. Drawing is pure in
the episode's generator, and needs no sandbox.

Difficulty is the number of bugs a fix must find; bases with fewer validated bugs than that
are not drawn (``d = 0``: 51 bases; :data:`MAX_DIFFICULTY` keeps at least 10).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Sequence
from functools import cache

import numpy as np

from parley.scenarios.code.generate import Base, bases, inject, mutants, sites
from parley.scenarios.code.task_set import DrawnTask, generated_tasks
from parley.scenarios.difficulty import check_difficulty

__all__ = ["MAX_DIFFICULTY", "draw_generated", "pools"]

MAX_DIFFICULTY = 3
"""Four bugs at once."""
_TRIES = 20
"""Draws of bug sets per task before the next base (a set whose bugs overlap is redrawn)."""


@cache
def pools() -> tuple[tuple[Base, tuple[tuple[int, DrawnTask], ...]], ...]:
    """Per base (in file order), its validated bugs: (site number, the task record)."""
    validated: dict[str, list[DrawnTask]] = {}
    for task in generated_tasks():
        validated.setdefault(task.function, []).append(task)
    out = []
    for base in bases():
        by_code = {m.code: m.site for m in mutants(base.source)}
        found = tuple(
            (by_code[t.buggy], t) for t in validated.get(base.name, ()) if t.buggy in by_code
        )
        if found:
            out.append((base, found))
    return tuple(out)


def _distinct_nodes(source: str, chosen: Sequence[int]) -> bool:
    places = sites(ast.parse(source))
    return len({places[s][0] for s in chosen}) == len(chosen)


def draw_generated(rng: np.random.Generator, difficulty: int) -> DrawnTask:
    """One task of ``difficulty + 1`` bugs in one base (module docstring)."""
    check_difficulty(difficulty, MAX_DIFFICULTY)
    count = difficulty + 1
    eligible = [(base, bugs) for base, bugs in pools() if len(bugs) >= count]
    for _ in range(len(eligible) * 2):
        base, bugs = eligible[int(rng.integers(len(eligible)))]
        for _ in range(_TRIES):
            picked = [bugs[int(i)] for i in rng.choice(len(bugs), size=count, replace=False)]
            chosen = [site for site, _ in picked]
            if not _distinct_nodes(base.source, chosen):
                continue
            code = inject(base.source, chosen)
            fewer = {
                inject(base.source, rest) for rest in itertools.combinations(chosen, count - 1)
            }
            if code in fewer:  # one bug undid or hid another: draw again
                continue
            first = picked[0][1]
            return DrawnTask(
                name=f"{base.name}.{count}bugs",  # (no sites: they would say where to look)
                description=first.description,
                buggy=code,
                fixed=first.fixed,
                visible=first.visible,
                hidden=(),
                function=base.name,
                kind="+".join(t.kind for _, t in picked),
            )
    raise RuntimeError(f"no base holds {count} compatible bugs (a bug in parley's task set)")
