"""Tools: plain Python callables with an OpenAI function-calling JSON schema.

A :class:`Tool` wraps a callable and its parameter schema. :func:`tool` makes one from a
function, deriving the schema from the signature (``str``, ``int``, ``float``, ``bool``,
``list[...]``, ``Literal[...]``; parameters without a default are required) and the
descriptions from the docstring (first paragraph; ``name: text`` lines under ``Args:``).

A :class:`ToolBox` is the set of tools one seat may use. :meth:`ToolBox.call` turns a
:class:`~parley.protocols.messages.ToolCall` into a
:class:`~parley.protocols.messages.ToolResult` and never raises for the caller's mistakes:
an unknown tool, arguments that are not JSON or do not match the schema, a tool that raised
(:class:`ToolFailure` for expected failures, any other exception as a crash) or timed out
(``TimeoutError``) all come back as a result with ``error`` set and the reason in it.

The action syntax shared by parley's tool-use scenarios (:func:`parse_turn`)::

    {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "#W1001"}},
                    {"name": "calculate", "arguments": {"expression": "2*(3+4)"}}],
     "answer": "..."}

One JSON object per turn; ``tool_calls`` (a list, possibly empty) and the scenario's final
keys (``answer``, ``message``, ``submit``, ...) may appear together. ``arguments`` may be an
object or a JSON string (as OpenAI's API sends it). Text around the object, such as a
Markdown code fence, is ignored.

Hostile input is bounded (:func:`load_json`, used for actions and for tool arguments): at most
``MAX_JSON_CHARS`` characters, ``MAX_JSON_DEPTH`` levels of nesting and integers of at most
``MAX_INT_DIGITS`` digits (where Python's own limit used to raise out of ``step``). Anything
past a bound is not JSON to parley: the action is an invalid move with the reason, never an
exception out of ``step``. Floats are parsed as Python does (``1e999`` is ``inf``, in linear
time).
Lone surrogates (``\\ud800``, which UTF-8 cannot encode) become U+FFFD; strings may hold any
other character (``\\u0000``, ESC): text that reaches an observation or ``infos`` goes
through :func:`ascii_text` (scenarios) or the scenario machinery's own escaping.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

import msgspec

from parley.protocols.messages import ToolCall, ToolResult

__all__ = [
    "Tool",
    "ToolBox",
    "ToolFailure",
    "Turn",
    "action_constraint",
    "action_schema",
    "ascii_text",
    "encode_turn",
    "load_json",
    "parse_turn",
    "render_result",
    "result_dicts",
    "tool",
    "tool_results",
    "validate",
]


class ToolFailure(Exception):
    """Raised by a tool for an expected failure (``order not found``); its text is the error."""


@dataclass(frozen=True)
class Tool:
    """A callable with its name, description and JSON-schema ``parameters`` (an object)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any]

    def spec(self) -> dict[str, Any]:
        """The OpenAI function-calling form: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def signature_line(self) -> str:
        """One line for an observation: ``name(arg: type, opt?: type) - description``."""
        props: Mapping[str, Any] = self.parameters.get("properties", {})
        required = set(self.parameters.get("required", []))
        args = ", ".join(
            f"{name}{'' if name in required else '?'}: {_type_name(schema)}"
            for name, schema in props.items()
        )
        return f"{self.name}({args}) - {self.description}"


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Any:
    """Make a :class:`Tool` from a function; usable as ``@tool`` or ``@tool(name=...)``.

    ``parameters`` overrides the schema derived from the signature.
    """

    def build(func: Callable[..., Any]) -> Tool:
        doc = inspect.getdoc(func) or ""
        summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
        schema = dict(parameters) if parameters is not None else _schema_of(func, doc)
        return Tool(name or func.__name__, description or summary, schema, func)

    return build(fn) if fn is not None else build


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_of(func: Callable[..., Any], doc: str) -> dict[str, Any]:
    hints = typing.get_type_hints(func)
    docs = dict(re.findall(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.+)$", doc.partition("Args:")[2], re.M))
    props: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(func).parameters.items():
        if pname not in hints:
            raise TypeError(
                f"parameter {pname!r} has no annotation; annotate it or pass parameters="
            )
        prop = _schema_of_type(hints[pname])
        if pname in docs:
            prop["description"] = docs[pname].strip()
        props[pname] = prop
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


def _schema_of_type(hint: Any) -> dict[str, Any]:
    origin = get_origin(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is Literal:
        return {"enum": list(get_args(hint))}
    if origin is list:
        (item,) = get_args(hint) or (str,)
        return {"type": "array", "items": _schema_of_type(item)}
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(options) == 1:
            return _schema_of_type(options[0])
    raise TypeError(f"no JSON schema for the annotation {hint!r}; pass parameters= explicitly")


def _type_name(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(json.dumps(v) for v in schema["enum"])
    if schema.get("type") == "array":
        return f"list[{_type_name(schema.get('items', {}))}]"
    return str(schema.get("type", "any"))


def validate(schema: Mapping[str, Any], value: Any, path: str = "arguments") -> list[str]:
    """Check ``value`` against the JSON-schema subset tools use; return the problems found.

    Supported keywords: ``type`` (object, array, string, integer, number, boolean, null),
    ``properties``, ``required``, ``additionalProperties`` (false), ``items``, ``enum``,
    ``minimum``, ``maximum``, ``minLength``, ``maxLength``, ``minItems``, ``maxItems``.
    """
    problems: list[str] = []
    expected = schema.get("type")
    if expected is not None and not _is_type(value, expected):
        return [f"{path} must be {expected}, got {_json_type(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path} must be one of {json.dumps(schema['enum'])}, got {value!r}")
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties", {})
        problems += [
            f"{path}.{k} is required" for k in schema.get("required", []) if k not in value
        ]
        for key, item in value.items():
            if key in props:
                problems += validate(props[key], item, f"{path}.{key}")
            elif schema.get("additionalProperties", True) is False:
                problems.append(f"{path}.{key} is not a parameter (known: {', '.join(props)})")
    if isinstance(value, list):
        if "items" in schema:
            for i, item in enumerate(value):
                problems += validate(schema["items"], item, f"{path}[{i}]")
        problems += _bounds(path, len(value), schema, "minItems", "maxItems", "items")
    if isinstance(value, str):
        problems += _bounds(path, len(value), schema, "minLength", "maxLength", "characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        problems += _bounds(path, value, schema, "minimum", "maximum", "")
    return problems


def _bounds(
    path: str, size: float, schema: Mapping[str, Any], lo: str, hi: str, unit: str
) -> list[str]:
    problems = []
    if lo in schema and size < schema[lo]:
        problems.append(f"{path} must be at least {schema[lo]} {unit}".rstrip())
    if hi in schema and size > schema[hi]:
        problems.append(f"{path} must be at most {schema[hi]} {unit}".rstrip())
    return problems


def _is_type(value: Any, expected: str | list[str]) -> bool:
    if isinstance(expected, list):
        return any(_is_type(value, e) for e in expected)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return _json_type(value) == expected


def _json_type(value: Any) -> str:
    for kind, name in ((bool, "boolean"), (str, "string"), (dict, "object"), (list, "array")):
        if isinstance(value, kind):
            return name
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    return "number" if isinstance(value, float) else type(value).__name__


class ToolBox:
    """The tools of one seat, by name; runs calls and never raises for bad calls."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for item in tools:
            if item.name in self.tools:
                raise ValueError(f"two tools are named {item.name!r}")
            self.tools[item.name] = item

    def specs(self) -> list[dict[str, Any]]:
        """Every tool in the OpenAI function-calling format (for ``tools=`` of a chat API)."""
        return [item.spec() for item in self.tools.values()]

    def describe(self) -> str:
        """One line per tool, for observations and system prompts."""
        return "\n".join(f"- {item.signature_line()}" for item in self.tools.values())

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; failures come back as ``ToolResult.error`` with the reason."""
        found = self.tools.get(call.name)
        if found is None:
            known = ", ".join(self.tools) or "none"
            return _error(call, f"unknown tool {call.name!r}; available tools: {known}")
        try:
            arguments = load_json(call.arguments or "{}")
        except ValueError as exc:
            return _error(call, f"bad arguments: not JSON ({exc})")
        problems = validate(found.parameters, arguments)
        if problems:
            return _error(call, "bad arguments: " + "; ".join(problems))
        try:
            value = found.fn(**arguments)
        except ToolFailure as exc:
            return _error(call, str(exc))
        except TimeoutError as exc:
            return _error(call, f"timeout: {exc or 'the tool took too long'}")
        except Exception as exc:  # a crashing tool is reported to the caller, not raised
            return _error(call, f"the tool raised {type(exc).__name__}: {exc}")
        try:
            content = value if isinstance(value, str) else json.dumps(value, default=str)
        except (ValueError, RecursionError) as exc:  # a tool result that has no JSON form
            return _error(call, f"the tool's result has no JSON form: {exc}")
        return ToolResult(call_id=call.call_id, name=call.name, content=content)


def _error(call: ToolCall, reason: str) -> ToolResult:
    return ToolResult(call_id=call.call_id, name=call.name, error=reason)


MAX_JSON_CHARS = 1_000_000
"""Longest JSON text :func:`load_json` parses (actions are far shorter; a ToolCall built
elsewhere may not be)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects :func:`load_json` accepts (far below the depth at
which re-encoding the value would hit Python's recursion limit inside a deep call stack)."""
MAX_INT_DIGITS = 4300
"""Most digits of an integer :func:`load_json` accepts: Python's default limit, fixed here so
that an interpreter started with a higher one (``PYTHONINTMAXSTRDIGITS=0``) is bounded too."""


def _bounded_int(text: str) -> int:
    digits = len(text) - (text[:1] == "-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer has {digits} digits; at most {MAX_INT_DIGITS}")
    return int(text)


def load_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` with bounds (module docstring); raises ``ValueError`` with the reason.

    Never raises anything else for any ``str``: ``RecursionError`` from deep nesting and
    Python's integer-size limit both come back as ``ValueError``.
    """
    if len(text) > MAX_JSON_CHARS:
        raise ValueError(f"the JSON text has {len(text)} characters; at most {MAX_JSON_CHARS}")
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except RecursionError as exc:
        raise ValueError(f"nested deeper than {max_depth} levels") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from exc
    # Depth is counted, and lone surrogates replaced, without recursion (the value is in
    # memory already, its size bounded by the text's).
    if isinstance(value, str):
        return _whole(value)
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            if not all(key.isascii() for key in item):
                fixed = {_whole(key): child for key, child in item.items()}
                item.clear()
                item.update(fixed)
            slots: Any = item.items()
        else:
            slots = enumerate(item)
        for slot, child in list(slots):
            if isinstance(child, str):
                if not child.isascii():
                    item[slot] = _whole(child)
            elif isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def _whole(text: str) -> str:
    """``text`` with lone surrogates (``\\ud800`` in JSON) replaced by U+FFFD: they are not
    characters, and UTF-8 (files, the sandbox, the wire) cannot encode them."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def render_result(result: ToolResult) -> str:
    """One observation line for a tool result."""
    if result.error:
        return f"[{result.call_id}] {result.name} -> ERROR: {result.error}"
    return f"[{result.call_id}] {result.name} -> {result.content}"


def ascii_text(text: str, limit: int = 2000) -> str:
    """``text`` cut to ``limit`` characters, with characters outside printable ASCII and
    newline escaped (observations are printable ASCII)."""
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    return "".join(
        ch if ch == "\n" or 32 <= ord(ch) < 127 else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def result_dicts(results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """Results as plain JSON values (``msgspec.to_builtins``), for ``infos``/views.

    Fields at their default are left out (``error`` is absent on success, ``content`` on
    failure); ``kind`` is ``"tool_result"``, as on the wire. Text fields go through
    :func:`ascii_text` (a tool may echo what a caller sent: NUL, ESC, lone surrogates, which
    the wire cannot carry and observations may not hold).
    """
    out: list[dict[str, Any]] = []
    for result in results:
        plain = msgspec.to_builtins(result)
        for key in ("call_id", "name", "content", "error"):
            if isinstance(plain.get(key), str):
                plain[key] = ascii_text(plain[key], limit=_RESULT_LIMIT)
        out.append(plain)
    return out


_RESULT_LIMIT = 20_000


def tool_results(info: Mapping[str, Any]) -> list[ToolResult]:
    """The :class:`ToolResult` structs a scenario put in ``info["view"]["tool_results"]``.

    For agents that work with the protocol structs (remote agents get the same dicts).
    """
    view = info.get("view", {})
    raw = view.get("tool_results", []) if isinstance(view, Mapping) else []
    return [msgspec.convert(item, ToolResult) for item in raw]


def encode_turn(calls: Sequence[ToolCall] = (), **fields: Any) -> str:
    """The action text for ``calls`` plus final keys (``answer=...``, ``message=...``).

    The inverse of :func:`parse_turn`: an agent holding :class:`ToolCall` structs (from a
    chat API's function calls, say) turns them into the scenario's action syntax.
    """
    obj: dict[str, Any] = dict(fields)
    if calls:
        obj["tool_calls"] = [
            {"id": c.call_id, "name": c.name, "arguments": json.loads(c.arguments or "{}")}
            for c in calls
        ]
    return json.dumps(obj)


# Keywords every structured-output backend compiles (see arena/inference/backends/constraints.py).
_CONSTRAINT_KEYS = frozenset(
    {"type", "properties", "items", "enum", "const", "anyOf", "oneOf", "minItems", "maxItems"}
)


def _constrainable(schema: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in _CONSTRAINT_KEYS:
            continue
        if key == "properties":
            value = {name: _constrainable(sub) for name, sub in value.items()}
        elif key == "items":
            value = _constrainable(value)
        elif key in ("anyOf", "oneOf"):
            value = [_constrainable(sub) for sub in value]
        out[key] = value
    return out


def action_schema(
    tools: ToolBox, finals: Mapping[str, Mapping[str, Any]], *, max_calls: int = 4
) -> dict[str, Any]:
    """A JSON schema of the action syntax, for structured output (``Constraint(type="json")``).

    It allows two forms: ``{"tool_calls": [1..max_calls calls]}`` or one final key of
    ``finals`` (``{"answer": {"type": "string"}}``). Every parameter of a tool is emitted, so
    optional ones too; validation keywords the constraint compilers do not support
    (``additionalProperties``, bounds, descriptions) are left out. :func:`parse_turn` accepts
    more (calls and a final key together); the constraint is the simple subset.
    """
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": item.name},
                    "arguments": _constrainable(item.parameters),
                },
            }
            for item in tools.tools.values()
        ]
    }
    calls = {"type": "array", "items": call, "minItems": 1, "maxItems": max_calls}
    forms = [{"type": "object", "properties": {"tool_calls": calls}}]
    forms += [
        {"type": "object", "properties": {key: _constrainable(schema)}}
        for key, schema in finals.items()
    ]
    return {"anyOf": forms}


def action_constraint(
    tools: ToolBox, finals: Mapping[str, Mapping[str, Any]], *, max_calls: int = 4
) -> dict[str, Any]:
    """:func:`action_schema` as the fields of a ``json`` :class:`Constraint` (for ``infos``)."""
    schema = action_schema(tools, finals, max_calls=max_calls)
    return {"type": "json", "json_schema": json.dumps(schema)}


@dataclass(frozen=True)
class Turn:
    """One parsed action: its tool calls and the other keys of the JSON object."""

    calls: list[ToolCall] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)


_FENCE = re.compile(r"```(?:json)?\s*(\{.*\})\s*```", re.DOTALL)


def parse_turn(text: str, *, turn: int = 0, max_calls: int = 8) -> Turn | str:
    """Parse the shared action syntax (module docstring); return a :class:`Turn` or a reason."""
    obj = _json_object(text)
    if isinstance(obj, str):
        return obj
    if obj is None:
        return 'the action must be one JSON object such as {"tool_calls": [...]} (see the rules)'
    raw_calls = obj.pop("tool_calls", [])
    if not isinstance(raw_calls, list):
        return '"tool_calls" must be a list of {"name": ..., "arguments": {...}}'
    if len(raw_calls) > max_calls:
        return f"at most {max_calls} tool calls per turn, got {len(raw_calls)}"
    calls: list[ToolCall] = []
    for i, raw in enumerate(raw_calls):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            return f'tool call {i} must be an object with a string "name"'
        args = raw.get("arguments", {})
        if not isinstance(args, str):
            args = json.dumps(args)
        given = raw.get("id")
        call_id = given if isinstance(given, str) else f"call_{turn}_{i}"
        calls.append(ToolCall(call_id=call_id, name=raw["name"], arguments=args))
    return Turn(calls, obj)


def _json_object(text: str) -> dict[str, Any] | str | None:
    """The action's JSON object; a reason (str) when one parsed but broke a bound."""
    candidates = [text.strip()]
    fenced = _FENCE.search(text)
    if fenced:
        candidates.append(fenced.group(1))
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    bound: str | None = None
    for candidate in candidates:
        try:
            value = load_json(candidate)
        except ValueError as exc:
            if not isinstance(exc.__cause__, json.JSONDecodeError):
                bound = bound or f"the action's JSON is refused: {exc}"
            continue
        if isinstance(value, dict):
            return value
    return bound
