"""Generated calc-chain problems with a difficulty: a chain of ``difficulty + 1`` operations.

``CalcChain(difficulty=d)`` (any version; :mod:`parley.scenarios.tool_use.calc_chain`) draws
its problem here instead of from the seven templates: a quantity with a unit, then ``d + 1``
operations applied in order — the first a unit conversion (exact factors: the convert tool),
the others drawn among conversions, ``* k``, ``/ k``, ``+ x``, ``- x`` and ``± p%``. Every
seed is a new problem; each step of the reference solution is one tool call that needs the
previous result, so the chain's length is the number of dependent calls a solver makes.

The problem is data: :func:`draw_chain` draws the quantities (``["12.5 gal", "to:L",
"*:3", "%:-12"]``), :func:`chain_parts` rebuilds text, steps and the exact answer from them
(pure: the oracle and the scripted baseline rebuild it from the view's ``quantities``, which
say no more than the text does).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from parley.scenarios.difficulty import check_difficulty
from parley.scenarios.tools.calculator import UNITS, convert, format_number

__all__ = ["CHAIN", "MAX_DIFFICULTY", "chain_parts", "draw_chain"]

CHAIN = "chain"
"""The ``template`` name of a generated problem."""
MAX_DIFFICULTY = 10
"""The longest chain is 11 operations (exact values stay well inside the calculator's
200-digit results)."""

# Dimensions with a linear unit scale (temperature's offset makes * and + meaningless).
_DIMENSIONS: dict[str, list[str]] = {}
for _unit, (_dim, _factor, _offset) in UNITS.items():
    if _dim != "temperature":
        _DIMENSIONS.setdefault(_dim, []).append(_unit)
_OPS = ("to", "*", "/", "+", "-", "%")

Call = tuple[str, dict[str, str]]
"""A reference step: tool name and arguments (``{0}``, ``{1}`` name earlier results)."""


def _decimal(rng: np.random.Generator, low: float, high: float, places: int) -> Fraction:
    scale = 10**places
    return Fraction(int(rng.integers(int(low * scale), int(high * scale) + 1)), scale)


def draw_chain(rng: np.random.Generator, difficulty: int) -> list[str]:
    """The quantities of one problem of ``difficulty``: the start, then ``difficulty + 1``
    operations (the first a conversion). Conversions prefer units that keep the value in
    1..10**6, and ``/`` and ``-`` (at most half the value) apply only to values of 6 or
    more, so results stay positive and a bare "0.00" is never the answer."""
    check_difficulty(difficulty, MAX_DIFFICULTY)
    dimension = sorted(_DIMENSIONS)[int(rng.integers(len(_DIMENSIONS)))]
    units = _DIMENSIONS[dimension]
    unit = units[int(rng.integers(len(units)))]
    value = _decimal(rng, 2, 500, 1)
    quantities = [f"{format_number(value)} {unit}"]
    for i in range(difficulty + 1):
        op = "to" if i == 0 else _OPS[int(rng.integers(len(_OPS)))]
        if value < 6 and op in ("/", "-"):  # keep values >= 1: no answer is a bare "0.00"
            op = {"/": "*", "-": "+"}[op]
        if op == "to":
            others = [u for u in units if u != unit]
            sized = [u for u in others if 1 <= convert(value, unit, u) <= 10**6]
            target = (sized or others)[int(rng.integers(len(sized or others)))]
            value, unit, arg = convert(value, unit, target), target, target
        elif op in ("*", "/"):
            k = _decimal(rng, 1.5, 4 if op == "*" else 6, 1)
            value, arg = (value * k if op == "*" else value / k), format_number(k)
        elif op == "-":  # 5-50% of the running value, to the cent
            x = _cents(value * _decimal(rng, 0.05, 0.5, 2))
            value, arg = value - x, format_number(x)
        elif op == "+":
            x = _decimal(rng, 1, 50, 2)
            value, arg = value + x, format_number(x)
        else:
            p = int(rng.integers(-30, 41)) or 5
            value, arg = value * (1 + Fraction(p, 100)), str(p)
        quantities.append(f"{op}:{arg}")
    return quantities


def _cents(x: Fraction) -> Fraction:
    """``x`` cut to 2 decimals: an amount the text states exactly."""
    return Fraction(int(x * 100), 100)


_WORDS = {
    "to": "convert it to {}",
    "*": "multiply it by {}",
    "/": "divide it by {}",
    "+": "add {}",
    "-": "subtract {}",
}


def chain_parts(quantities: list[str] | tuple[str, ...]) -> tuple[str, list[Call], Fraction]:
    """Text, reference steps and exact answer of the problem ``quantities`` name (pure).

    Raises ``ValueError`` for quantities :func:`draw_chain` does not produce."""
    start, _, unit = quantities[0].partition(" ")
    value = Fraction(start)
    if unit not in UNITS:
        raise ValueError(f"chain start {quantities[0]!r}: expected 'NUMBER UNIT'")
    phrases: list[str] = []
    steps: list[Call] = []
    for i, item in enumerate(quantities[1:]):
        op, _, arg = item.partition(":")
        previous = start if i == 0 else f"{{{i - 1}}}"
        if op == "to":
            steps.append(("convert", {"value": previous, "from_unit": unit, "to_unit": arg}))
            value, unit = convert(value, unit, arg), arg
        elif op == "%":
            p = Fraction(arg)
            sign = "-" if p < 0 else "+"
            steps.append(("calculate", {"expression": f"{previous} * (1 {sign} {abs(p)}/100)"}))
            value *= 1 + p / 100
            phrases.append(f"{'decrease' if p < 0 else 'increase'} it by {abs(p)}%")
            continue
        elif op in _WORDS:
            steps.append(("calculate", {"expression": f"{previous} {op} {arg}"}))
            x = Fraction(arg)
            value = {"*": value * x, "/": value / x, "+": value + x, "-": value - x}[op]
        else:
            raise ValueError(f"chain operation {item!r}: expected one of {_OPS} then ':'")
        phrases.append(_WORDS[op].format(arg))
    text = (
        f"A quantity starts at {quantities[0]}. Apply these operations in order: "
        + "; ".join(phrases)
        + f". What is the final value (in {unit})?"
    )
    return text, steps, value
