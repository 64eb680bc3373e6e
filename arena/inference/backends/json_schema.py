"""JSON Schema → regex: the compiler behind ``json`` constraints.

One regex per schema, the same on every backend (vLLM and the transformers backend both
match it with llguidance), so outputs look alike everywhere: every property emitted, in
schema order, ``json.dumps`` spacing (``{"a": 1, "b": "x"}``). The compiler honours every
keyword it accepts (:data:`SUPPORTED_KEYWORDS`) and refuses any other with a
:class:`BackendError` listing what is supported, rather than ignoring it. Compiled regexes
are capped at :data:`MAX_SCHEMA_REGEX_CHARS` as they are built (nesting multiplies size).
"""

from __future__ import annotations

import json
import re
from typing import Any

from parley.arena.inference.backends.errors import BackendError, ConstraintError

__all__ = ["SUPPORTED_KEYWORDS", "json_schema_to_regex"]


# One character of a JSON string: a plain character, a short escape, or a \u escape of a
# non-surrogate (so each regex repetition is one code point, as minLength/maxLength count).
_CHAR = (
    r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))'
)
_STRING = '"' + _CHAR + '*"'
_INTEGER = r"-?(0|[1-9][0-9]*)"
_NUMBER = _INTEGER + r"(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_SIMPLE = {
    "string": _STRING,
    "integer": _INTEGER,
    "number": _NUMBER,
    "boolean": "(true|false)",
    "null": "null",
}

# The JSON Schema keywords the compiler honours exactly; any other keyword is refused.
_ANNOTATIONS = frozenset(
    {"title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated"}
)
_GENERIC = frozenset({"type", "enum", "const", "anyOf", "oneOf"})
_BY_TYPE: dict[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
}
SUPPORTED_KEYWORDS = sorted(_ANNOTATIONS | _GENERIC | frozenset().union(*_BY_TYPE.values()))
"""Every JSON Schema keyword :func:`json_schema_to_regex` accepts."""
_SUPPORTED_HINT = (
    "supported: type (string, integer, number, boolean, null, object, array or a list of "
    "them), enum, const, anyOf, oneOf (disjoint alternatives), string minLength/maxLength, "
    "object properties/required/additionalProperties (every property is emitted, in schema "
    "order), array items/minItems/maxItems, and annotations (title, description, ...)"
)


def json_schema_to_regex(schema: dict[str, Any] | str) -> str:
    """A regex whose full matches are exactly the JSON texts this backend emits for ``schema``.

    Every text it matches is valid under ``schema`` (whitespace and key order fixed:
    ``json.dumps`` spacing, properties in schema order). Raises :class:`BackendError` naming
    the first keyword it cannot honour (with the list of supported ones) or saying why the
    schema cannot be satisfied.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise BackendError(f"json_schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise BackendError("a JSON schema must be an object")
    return _schema(schema, "#")


def _count(s: dict[str, Any], key: str, where: str) -> int | None:
    value = s.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackendError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    if value > 10_000:
        raise BackendError(f"{where}: {key} above 10000 is not supported, got {value}")
    return value


def _bounds(s: dict[str, Any], lo_key: str, hi_key: str, where: str) -> tuple[int, int | None]:
    lo, hi = _count(s, lo_key, where) or 0, _count(s, hi_key, where)
    if hi is not None and lo > hi:
        raise BackendError(f"{where}: {lo_key} {lo} > {hi_key} {hi}: no value can satisfy it")
    return lo, hi


def _types(s: dict[str, Any], where: str) -> list[str]:
    kind = s.get("type")
    kinds = kind if isinstance(kind, list) else [] if kind is None else [kind]
    if kind is not None and not kinds:
        raise BackendError(f"{where}: an empty type list cannot be satisfied")
    for k in kinds:
        if k not in _SIMPLE and k not in ("object", "array"):
            raise BackendError(f"{where}: type {k!r} is not supported; {_SUPPORTED_HINT}")
    return kinds


MAX_SCHEMA_REGEX_CHARS = 64 * 1024
"""Longest regex a JSON schema may compile to (checked at every level as it is built): an
array nested 17 deep, 494 characters of schema, had grown a regex 4x per level (119 MB at
20) and held the pool's event loop for every client."""


def _schema(s: Any, where: str) -> str:
    out = _schema_body(s, where)
    if len(out) > MAX_SCHEMA_REGEX_CHARS:
        raise ConstraintError(
            "too_costly",
            f"{where}: the schema compiles to a pattern of {len(out):,} characters; at most "
            f"{MAX_SCHEMA_REGEX_CHARS:,} (nest fewer arrays or objects)",
        )
    return out


def _schema_body(s: Any, where: str) -> str:
    if not isinstance(s, dict):
        raise BackendError(f"{where}: a schema must be an object, got {json.dumps(s)[:40]}")
    kinds = _types(s, where)
    allowed = _ANNOTATIONS | _GENERIC | frozenset().union(*(_BY_TYPE.get(k, ()) for k in kinds))
    for key in s:
        if key not in allowed:
            raise BackendError(
                f"{where}: JSON schema keyword {key!r} is not supported (it would be ignored, "
                f"so outputs could break it); {_SUPPORTED_HINT}"
            )
    if "enum" in s or "const" in s:
        return _values(s, kinds, where)
    for key in ("anyOf", "oneOf"):
        if key in s:
            if kinds or len([k for k in s if k not in _ANNOTATIONS]) > 1:
                raise BackendError(f"{where}: {key} beside other keywords is not supported")
            subs = s[key]
            if not isinstance(subs, list) or not subs:
                raise BackendError(f"{where}: an empty {key} cannot be satisfied")
            if key == "oneOf":
                _check_disjoint(subs, where)
            return (
                "("
                + "|".join(_schema(sub, f"{where}/{key}/{i}") for i, sub in enumerate(subs))
                + ")"
            )
    if not kinds:
        raise BackendError(
            f"{where}: the schema needs a type, enum, const or anyOf; {_SUPPORTED_HINT}"
        )
    return "(" + "|".join(_typed(s, k, where) for k in kinds) + ")"


def _typed(s: dict[str, Any], kind: str, where: str) -> str:
    if kind == "object":
        props: dict[str, Any] = s.get("properties", {})
        if not isinstance(props, dict):
            raise BackendError(f"{where}: properties must be an object")
        required = s.get("required", [])
        missing = [r for r in required if r not in props] if isinstance(required, list) else [0]
        if missing:
            raise BackendError(
                f"{where}: required must list names from properties (every property is "
                f"emitted); not there: {missing}"
            )
        parts = [
            re.escape(json.dumps(name)) + ": " + _schema(sub, f"{where}/properties/{name}")
            for name, sub in props.items()
        ]
        return r"\{" + ", ".join(parts) + r"\}"
    if kind == "array":
        item = _schema(s.get("items", {"type": "string"}), f"{where}/items")
        lo, hi = _bounds(s, "minItems", "maxItems", where)
        if hi == 0:
            return r"\[\]"
        more = f"{{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}"
        body = f"{item}(, {item}){more}"
        return r"\[" + (body if lo > 0 else f"({body})?") + r"\]"
    if kind == "string" and ("minLength" in s or "maxLength" in s):
        lo, hi = _bounds(s, "minLength", "maxLength", where)
        return f'"{_CHAR}{{{lo},{"" if hi is None else hi}}}"'
    return _SIMPLE[kind]


_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


def _type_of(value: Any) -> str:
    return (
        "object"
        if isinstance(value, dict)
        else "array"
        if isinstance(value, list)
        else _JSON_TYPE[type(value)]
    )


def _values(s: dict[str, Any], kinds: list[str], where: str) -> str:
    values = [s["const"]] if "const" in s else s["enum"]
    if not isinstance(values, list):
        raise BackendError(f"{where}: enum must be a list")
    if "const" in s and "enum" in s and s["const"] not in s["enum"]:
        raise BackendError(f"{where}: const is not in enum: no value can satisfy both")
    if kinds:  # enum beside type: every value must have one of the types
        ok = set(kinds) | ({"integer"} if "number" in kinds else set())
        values = [
            v
            for v in values
            if _type_of(v) in ok
            or (_type_of(v) == "number" and "integer" in ok and float(v).is_integer())
        ]
    if not values:
        raise BackendError(
            f"{where}: an empty enum (or none of its values of the given type) cannot be satisfied"
        )
    return "(" + "|".join(re.escape(json.dumps(v)) for v in values) + ")"


def _check_disjoint(subs: list[Any], where: str) -> None:
    """oneOf means exactly one alternative matches; an alternation means at least one.

    They agree when no output can match two alternatives: each alternative is reduced to
    the JSON types it can produce (or its constants), and those must not overlap."""
    seen: set[str] = set()
    for sub in subs:
        if isinstance(sub, dict) and ("const" in sub or "enum" in sub):
            values = [sub["const"]] if "const" in sub else list(sub.get("enum") or [])
            keys = {json.dumps(v, sort_keys=True) for v in values}
            keys |= {"type:" + _type_of(v) for v in values}
            clash = bool(keys & seen)
        else:
            kinds = set(_types(sub, where)) if isinstance(sub, dict) else set()
            if "number" in kinds:
                kinds.add("integer")
            keys = {"type:" + k for k in kinds or {"*"}}
            clash = bool(keys & seen) or "type:*" in seen or ("type:*" in keys and bool(seen))
        if clash:
            raise BackendError(
                f"{where}: oneOf alternatives that may overlap are not supported (an output "
                "could match two of them); use anyOf, or make them distinct types or constants"
            )
        seen |= keys
