"""The tools layer: schema derivation, validation, ToolBox error reporting, the action syntax."""

from __future__ import annotations

import json
from typing import Literal

import msgspec
import pytest

from parley.protocols.codec import Codec
from parley.protocols.messages import Envelope, Observation, ToolCall, ToolResult
from parley.scenarios.tools import (
    ToolBox,
    ToolFailure,
    Turn,
    encode_turn,
    parse_turn,
    tool,
    tool_results,
    validate,
)
from parley.scenarios.tools.tool import result_dicts


@tool
def lookup(order_id: str, fields: list[str], mode: Literal["brief", "full"] = "brief") -> dict:
    """Look an order up.

    Args:
        order_id: the order's id
        fields: which fields to show
        mode: how much to show
    """
    if order_id == "#404":
        raise ToolFailure("order #404 not found")
    if order_id == "#500":
        raise RuntimeError("database exploded")
    if order_id == "#slow":
        raise TimeoutError("gave up after 1 s")
    return {"order_id": order_id, "fields": fields, "mode": mode}


def _call(arguments: object, name: str = "lookup") -> ToolResult:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolBox([lookup]).call(ToolCall(call_id="c1", name=name, arguments=raw))


def test_schema_is_derived_from_signature_and_docstring() -> None:
    spec = lookup.spec()
    assert spec["type"] == "function"
    function = spec["function"]
    assert function["name"] == "lookup"
    assert function["description"] == "Look an order up."
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "description": "the order's id"},
            "fields": {
                "type": "array",
                "items": {"type": "string"},
                "description": "which fields to show",
            },
            "mode": {"enum": ["brief", "full"], "description": "how much to show"},
        },
        "required": ["order_id", "fields"],
        "additionalProperties": False,
    }
    assert lookup.signature_line().startswith(
        'lookup(order_id: string, fields: list[string], mode?: "brief"|"full")'
    )


def test_explicit_schema_and_name_win() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}}}
    double = tool(lambda x: 2 * x, name="double", description="Double x.", parameters=schema)
    box = ToolBox([double])
    assert box.call(ToolCall(call_id="a", name="double", arguments='{"x": 4}')).content == "8"
    error = box.call(ToolCall(call_id="b", name="double", arguments='{"x": -1}')).error
    assert error == "bad arguments: arguments.x must be at least 0"


def test_unannotated_types_without_schema_are_refused() -> None:
    with pytest.raises(TypeError, match="'x' has no annotation"):
        tool(lambda x: x)

    def takes_object(x: object) -> None:
        """Nothing."""

    with pytest.raises(TypeError, match="parameters="):
        tool(takes_object)


def test_validate_reports_every_problem() -> None:
    problems = validate(
        lookup.parameters, {"fields": ["a", 3], "mode": "huge", "extra": True, "order_id": 7}
    )
    assert problems == [  # in the order of the arguments
        "arguments.fields[1] must be string, got integer",
        'arguments.mode must be one of ["brief", "full"], got \'huge\'',
        "arguments.extra is not a parameter (known: order_id, fields, mode)",
        "arguments.order_id must be string, got integer",
    ]
    assert validate({"type": "integer"}, True) == ["arguments must be integer, got boolean"]
    assert validate({"type": "number"}, 3) == []
    assert validate({"type": "array", "maxItems": 1}, [1, 2]) == [
        "arguments must be at most 1 items"
    ]


def test_toolbox_turns_every_failure_into_an_error_result() -> None:
    ok = _call({"order_id": "#1", "fields": ["total"]})
    assert ok.error == ""
    assert json.loads(ok.content) == {"order_id": "#1", "fields": ["total"], "mode": "brief"}
    assert _call({}, name="rm").error == "unknown tool 'rm'; available tools: lookup"
    assert _call("{not json").error.startswith("bad arguments: not JSON")
    assert _call({"fields": []}).error == "bad arguments: arguments.order_id is required"
    assert _call({"order_id": "#404", "fields": []}).error == "order #404 not found"
    crashed = _call({"order_id": "#500", "fields": []}).error
    assert crashed == "the tool raised RuntimeError: database exploded"
    assert _call({"order_id": "#slow", "fields": []}).error == "timeout: gave up after 1 s"
    assert _call({"order_id": "#1", "fields": []}).call_id == "c1"


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ValueError, match="two tools"):
        ToolBox([lookup, lookup])


def test_parse_turn_accepts_the_documented_forms() -> None:
    calls = [{"name": "a", "arguments": '{"x": 1}'}, {"name": "b", "id": "mine"}]
    text = "Sure!\n```json\n" + json.dumps({"tool_calls": calls, "answer": "4"}) + "\n```"
    turn = parse_turn(text, turn=3)
    assert isinstance(turn, Turn)
    assert [c.call_id for c in turn.calls] == ["call_3_0", "mine"]
    assert [c.arguments for c in turn.calls] == ['{"x": 1}', "{}"]
    assert turn.fields == {"answer": "4"}
    assert parse_turn('{"answer": "4"}') == Turn([], {"answer": "4"})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no json here", "one JSON object"),
        ("[1, 2]", "one JSON object"),
        ('{"tool_calls": {"name": "a"}}', "must be a list"),
        ('{"tool_calls": [{"arguments": {}}]}', 'string "name"'),
        (json.dumps({"tool_calls": [{"name": "a"}] * 9}), "at most 8"),
    ],
)
def test_parse_turn_explains_bad_actions(text: str, reason: str) -> None:
    parsed = parse_turn(text)
    assert isinstance(parsed, str)
    assert reason in parsed


def test_structs_travel_through_the_codec_and_round_trip_the_action_syntax() -> None:
    """A remote agent's path: ToolCall structs -> action text; ToolResult dicts -> structs."""
    calls = [ToolCall(call_id="r1", name="lookup", arguments='{"order_id": "#1", "fields": []}')]
    text = encode_turn(calls, message="one moment")
    turn = parse_turn(text)
    assert isinstance(turn, Turn)
    assert turn.calls == calls
    assert turn.fields == {"message": "one moment"}
    results = [ToolBox([lookup]).call(c) for c in turn.calls] + [_call({}, name="rm")]
    info = {"view": {"tool_results": result_dicts(results)}}
    codec = Codec()
    observation = Observation(agent="assistant", text="...", info=info)
    received = codec.decode(codec.encode(Envelope(body=observation))).body
    assert isinstance(received, Observation)
    assert tool_results(received.info) == results
    for result in results:
        wire = codec.decode(codec.encode(Envelope(body=result))).body
        assert wire == result
    assert msgspec.to_builtins(results[1])["kind"] == "tool_result"


@pytest.mark.parametrize(
    ("scenario_id", "kwargs"),
    [
        ("tool_use/calc-chain-v0", {}),
        ("tool_use/retail-desk-v0", {}),
        ("code/debug-v0", {"reviewer": True}),
    ],
)
def test_action_constraints_compile_and_accept_their_forms(
    scenario_id: str, kwargs: dict[str, object]
) -> None:
    """The structured-output constraint of every tool seat compiles for the transformers
    backend, and an action written in its form is one the scenario parses."""
    pytest.importorskip("regex")
    from parley.arena.inference.backends.constraints import check_constraint, matches
    from parley.protocols.messages import Constraint
    from parley.scenarios import make

    env = make(scenario_id, **kwargs)
    env.reset(seed=0)
    seats = [s for s in env.possible_agents if env.constraint(s) is not None]
    assert seats
    for seat in seats:
        constraint = msgspec.convert(env.constraint(seat), Constraint)
        check_constraint(constraint)
        schema = json.loads(constraint.json_schema)
        final = next(iter(schema["anyOf"][1]["properties"]))
        first_call = schema["anyOf"][0]["properties"]["tool_calls"]["items"]["anyOf"][0]
        name = first_call["properties"]["name"]["const"]
        params = first_call["properties"]["arguments"]["properties"]
        arguments = {k: p["enum"][0] if "enum" in p else "x" for k, p in params.items()}
        call_text = json.dumps({"tool_calls": [{"name": name, "arguments": arguments}]})
        final_text = json.dumps({final: "done"})
        for text in (call_text, final_text):
            assert matches(constraint, text), text
            assert isinstance(parse_turn(text), Turn)
        assert not matches(constraint, "I think the answer is 4")
