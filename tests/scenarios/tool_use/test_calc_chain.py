"""calc-chain-v0: the exact calculator, the oracle solves every problem, the naive guess fails."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from parley.agents.scripted.tool_use import CalcNaive, CalcOracle
from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.tool_use.calc_chain import TEMPLATES, generate_problem
from parley.scenarios.tools.calculator import CalcError, convert, evaluate, format_number

ID = "tool_use/calc-chain-v0"


def test_calculator_is_exact_and_refuses_code() -> None:
    assert evaluate("0.1 + 0.2") == Fraction(3, 10)
    assert evaluate("round(2.675, 2)") == Fraction("2.68")  # half up, not binary float
    assert evaluate("2 ** 10 // 3 % 7") == 341 % 7
    assert format_number(evaluate("1/3")) == "0.3333333333"
    for bad in ("__import__('os')", "(1).__class__", "x + 1", "9 ** 9 ** 9", "1/0", "[1, 2]"):
        with pytest.raises(CalcError):
            evaluate(bad)


def test_conversions_use_exact_factors() -> None:
    assert convert(Fraction(1), "mi", "km") == Fraction("1.609344")
    assert convert(Fraction(212), "degF", "degC") == 100
    assert convert(Fraction(100), "degC", "degF") == 212
    with pytest.raises(CalcError, match="cannot convert"):
        convert(Fraction(1), "kg", "m")


def test_every_template_appears_across_seeds() -> None:
    seen = {generate_problem(np.random.default_rng(seed)).template for seed in range(60)}
    assert seen == set(TEMPLATES)


def _success(agent: object, seed: int) -> float:
    record = play_episode(ID, seed=seed, agents={"solver": agent})
    return json.loads(record[-1][1])["success"]


def test_oracle_solves_every_problem_and_naive_does_not() -> None:
    seeds = range(40)
    oracle = [_success(CalcOracle(), seed) for seed in seeds]
    naive = [_success(CalcNaive(), seed) for seed in seeds]
    assert oracle == [1.0] * len(seeds)
    assert sum(naive) < len(seeds) / 4


def test_tool_errors_and_invalid_actions_come_back_in_the_observation() -> None:
    env = make(ID)
    observations, infos = env.reset(seed=3)
    assert "calculate(expression: string)" in observations["solver"]
    assert [t["function"]["name"] for t in infos["solver"]["view"]["tools"]] == [
        "calculate",
        "convert",
    ]
    calls = [
        {"name": "calculate", "arguments": {"expression": "import os"}},
        {"name": "nope", "arguments": {}},
        {"name": "convert", "arguments": {"value": "1"}},
        {"name": "calculate", "arguments": '{"expression": "6*7"}'},
    ]
    observations, _, _, _, infos = env.step({"solver": json.dumps({"tool_calls": calls})})
    text = observations["solver"]
    assert "calculate -> ERROR: not an arithmetic expression" in text
    assert "unknown tool 'nope'" in text
    assert "arguments.from_unit is required" in text
    assert "[call_0_3] calculate -> 42" in text
    assert ["error" in r for r in infos["solver"]["view"]["tool_results"]] == [
        True,
        True,
        True,
        False,
    ]
    _, _, _, _, infos = env.step({"solver": "the answer is probably 12"})
    assert infos["solver"]["invalid"].startswith("the action must be one JSON object")
    _, _, terminations, _, infos = env.step({"solver": '{"answer": "12.5"}'})
    assert terminations["solver"]
    assert infos["solver"]["components"]["task"] == 0.0
    assert infos["solver"]["components"]["format"] == 0.0  # one decimal, not two
    assert env.episode_metrics()["success"] == 0.0


def test_no_answer_within_the_turn_limit_scores_zero() -> None:
    env = make(ID, max_turns=2)
    env.reset(seed=0)
    call = json.dumps({"tool_calls": [{"name": "calculate", "arguments": {"expression": "1"}}]})
    env.step({"solver": call})
    _, rewards, terminations, _, _ = env.step({"solver": call})
    assert terminations["solver"]
    assert rewards["solver"] == 0.0
    assert env.episode_metrics()["success"] == 0.0
