"""The generator of code/debug-v3's task set: bugs injected into correct functions.

Each base (``debug_bases.json``: a correct function and its description; its input
generator is in :data:`parley.scenarios.code.inputs.INPUTS`) is parsed, and every site
where one of four kinds of bug can go is mutated, one mutant per site and variant:

==============  ===================================================================
off_by_one      an integer constant ±1; a ``range`` argument or a slice bound ±1
wrong_operator  ``+ - * // %`` swapped; ``== !=``, ``< >``, ``<= >=``, ``in``/``not in``
                flipped; ``and``/``or`` swapped
wrong_boundary  ``<`` and ``<=`` (``>`` and ``>=``) swapped
missing_case    an ``if`` without ``else`` removed; an ``if``/``else`` reduced to its
                ``else``; one operand of an ``and``/``or`` dropped
==============  ===================================================================

Every mutant is then run with the code/debug harness (:func:`~parley.scenarios.code.
harness.run_tests`, type-exact) in the sandbox on draws from the base's input generator,
the expected values from the correct function, and kept only when:

- no call runs into the harness's 1 s limit (mutants that hang are no task);
- it fails at least :data:`MIN_FAIL_RATE` of the draws: a bug that shows this often
  makes the unfixed code pass all 32 calls of an episode with probability below 0.001;
- the unfixed code with the :data:`TABLE` likeliest inputs of the draws answered right,
  and each of its outputs remapped to the best of :data:`TRIVIAL` (or kept), passes an
  episode with probability at most :data:`MAX_OVERRIDE_REWARD`: a bug that lives on a few
  inputs is fixed by a table of them, and one whose output a fixed remap undoes (a count
  started at -1, ``-2`` returned for ``-1``, an ``IndexError`` where the answer is
  ``True``) by a patch over the output; either would be paid as a fix;
- it behaves unlike every mutant kept before it from the same base (on every draw).

Visible tests: the first three draws of a separate stream, and, when the mutant passes all
three, the shortest draw it fails. Everything is seeded (``seed``, the base's index), so the
same code gives the same file: ``python -m parley.scenarios.code.generate`` rewrites
``debug_tasks_generated.json`` (a test regenerates it and compares). Many modules are
checked in one sandbox run: each is renamed (:func:`bundle`) into one module, so the
harness's one-run-per-submission cost is paid once per base.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from parley.scenarios.code.harness import run_tests, same_value
from parley.scenarios.code.inputs import INPUTS
from parley.scenarios.code.task_set import (
    GENERATED_FILE,
    HIDDEN_CALLS,
    DrawnTask,
    call_of,
    expected_of,
)
from parley.scenarios.tools.sandbox import Sandbox, SandboxLimits

__all__ = [
    "KINDS",
    "Base",
    "Entry",
    "Mutant",
    "bases",
    "bundle",
    "generate",
    "inject",
    "mutants",
    "run_bundle",
    "sites",
]

KINDS = ("off_by_one", "wrong_operator", "wrong_boundary", "missing_case")
DRAWS = 120
"""Draws per base on which each mutant is judged."""
SCREEN = 4
"""Draws of the first pass, which drops the mutants that hang before the long run."""
MIN_FAIL_RATE = 0.25
TABLE = 32
MAX_OVERRIDE_REWARD = 0.01
TRIVIAL: tuple[Any, ...] = (
    0, 1, -1, 2, True, False, None, "", "a", " ", "0", 0.0, 1.0, 0.5, [], (), {}, set(), [0], [[]],
)  # fmt: skip
"""Trivial values a policy tries first (the override and constant attacks use them)."""
BUNDLE_LIMITS = SandboxLimits(
    cpu_seconds=300, wall_seconds=600, memory_mb=512, max_output_bytes=32_000_000
)
"""Limits of one bundled run (many modules, thousands of calls; this package's code only)."""

_BOUNDARY: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_OPERATOR: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mod,
    ast.Mod: ast.FloorDiv, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.Gt, ast.Gt: ast.Lt,
    ast.LtE: ast.GtE, ast.GtE: ast.LtE, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.And: ast.Or, ast.Or: ast.And,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Base:
    """A correct function to inject bugs into."""

    name: str
    description: str
    source: str


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One injected bug: its kind, its site (index in the enumeration), the buggy module."""

    kind: str
    site: int
    code: str


def bases() -> tuple[Base, ...]:
    """The bases, from ``debug_bases.json``."""
    records = json.loads(files(__package__).joinpath("debug_bases.json").read_text("utf-8"))
    return tuple(Base(r["name"], r["description"], r["source"]) for r in records)


Edit = Callable[[ast.AST], None]


def _plus(node: ast.expr, delta: int) -> ast.expr:
    op = ast.Add() if delta > 0 else ast.Sub()
    return ast.BinOp(left=node, op=op, right=ast.Constant(1))


def _set(field: str, make: Callable[[Any], Any]) -> Edit:
    return lambda node: setattr(node, field, make(getattr(node, field)))


def _statement_edits(node: ast.AST) -> Iterator[tuple[str, Edit]]:
    """Missing cases in ``node``'s statement lists: an ``if`` removed or cut to its else."""
    for field in ("body", "orelse"):
        stmts = getattr(node, field, None)
        for at, stmt in enumerate(stmts if isinstance(stmts, list) else []):
            if not isinstance(stmt, ast.If):
                continue

            def edit(parent: ast.AST, field: str = field, at: int = at) -> None:
                stmts = getattr(parent, field)
                rest = stmts[at].orelse
                stmts[at : at + 1] = rest
                if not stmts:
                    stmts.append(ast.Pass())

            yield "missing_case", edit


def _ops(new: type) -> Callable[[Any], Any]:
    return lambda _: [new()]


def _swapped(op: Any) -> Any:
    return _OPERATOR[type(op)]()


def _without(drop: int) -> Callable[[list[Any]], list[Any]]:
    return lambda values: values[:drop] + values[drop + 1 :]


def _shifted(delta: int) -> Callable[[int], int]:
    return lambda value: value + delta


def _bound_shifted(delta: int) -> Callable[[ast.expr], ast.expr]:
    return lambda bound: _plus(bound, delta)


def _arg_shifted(at: int, delta: int) -> Callable[[list[ast.expr]], list[ast.expr]]:
    return lambda args: [*args[:at], _plus(args[at], delta), *args[at + 1 :]]


def _edits(node: ast.AST) -> Iterator[tuple[str, Edit]]:
    """Every bug that can go at ``node`` (kind, in-place edit of a copy of the node)."""
    yield from _statement_edits(node)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        op = type(node.ops[0])
        for kind, table in (("wrong_boundary", _BOUNDARY), ("wrong_operator", _OPERATOR)):
            if op in table:
                yield kind, _set("ops", _ops(table[op]))
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _OPERATOR:
        yield "wrong_operator", _set("op", _swapped)
    elif isinstance(node, ast.BoolOp):
        yield "wrong_operator", _set("op", _swapped)
        for drop in range(len(node.values)):
            yield "missing_case", _set("values", _without(drop))
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            yield "off_by_one", _set("value", _shifted(delta))
    elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "range":
        for at, arg in enumerate(node.args):
            if not isinstance(arg, ast.Constant):
                for delta in (1, -1):
                    yield "off_by_one", _set("args", _arg_shifted(at, delta))
    elif isinstance(node, ast.Slice):
        for field in ("lower", "upper"):
            bound = getattr(node, field)
            if bound is not None and not isinstance(bound, ast.Constant):
                for delta in (1, -1):
                    yield "off_by_one", _set(field, _bound_shifted(delta))


def sites(tree: ast.AST) -> list[tuple[int, str, Edit]]:
    """Every place a bug can go in ``tree``: (node index in ``ast.walk`` order, kind, edit)."""
    return [(i, kind, edit) for i, node in enumerate(ast.walk(tree)) for kind, edit in _edits(node)]


def inject(source: str, chosen: Sequence[int]) -> str:
    """``source`` with the bugs of the :func:`sites` numbered ``chosen`` all injected (at
    distinct nodes: each edit finds its node as the unmutated tree had it), unparsed as
    :func:`mutants` writes its modules."""
    tree = ast.parse(source)
    places = sites(tree)
    nodes = list(ast.walk(tree))  # before any edit: one edit may move another's node
    for site in chosen:
        index, _kind, edit = places[site]
        edit(nodes[index])
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def mutants(source: str) -> list[Mutant]:
    """Every single-site bug of ``source`` (deduplicated, in a fixed order), unparsed in the
    same style as :func:`normalized` ``(source)``."""
    tree = ast.parse(source)
    fixed = ast.unparse(tree)
    out: list[Mutant] = []
    seen = {fixed}
    for site, (_index, kind, _edit) in enumerate(sites(tree)):
        code = inject(source, [site])
        if code not in seen:
            seen.add(code)
            out.append(Mutant(kind, site, code))
    return out


def normalized(source: str) -> str:
    """``source`` as :func:`mutants` writes its modules (``ast.unparse``)."""
    return ast.unparse(ast.parse(source)) + "\n"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One module of a bundled run: its ``function`` called on each test's arguments."""

    key: str
    """Unique in the run (letters, digits, ``_``): the function runs as ``function__key``."""
    function: str
    code: str
    tests: Sequence[tuple[tuple[Any, ...], str]]
    """``(arguments, expected literal)`` pairs."""
    calls: Sequence[tuple[str, str]] = ()
    """More tests as ``(call expression, expected literal)`` (a task's visible tests); each
    call starts with ``function(``. Their results follow those of ``tests``."""

    def all_tests(self) -> list[tuple[str, str]]:
        """Every test as ``(call, expected)``, the function renamed as in :func:`bundle`."""
        renamed = f"{self.function}__{self.key}"
        prefix = f"{self.function}("
        if not all(call.startswith(prefix) for call, _ in self.calls):
            raise ValueError(f"every call of entry {self.key} must start with {prefix!r}")
        return [(call_of(renamed, args), want) for args, want in self.tests] + [
            (renamed + call[len(self.function) :], want) for call, want in self.calls
        ]


def bundle(entries: Sequence[Entry]) -> str:
    """One module holding each entry's ``function`` as ``function__key`` (recursive calls
    renamed too), so that one harness run can call them all."""
    parts = []
    for entry in entries:
        tree = ast.parse(entry.code)
        renamed = f"{entry.function}__{entry.key}"
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == entry.function:
                node.name = renamed
            elif isinstance(node, ast.Name) and node.id == entry.function:
                node.id = renamed
        parts.append(ast.unparse(tree))
    return "\n\n".join(parts) + "\n"


def run_bundle(sandbox: Sandbox, entries: Sequence[Entry]) -> dict[str, list[tuple[bool, str]]]:
    """Each entry's ``(passed, detail)`` per test: one harness run (:func:`run_tests`,
    type-exact) for them all. For this package's code: the modules share one process."""
    per_entry = [entry.all_tests() for entry in entries]
    tests = [test for entry_tests in per_entry for test in entry_tests]
    run = run_tests(sandbox, bundle(entries), tests, strict=True)
    if run.problem:
        raise RuntimeError(f"a bundled run failed: {run.problem}")
    out, at = {}, 0
    for entry, entry_tests in zip(entries, per_entry, strict=True):
        out[entry.key] = list(run.results[at : at + len(entry_tests)])
        at += len(entry_tests)
    return out


def _hangs(results: Sequence[tuple[bool, str]]) -> bool:
    return any("took longer than" in detail for _, detail in results)


def remapped(results: Sequence[tuple[bool, str]], expected: Sequence[Any]) -> list[bool]:
    """Which calls pass when the unfixed code's outputs are remapped: for each output it
    gives (``results``' details), the one of :data:`TRIVIAL` (or the output itself) that is
    right on the most calls giving it, chosen on these very calls."""
    groups: dict[str, list[int]] = {}
    for k, (_, detail) in enumerate(results):
        groups.setdefault(detail, []).append(k)
    passed = [False] * len(results)
    for members in groups.values():
        options = [[results[k][0] for k in members]]
        options += [[same_value(c, expected[k]) for k in members] for c in TRIVIAL]
        for k, ok in zip(members, max(options, key=sum), strict=True):
            passed[k] = ok
    return passed


def override_reward(
    results: Sequence[tuple[bool, str]],
    expected: Sequence[Any],
    likeliest: set[str],
    calls: Sequence[str],
) -> float:
    """Expected reward of the unfixed code with the right answers for the ``likeliest``
    calls and its other outputs :func:`remapped`: ``q ** HIDDEN_CALLS``, ``q`` its pass rate
    on ``calls``."""
    passed = [
        t or r
        for t, r in zip((c in likeliest for c in calls), remapped(results, expected), strict=True)
    ]
    return float((sum(passed) / len(passed)) ** HIDDEN_CALLS)


def _base_tasks(sandbox: Sandbox, base: Base, index: int, seed: int) -> list[dict[str, Any]]:
    fixed = normalized(base.source)
    probe = DrawnTask(base.name, base.description, fixed, fixed, (), (), base.name, "")
    rng = np.random.default_rng([seed, index])
    visible = [INPUTS[base.name](rng) for _ in range(3)]
    draws = [INPUTS[base.name](rng) for _ in range(DRAWS)]
    tests = [(args, expected_of(probe, args)) for args in visible + draws]
    all_mutants = mutants(base.source)
    candidates = [Entry(str(i), base.name, m.code, ()) for i, m in enumerate(all_mutants)]
    screen = run_bundle(sandbox, [dataclasses.replace(e, tests=tests[:SCREEN]) for e in candidates])
    alive = [dataclasses.replace(e, tests=tests) for e in candidates if not _hangs(screen[e.key])]
    results = run_bundle(sandbox, [Entry("fix", base.name, fixed, tests), *alive])
    if not all(ok for ok, _ in results["fix"]):
        raise RuntimeError(f"{base.name}: the correct function fails its own draws")
    values = [ast.literal_eval(want) for _, want in tests[3:]]
    calls = [call_of(base.name, a) for a in draws]
    likeliest = {c for c, _ in Counter(calls).most_common(TABLE)}
    out: list[dict[str, Any]] = []
    behaviours: set[tuple[tuple[bool, str], ...]] = set()
    for entry in alive:
        mutant = all_mutants[int(entry.key)]
        seen, drawn = results[entry.key][:3], results[entry.key][3:]
        passed = [ok for ok, _ in drawn]
        behaviour = tuple(drawn)
        if (
            _hangs(drawn)
            or passed.count(False) < MIN_FAIL_RATE * len(drawn)
            or override_reward(drawn, values, likeliest, calls) > MAX_OVERRIDE_REWARD
            or behaviour in behaviours
        ):
            continue
        behaviours.add(behaviour)
        shown = list(visible)
        if all(ok for ok, _ in seen):
            failing = [a for a, ok in zip(draws, passed, strict=True) if not ok]
            shown.append(min(failing, key=lambda a: (len(repr(a)), repr(a))))
        out.append(
            {
                "name": f"{base.name}.{mutant.kind}.{mutant.site}",
                "function": base.name,
                "kind": mutant.kind,
                "description": base.description,
                "buggy": mutant.code,
                "fixed": fixed,
                "visible": [[call_of(base.name, a), expected_of(probe, a)] for a in shown],
            }
        )
    return out


def generate(seed: int = 0, sandbox: Sandbox | None = None) -> list[dict[str, Any]]:
    """The generated task records (deterministic for a seed); one or two sandbox runs per
    base."""
    sandbox = sandbox or Sandbox(BUNDLE_LIMITS)
    return [r for i, base in enumerate(bases()) for r in _base_tasks(sandbox, base, i, seed)]


def dumps(records: list[dict[str, Any]]) -> str:
    """The file's text for ``records`` (stable: one task a line, sorted keys)."""
    return "[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in records) + "\n]\n"


def main() -> None:
    """Rewrite ``debug_tasks_generated.json`` next to this module."""
    records = generate()
    path = Path(__file__).with_name(GENERATED_FILE)
    path.write_text(dumps(records), encoding="utf-8")
    kinds = Counter(r["kind"] for r in records)
    print(f"{len(records)} tasks written to {path} ({dict(kinds)})", file=sys.stderr)


if __name__ == "__main__":
    main()
