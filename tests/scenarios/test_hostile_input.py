"""Hostile actions are cheap and safe: bounded number and JSON parsing, escaped observations,
clear errors for callers that break ``step``'s contract (issue 10, section 3)."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import pytest

from parley.scenarios import make
from parley.scenarios.base import StepContractError, printable
from parley.scenarios.tools.calculator import CalcError, evaluate, parse_number
from parley.scenarios.tools.tool import MAX_JSON_DEPTH, load_json, parse_turn


def _cpu(fn: Any, *args: Any) -> float:
    start = time.thread_time()
    fn(*args)
    return time.thread_time() - start


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
        '{"a":' * 200 + "1" + "}" * 200,
        '{"a": ' + "7" * 4301 + "}",
        '{"a": -' + "7" * 5000 + "}",
        '"' + "x" * 1_000_001 + '"',
    ],
)
def test_load_json_refuses_past_its_bounds_with_a_value_error(text: str) -> None:
    start = time.thread_time()
    with pytest.raises(ValueError):
        load_json(text)
    assert time.thread_time() - start < 0.05


def test_load_json_keeps_what_plain_json_accepts_within_bounds() -> None:
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert load_json(nested) is not None
    assert load_json('{"a": ' + "7" * 4300 + "}")["a"] > 0
    assert load_json('{"a": 1e999999999}') == {"a": float("inf")}
    assert load_json('"\\ud800\\u0000\\ud83e\\udd1d"') == "\ufffd\x00\U0001f91d"


@pytest.mark.parametrize(
    "action",
    [
        '{"tool_calls": ' + "[" * 500 + "]" * 500 + "}",
        '{"answer": ' + "[" * 90 + "]" * 90 + "}",
        '{"answer": ' + "1" * 4400 + "}",
        'junk {"tool_calls": [{"name": "x", "arguments": ' + "[" * 80 + "]" * 80 + "}]} junk",
    ],
)
def test_parse_turn_makes_bound_breaks_a_reason_not_an_exception(action: str) -> None:
    reason = parse_turn(action)
    assert isinstance(reason, str)
    assert "refused" in reason


@pytest.mark.parametrize(
    "text", ["1e999999999", "-1E+999999999", "1e-999999999", "1_0e99_999_999", "7e1001"]
)
def test_parse_number_is_bounded(text: str) -> None:
    assert _cpu(parse_number, text) < 0.01
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("text", "value"), [("42.16", "1054/25"), ("7/4", "7/4"), (" -3e2 ", "-300"), ("1e1000", None)]
)
def test_parse_number_reads_what_fraction_reads(text: str, value: str | None) -> None:
    from fractions import Fraction

    expected = Fraction(text) if value is not None else None
    assert parse_number(text) == expected or (value is None and parse_number(text) is not None)


@pytest.mark.parametrize("expression", ["1e999999999", "round(1, 999999999)", "1/0", "2**65"])
def test_calculator_failures_are_calc_errors(expression: str) -> None:
    with pytest.raises(CalcError):
        evaluate(expression)


@pytest.mark.parametrize(
    "expression",
    ["1e999999999", "9" * 400, "round(1/3, 150)", "sqrt(1e308)", "-" * 498 + "1", "1" * 501],
)
def test_calculator_tool_answers_hostile_expressions_with_its_own_reason(expression: str) -> None:
    from parley.protocols.messages import ToolCall
    from parley.scenarios.tool_use.calc_chain import calc_tools

    call = ToolCall(call_id="c", name="calculate", arguments=json.dumps({"expression": expression}))
    start = time.thread_time()
    result = calc_tools().call(call)
    assert time.thread_time() - start < 0.05
    assert result.error is None or "the tool raised" not in result.error, result.error


@pytest.mark.parametrize(
    "answer",
    ['{"answer": "1e999999999"}', '{"answer": 1e999999999}', '{"answer": "9e-999999999"}'],
)
def test_calc_chain_grades_huge_exponents_in_bounded_time(answer: str) -> None:
    env = make("tool_use/calc-chain-v0")
    env.reset(seed=0)
    start = time.thread_time()
    _, rewards, terminations, _, _ = env.step({"solver": answer})
    assert time.thread_time() - start < 0.05
    assert terminations["solver"]
    assert rewards["solver"] == 0.0


@pytest.mark.parametrize(
    ("scenario_id", "seat", "action"),
    [
        ("tool_use/calc-chain-v0", "solver", '{"answer": "\\u00e9\\ud800\\u0000\\u001b[2J"}'),
        (
            "tool_use/calc-chain-v0",
            "solver",
            '{"tool_calls": [{"name": "calculate", "arguments": {"expression": "\\ud800"}}]}',
        ),
        (
            "tool_use/retail-desk-v0",
            "assistant",
            '{"tool_calls": [{"name": "find_customer", "arguments": {"email": "\\udfff\\u0000"}}],'
            ' "message": "\\ud800 caf\\u00e9 \\u001b[31m"}',
        ),
    ],
)
def test_json_escapes_never_reach_observations_or_infos_raw(
    scenario_id: str, seat: str, action: str
) -> None:
    env = make(scenario_id)
    env.reset(seed=0)
    if seat == "assistant":
        env.step({"user": "hello", "assistant": ""})
    for _ in range(2):
        actions = {a: (action if a == seat else "Thanks. ###STOP###") for a in env.agents}
        observations, _, _, _, infos = env.step(actions)
        for agent, text in observations.items():
            assert env.observation_space(agent).contains(text), text[-300:]
            msgspec.msgpack.encode(infos[agent])  # a lone surrogate cannot be encoded
            json.dumps(infos[agent], ensure_ascii=False).encode("utf-8")
        if not env.agents:
            break


def test_printable_escapes_only_what_is_outside_the_charset() -> None:
    assert printable("plain text\nline 2") == "plain text\nline 2"
    assert printable("a\x00b\x1bc\td\u00e9\ud800") == "a\\x00b\\x1bc\\x09d\\xe9\\ud800"


@pytest.mark.parametrize("actions", [["solver"], "solver", None, [("solver", "x")]])
def test_step_with_actions_that_are_not_a_mapping_raises_naming_the_contract(
    actions: Any,
) -> None:
    env = make("tool_use/calc-chain-v0")
    env.reset(seed=0)
    with pytest.raises(StepContractError, match="mapping"):
        env.step(actions)


def test_step_naming_an_unknown_seat_raises_naming_the_live_seats() -> None:
    env = make("negotiation/deal-or-no-deal-v0")
    env.reset(seed=0)
    with pytest.raises(StepContractError, match="not live"):
        env.step({"player_0": "hi", "player_9": "hi"})
    with pytest.raises(TypeError):  # StepContractError is a TypeError too
        env.step({"player_0": "hi", 0: "hi"})
