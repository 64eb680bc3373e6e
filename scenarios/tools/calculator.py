"""A safe, exact calculator: arithmetic expressions evaluated over fractions, no ``eval``.

:func:`evaluate` parses with :mod:`ast` and walks a whitelist of nodes: numbers, ``+ - * /
// % **``, unary ``+ -``, parentheses and the functions of :data:`FUNCTIONS`. Arithmetic is
exact (:class:`fractions.Fraction`), so ``0.1 + 0.2`` is ``0.3``. Limits keep hostile input
cheap: expression length, exponent size and result size are bounded.

:func:`convert` converts between units with exact factors (international definitions).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

__all__ = ["FUNCTIONS", "UNITS", "CalcError", "convert", "evaluate", "format_number", "round_to"]

MAX_LENGTH = 500
MAX_EXPONENT = 64
MAX_DIGITS = 200


class CalcError(ValueError):
    """An expression the calculator refuses (syntax, unknown name, too large, division by 0)."""


def _sqrt(x: Fraction) -> Fraction:
    if x < 0:
        raise CalcError("sqrt of a negative number")
    root = math.isqrt(x.numerator), math.isqrt(x.denominator)
    if root[0] ** 2 == x.numerator and root[1] ** 2 == x.denominator:
        return Fraction(root[0], root[1])
    return Fraction(math.sqrt(x))


FUNCTIONS: dict[str, Callable[..., Fraction]] = {
    "abs": lambda x: abs(x),
    "min": lambda *xs: min(xs),
    "max": lambda *xs: max(xs),
    "round": lambda x, n=Fraction(0): round_to(x, int(n)),
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
    except ZeroDivisionError as exc:
        raise CalcError("division by zero") from exc


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
    """Exact decimal when it terminates within ``places`` decimals, else rounded to them."""
    rounded = round_to(value, places)
    text = f"{Decimal(rounded.numerator) / Decimal(rounded.denominator):f}"
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
