"""Running tests on untrusted code: the sandbox evaluates the calls, the parent judges.

A test is ``(call, expected)``: two Python expressions. :func:`run_tests` puts three files in
a fresh sandbox run: ``main.py`` (:data:`RUNNER`, public and fixed), ``solution.py`` (the
untrusted module) and ``calls.json`` (the ``call`` expressions only). The runner imports the
solution, evaluates each call (1 s per call) and prints one line: :data:`MARK` followed by a
JSON list with one entry per call, the call's result encoded as plain data or the error it
raised. Nothing secret is in that process: no expected value, no tag, no reference fix.

The parent (this process, outside the sandbox) decodes that line with hard bounds, rebuilds
the values from its own constructors (exact built-in types: ``None``, ``bool``, ``int``,
``float``, ``str``, ``list``, ``tuple``, ``set``, ``dict``) and compares each with the
expected value, parsed by :func:`ast.literal_eval`, using ``==`` on those trusted values: no
method of the submission's objects ever runs in the judge, and ``[1]`` never equals ``(1,)``.
Numbers compare as Python compares them (``5.0 == 5``): the reference fix of ``average``
returns ``5.0`` where the task expects ``5``, and v0 scored it so.
``strict=True`` (code/debug-v3, whose expected values are the fix's own results) compares
type-exact instead (:func:`same_value`): ``True`` is not ``1``, ``5.0`` is not ``5``.

The untrusted code can print anything, including a forged results line, since it shares
the runner's process. That is harmless by construction: a forged entry only claims that a
call returned some plain value, which an honest function could have returned just as well,
and the code never learns the expected values. So a hack can do no better than a function.
Missing, malformed, duplicated or extra entries score 0 for the tests concerned; nothing
here raises on bad output.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from parley.scenarios.tools.sandbox import Sandbox

__all__ = ["MARK", "RUNNER", "Outcome", "TestRun", "decode_value", "run_tests", "same_value"]

MARK = "<<parley-results>>"
"""Prefix of the runner's results line (public: forging it gains nothing)."""
MAX_DEPTH = 32
"""Nesting depth of a result value beyond which it counts as too large."""
MAX_NODES = 2000
"""Values (containers and scalars) in one result beyond which it counts as too large."""
MAX_CHARS = 4000
"""Characters of strings (and digits of numbers) in one result beyond which it is too large."""
MAX_DETAIL = 200
"""Characters kept of an error message or of a shown result."""
MAX_ENCODED = 1500
"""JSON characters of one encoded result beyond which it is too large (the results line
shares the sandbox's stdout cap with the code's own prints)."""

RUNNER = r"""
import json, os, signal, sys
_type, _len, _str, _repr = type, len, str, repr
with open("calls.json", encoding="utf-8") as f:
    CALLS = json.load(f)
MAX_DEPTH, MAX_NODES, MAX_CHARS, MAX_DETAIL, MAX_ENCODED, MARK = @LIMITS@
SEQUENCES = {list: "l", tuple: "t", set: "S"}

class TooLarge(Exception):
    pass

class NotPlain(Exception):
    pass

def chars(kind, text, budget):
    budget[1] += _len(text)
    if budget[1] > MAX_CHARS:
        raise TooLarge()
    return [kind, text]

def encode(x, depth, budget):
    budget[0] += 1
    if depth > MAX_DEPTH or budget[0] > MAX_NODES:
        raise TooLarge()
    t = _type(x)
    if x is None:
        return ["n"]
    if t is bool:
        return ["b", x]
    if t is int:
        if x.bit_length() > 3 * MAX_CHARS:
            raise TooLarge()
        return chars("i", _str(x), budget)
    if t is float:
        return chars("f", _repr(x), budget)
    if t is str:
        return chars("s", x, budget)
    if t in SEQUENCES:
        return [SEQUENCES[t], [encode(i, depth + 1, budget) for i in x]]
    if t is dict:
        return ["d", [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)]
                      for k, v in x.items()]]
    raise NotPlain("returned a " + t.__name__[:50] + ", not a plain built-in value")

def error(prefix, exc):
    try:
        return ["err", (prefix + _type(exc).__name__ + ": " + _str(exc))[:MAX_DETAIL]]
    except BaseException:
        return ["err", prefix + "an exception that cannot be shown"]

def alarm(signum, frame):
    raise TimeoutError("the test took longer than 1 s")

signal.signal(signal.SIGALRM, alarm)
entries = []
try:
    import solution
    namespace, failure = dict(vars(solution)), None
except BaseException as exc:
    namespace, failure = None, error("the module failed to import: ", exc)
for call in CALLS:
    if namespace is None:
        entries.append(failure)
        continue
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        got = eval(call, dict(namespace))
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        entries.append(error("raised ", exc))
        continue
    try:
        encoded = ["ok", encode(got, 0, [0, 0])]
        if _len(json.dumps(encoded)) > MAX_ENCODED:
            raise TooLarge()
        entries.append(encoded)
    except TooLarge:
        entries.append(["err", "returned a value too large to compare"])
    except NotPlain as exc:
        entries.append(["err", exc.args[0]])
    except BaseException as exc:
        entries.append(error("raised ", exc))
sys.stdout.flush()
os.write(1, ("\n" + MARK + json.dumps(entries) + "\n").encode())
os._exit(0)
""".replace("@LIMITS@", repr((MAX_DEPTH, MAX_NODES, MAX_CHARS, MAX_DETAIL, MAX_ENCODED, MARK)))
"""The runner put in the sandbox as ``main.py`` (stdlib only; public; holds no secret)."""


@dataclasses.dataclass(frozen=True)
class TestRun:
    """Results of running tests: one ``(passed, detail)`` per test, or why none ran."""

    results: tuple[tuple[bool, str], ...]
    problem: str = ""

    @property
    def passed(self) -> int:
        return sum(ok for ok, _ in self.results)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the sandbox says one call did: ``value`` when ``returned``, else ``error``."""

    returned: bool
    value: Any = None
    error: str = ""


class Malformed(ValueError):
    """A results entry that is not in the runner's format (or exceeds its bounds)."""


_INT = re.compile(r"-?[0-9]+")
_SCALARS: dict[str, type] = {"b": bool, "s": str}
_SEQUENCES: dict[str, Any] = {"l": list, "t": tuple, "S": set}


def decode_value(node: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """Rebuild a value from the runner's encoding with this process's own constructors.

    Raises :class:`Malformed` on anything outside the format or beyond the bounds."""
    budget = budget if budget is not None else [0, 0]
    budget[0] += 1
    if depth > MAX_DEPTH or budget[0] > MAX_NODES:
        raise Malformed("too deep or too many values")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise Malformed("a value must be a [kind, ...] list")
    kind, args = node[0], node[1:]
    if kind == "n" and not args:
        return None
    if len(args) != 1:
        raise Malformed(f"kind {kind!r} takes one argument")
    arg = args[0]
    if kind in _SCALARS and type(arg) is _SCALARS[kind]:
        budget[1] += len(arg) if isinstance(arg, str) else 1
        if budget[1] > MAX_CHARS:
            raise Malformed("too many characters")
        return arg
    if kind in ("i", "f") and type(arg) is str and len(arg) <= MAX_CHARS:
        budget[1] += len(arg)
        if budget[1] > MAX_CHARS:
            raise Malformed("too many characters")
        if kind == "i" and _INT.fullmatch(arg):
            return int(arg)
        if kind == "f" and len(arg) <= 32:
            try:
                return float(arg)
            except ValueError as exc:
                raise Malformed(f"not a float: {arg!r}") from exc
        raise Malformed(f"not a number: {arg[:40]!r}")
    if kind in _SEQUENCES and type(arg) is list:
        items = [decode_value(item, depth + 1, budget) for item in arg]
        try:
            return _SEQUENCES[kind](items)
        except TypeError as exc:  # an unhashable set member, as Python itself would refuse
            raise Malformed(str(exc)) from exc
    if kind == "d" and type(arg) is list:
        pairs = []
        for pair in arg:
            if type(pair) is not list or len(pair) != 2:
                raise Malformed("a dict item must be a [key, value] pair")
            pairs.append(
                (decode_value(pair[0], depth + 1, budget), decode_value(pair[1], depth + 1, budget))
            )
        try:
            return dict(pairs)
        except TypeError as exc:
            raise Malformed(str(exc)) from exc
    raise Malformed(f"unknown value kind {kind[:20]!r}")


def _outcome(entry: Any) -> Outcome:
    if type(entry) is list and len(entry) == 2 and entry[0] == "err" and type(entry[1]) is str:
        return Outcome(False, error=entry[1][:MAX_DETAIL])
    if type(entry) is list and len(entry) == 2 and entry[0] == "ok":
        try:
            return Outcome(True, decode_value(entry[1]))
        except Malformed as exc:
            return Outcome(False, error=f"malformed result ({exc})")
    return Outcome(False, error="malformed result entry")


def parse_results(stdout: str, count: int) -> tuple[list[Outcome], str]:
    """The outcomes of ``count`` calls from the runner's stdout (the last results line),
    and a problem (empty when the line was found and well formed)."""
    missing = Outcome(False, error="not run")
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARK)), None)
    if line is None:
        return [missing] * count, "no results"
    try:
        raw = json.loads(line[len(MARK) :])
    except (ValueError, RecursionError):
        return [missing] * count, "malformed results line"
    if type(raw) is not list:
        return [missing] * count, "malformed results line"
    outcomes = [_outcome(entry) for entry in raw[:count]]
    outcomes += [missing] * (count - len(outcomes))
    problem = "" if len(raw) == count else f"{len(raw)} results for {count} tests"
    return outcomes, problem


def _tagged(value: Any) -> Any:
    """``value`` with the exact type of every part spelt out, for hashing in sets and keys
    (where ``True``, ``1`` and ``1.0`` would otherwise be one member)."""
    kind = type(value)
    if kind in (list, tuple):
        return (kind.__name__, tuple(_tagged(item) for item in value))
    if kind in (set, frozenset):
        return (kind.__name__, frozenset(_tagged(item) for item in value))
    if kind is dict:
        return ("dict", frozenset((_tagged(k), _tagged(v)) for k, v in value.items()))
    return (kind.__name__, value)


def same_value(got: Any, expected: Any) -> bool:
    """Type-exact equality of plain values: ``True`` is not ``1``, ``5.0`` is not ``5``,
    ``[1]`` is not ``(1,)``; floats agree within a relative 1e-9 (a sum taken in another
    order differs in its last bits). Members of sets and dict keys compare exactly."""
    kind = type(got)
    if kind is not type(expected):
        return False
    if kind is float:
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12) or (
            math.isnan(got) and math.isnan(expected)
        )
    if kind in (list, tuple):
        return len(got) == len(expected) and all(map(same_value, got, expected))
    if kind is dict:
        if {_tagged(k) for k in got} != {_tagged(k) for k in expected}:
            return False
        return all(same_value(got[k], expected[k]) for k in got)
    if kind is set:
        return bool(_tagged(got) == _tagged(expected))
    return bool(got == expected)


def judge(outcome: Outcome, expected: Any, *, strict: bool = False) -> tuple[bool, str]:
    """``(passed, detail)``: equality of trusted built-in values (never the code's methods);
    ``strict``: type-exact (:func:`same_value`), else Python's ``==``."""
    if not outcome.returned:
        return False, outcome.error
    try:
        passed = same_value(outcome.value, expected) if strict else outcome.value == expected
    except RecursionError:  # a self-containing value cannot be rebuilt; kept for safety
        passed = False
    return bool(passed), "returned " + repr(outcome.value)[:MAX_DETAIL]


def run_tests(
    sandbox: Sandbox,
    code: str,
    tests: Sequence[tuple[str, str]],
    *,
    hidden: bool = False,
    strict: bool = False,
) -> TestRun:
    """Run ``tests`` against ``code`` (saved as ``solution.py``) in ``sandbox``.

    Only the calls enter the sandbox; the expected values are parsed and compared here,
    type-exact when ``strict`` (code/debug-v3), else with ``==``.
    ``hidden``: the problem never quotes the run's output nor anything the code chose (it
    can print the calls it was given, or a number computed from them, or end the run in a
    way chosen from them: exit, output cap or signal, a digit per episode).
    Never raises on anything the code does (a :class:`~parley.scenarios.tools.SandboxError`
    from the sandbox itself still propagates: that is the host's failure, not the code's)."""
    calls = [call for call, _ in tests]
    files = {"solution.py": code, "calls.json": json.dumps(calls)}
    run = sandbox.run(RUNNER, files=files)
    outcomes, problem = parse_results(run.stdout, len(calls))
    results = tuple(
        judge(outcome, ast.literal_eval(expected), strict=strict)
        for outcome, (_, expected) in zip(outcomes, tests, strict=True)
    )
    if problem == "no results":
        if hidden:  # (how it ended is the code's to choose too: exit, output, signal)
            problem = "the tests did not finish"
        else:
            problem = f"the tests did not finish (ended by {run.ended_by}): {run.stderr[-300:]}"
    elif problem and hidden:  # (the count of a forged results line is the code's to choose)
        problem = "the results line was malformed or incomplete"
    return TestRun(results, problem)


_HIDDEN_PASS_RATES: dict[tuple[str, str], float] = {}


def hidden_pass_rate(
    sandbox: Sandbox, name: str, code: str, tests: Sequence[tuple[str, str]]
) -> float:
    """The share of the hidden ``tests`` that ``code`` passes (:func:`run_tests`), measured once
    per ``(name, code)`` and process; a :class:`~parley.scenarios.tools.SandboxError`
    propagates and is not cached."""
    key = (name, code)
    if key not in _HIDDEN_PASS_RATES:
        run = run_tests(sandbox, code, tests, hidden=True)
        _HIDDEN_PASS_RATES[key] = run.passed / len(run.results)
    return _HIDDEN_PASS_RATES[key]
