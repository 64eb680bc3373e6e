"""A safe, exact calculator: arithmetic expressions evaluated over fractions, no ``eval``.

:func:`evaluate` parses with :mod:`ast` and walks a whitelist of nodes: numbers, ``+ - * /
// % **``, unary ``+ -``, parentheses and the functions of :data:`FUNCTIONS`. Arithmetic is
exact (:class:`fractions.Fraction`), so ``0.1 + 0.2`` is ``0.3``. Limits keep hostile input
cheap: expression length, exponent size and result size are bounded, and every failure
(huge literals, deep nesting, results Decimal cannot hold) is a :class:`CalcError`.

:func:`parse_number` reads a number the way ``Fraction(text)`` does, in bounded time
(``Fraction("1e999999999")`` alone runs for hours).

:func:`convert` converts between units with exact factors (international definitions).
"""

from __future__ import annotations

import ast
import decimal
import math
import re
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

__all__ = [
    "FUNCTIONS",
    "UNITS",
    "CalcError",
    "convert",
    "evaluate",
    "format_number",
    "parse_number",
    "round_to",
]

MAX_LENGTH = 500
MAX_EXPONENT = 64
MAX_DIGITS = 200
MAX_NUMBER_EXPONENT = 1000
"""Largest decimal exponent :func:`parse_number` expands (the value still prints: < 4,300
digits)."""
_EXPONENT = re.compile(r"[eE]\s*[-+]?(\d+(?:_\d+)*)")
_FAILURES = (ArithmeticError, ValueError, RecursionError, decimal.InvalidOperation)


class CalcError(ValueError):
    """An expression the calculator refuses (syntax, unknown name, too large, division by 0)."""


def _sqrt(x: Fraction) -> Fraction:
    if x < 0:
        raise CalcError("sqrt of a negative number")
    root = math.isqrt(x.numerator), math.isqrt(x.denominator)
    if root[0] ** 2 == x.numerator and root[1] ** 2 == x.denominator:
        return Fraction(root[0], root[1])
    return Fraction(math.sqrt(x))


def _round(x: Fraction, places: Fraction) -> Fraction:
    if abs(places) > MAX_DIGITS:
        raise CalcError(f"round: places must be between -{MAX_DIGITS} and {MAX_DIGITS}")
    try:
        return round_to(x, int(places))
    except decimal.InvalidOperation as exc:
        raise CalcError("round: the result has too many digits") from exc


FUNCTIONS: dict[str, Callable[..., Fraction]] = {
    "abs": lambda x: abs(x),
    "min": lambda *xs: min(xs),
    "max": lambda *xs: max(xs),
    "round": lambda x, n=Fraction(0): _round(x, n),
    "floor": lambda x: Fraction(math.floor(x)),
    "ceil": lambda x: Fraction(math.ceil(x)),
    "sqrt": _sqrt,
}
"""Functions an expression may call (``round`` rounds half up, like a shop till)."""

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: _power(a, b),
}


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
        raise CalcError(
            f"exponents must be whole numbers between -{MAX_EXPONENT} and {MAX_EXPONENT}"
        )
    return base ** int(exponent)


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; raises :class:`CalcError` with the reason."""
    if len(expression) > MAX_LENGTH:
        raise CalcError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"not an arithmetic expression: {exc.msg}") from exc
    try:
        return _eval(tree.body)
    except CalcError:
        raise
    except ZeroDivisionError as exc:
        raise CalcError("division by zero") from exc
    except RecursionError as exc:
        raise CalcError("the expression is nested too deeply") from exc
    except _FAILURES as exc:  # inf/nan literals, float overflow in sqrt, Decimal limits
        raise CalcError(f"cannot compute this ({type(exc).__name__})") from exc


def parse_number(text: str) -> Fraction | None:
    """``Fraction(text)`` (same grammar: ``42.16``, ``-1e3``, ``7/4``), or ``None`` when it is
    not a number or its exponent exceeds :data:`MAX_NUMBER_EXPONENT` (such a number is 0 or
    astronomically large, never a plausible answer)."""
    for match in _EXPONENT.finditer(text):
        digits = match.group(1).replace("_", "")
        if len(digits) > 6 or int(digits) > MAX_NUMBER_EXPONENT:
            return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _eval(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))  # str: 0.1 means one tenth, not the nearest double
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_eval(node.left), _eval(node.right))
        if len(str(value.numerator)) + len(str(value.denominator)) > MAX_DIGITS:
            raise CalcError(f"intermediate result has more than {MAX_DIGITS} digits")
        return value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in FUNCTIONS
        and not node.keywords
    ):
        args = [_eval(arg) for arg in node.args]
        try:
            return Fraction(FUNCTIONS[node.func.id](*args))
        except TypeError as exc:
            raise CalcError(f"{node.func.id}: wrong number of arguments") from exc
    shown = ast.unparse(node)[:40]
    raise CalcError(
        f"unsupported: {shown!r}; use numbers, + - * / // % **, parentheses and "
        f"{', '.join(FUNCTIONS)}"
    )


def round_to(value: Fraction, places: int) -> Fraction:
    """``value`` rounded half up (away from zero) to ``places`` decimals."""
    quantum = Decimal(1).scaleb(-places)
    exact = Decimal(value.numerator) / Decimal(value.denominator)
    return Fraction(exact.quantize(quantum, rounding=ROUND_HALF_UP))


def format_number(value: Fraction, places: int = 10) -> str:
    """Exact decimal when it terminates within ``places`` decimals, else rounded to them.

    Raises :class:`CalcError` for a value Decimal cannot hold to that many places.
    """
    try:
        rounded = round_to(value, places)
        text = f"{Decimal(rounded.numerator) / Decimal(rounded.denominator):f}"
    except decimal.InvalidOperation as exc:
        raise CalcError(f"the result has too many digits to show to {places} places") from exc
    return text.rstrip("0").rstrip(".") if "." in text else text


# unit -> (dimension, factor to the base unit, offset); base units: m, kg, L, s, degC.
UNITS: dict[str, tuple[str, Fraction, Fraction]] = {
    "m": ("length", Fraction(1), Fraction(0)),
    "km": ("length", Fraction(1000), Fraction(0)),
    "cm": ("length", Fraction(1, 100), Fraction(0)),
    "mi": ("length", Fraction("1609.344"), Fraction(0)),
    "ft": ("length", Fraction("0.3048"), Fraction(0)),
    "in": ("length", Fraction("0.0254"), Fraction(0)),
    "kg": ("mass", Fraction(1), Fraction(0)),
    "g": ("mass", Fraction(1, 1000), Fraction(0)),
    "lb": ("mass", Fraction("0.45359237"), Fraction(0)),
    "oz": ("mass", Fraction("0.45359237") / 16, Fraction(0)),
    "L": ("volume", Fraction(1), Fraction(0)),
    "mL": ("volume", Fraction(1, 1000), Fraction(0)),
    "gal": ("volume", Fraction("3.785411784"), Fraction(0)),
    "s": ("time", Fraction(1), Fraction(0)),
    "min": ("time", Fraction(60), Fraction(0)),
    "h": ("time", Fraction(3600), Fraction(0)),
    "degC": ("temperature", Fraction(1), Fraction(0)),
    "degF": ("temperature", Fraction(5, 9), Fraction(-32)),
    "m2": ("area", Fraction(1), Fraction(0)),
    "ft2": ("area", Fraction("0.3048") ** 2, Fraction(0)),
}


def convert(value: Fraction, from_unit: str, to_unit: str) -> Fraction:
    """Convert exactly; raises :class:`CalcError` for unknown or incompatible units."""
    for unit in (from_unit, to_unit):
        if unit not in UNITS:
            raise CalcError(f"unknown unit {unit!r}; known units: {', '.join(UNITS)}")
    dim_a, factor_a, offset_a = UNITS[from_unit]
    dim_b, factor_b, offset_b = UNITS[to_unit]
    if dim_a != dim_b:
        raise CalcError(f"cannot convert {dim_a} ({from_unit}) to {dim_b} ({to_unit})")
    base = (value + offset_a) * factor_a
    return base / factor_b - offset_b
