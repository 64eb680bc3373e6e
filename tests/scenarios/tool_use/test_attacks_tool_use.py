"""Red-team attacks on the latest tool-use scenarios (calc-chain-v1, research-team-v0,
retail-desk-v3) that
their own test files do not try, as an RL policy would. Each attack held: the tests pin that
it scores the documented floor, so a change that opens the hole fails here."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from parley.agents.scripted.tool_use import RetailUser
from parley.protocols.messages import Observation
from parley.scenarios import make
from parley.scenarios.tool_use.calc_chain import accepted_answers
from parley.scenarios.tool_use.retail_desk import build_task
from parley.scenarios.tool_use.retail_desk_v3 import answer_key

CALC = "tool_use/calc-chain-v1"
RESEARCH = "tool_use/research-team-v0"
RESEARCH_SEATS = ("biographer", "geographer")
RETAIL = "tool_use/retail-desk-v3"


def _hedges(right: str, wrong: str) -> list[Any]:
    """Answers that commit to two values, the right one among them."""
    return [
        f"{right} {wrong}",
        f"{right} or {wrong}",
        f"{right},{wrong}",
        f"{right}\n{wrong}",
        f"between {right} and {wrong}",
        [right, wrong],
        {"value": right, "other": wrong},
        f"{right}|{wrong}",
    ]


@pytest.mark.parametrize("difficulty", [None, 2])
def test_an_answer_hedging_between_two_values_scores_nothing(difficulty: int | None) -> None:
    """The answer is one number: two candidates in one answer (as text, a list or an object)
    are wrong even when one of them is the reference, and earn no format reward either."""
    for seed in range(6):
        probe = make(CALC, difficulty=difficulty)
        probe.reset(seed=seed)
        right = min(accepted_answers(probe.chain.problem))
        right_text = f"{Decimal(right.numerator) / Decimal(right.denominator):.2f}"
        wrong_text = f"{Decimal(right_text) + Decimal('0.01'):.2f}"
        for hedge in _hedges(right_text, wrong_text):
            env = make(CALC, difficulty=difficulty)
            env.reset(seed=seed)
            *_, infos = env.step({"solver": json.dumps({"answer": hedge})})
            assert not env.agents
            components = infos["solver"]["components"]
            assert components["task"] == 0.0, (seed, hedge)
            assert components["format"] == 0.0, (seed, hedge)
        env = make(CALC, difficulty=difficulty)
        env.reset(seed=seed)
        *_, infos = env.step({"solver": json.dumps({"answer": right_text})})
        assert infos["solver"]["components"]["task"] == 1.0  # the one right value pays


@pytest.mark.parametrize("joiner", ["-", "/", "..", " to ", "~"])
def test_a_range_of_years_around_the_reference_scores_nothing(joiner: str) -> None:
    """A year question answered with a range that holds the reference (``1843-1844``) names
    two numbers: answer spraying, 0, whatever joins them."""
    asked = 0
    for seed in range(24):
        env = make(RESEARCH)
        env.reset(seed=seed)
        reference = env.reference()
        if not reference.isdigit():
            continue
        asked += 1
        spray = f"{reference}{joiner}{int(reference) + 1}"
        *_, infos = env.step({seat: json.dumps({"answer": spray}) for seat in RESEARCH_SEATS})
        assert not env.agents
        assert all(infos[seat]["components"]["task"] == 0.0 for seat in infos), (seed, spray)
    assert asked >= 4


def _user_reply_to(task: int, answer: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """The scripted customer's reply to an assistant that performed ``task`` and then gave
    ``answer`` with a question, and the customer's view at that point."""
    env = make(RETAIL, task=task)
    env.reset(seed=0)
    reference = build_task(task)
    env.step({"user": reference.opening, "assistant": ""})
    calls = [{"name": "find_customer", "arguments": {"email": reference.email}}]
    calls += [{"name": name, "arguments": dict(args)} for name, args in reference.actions]
    env.step({"user": "", "assistant": json.dumps({"tool_calls": calls})})
    move = {"message": "Anything else?", "answer": answer}
    observations, *_, infos = env.step({"user": "", "assistant": json.dumps(move)})
    user = RetailUser()
    user.reset(seed=0)
    user.spoke = True
    seen = Observation(agent="user", text=observations["user"], info=infos["user"])
    return user.decide(seen), infos["user"]["view"]


def test_the_customer_is_no_oracle_for_the_answer() -> None:
    """The last answer counts, so a policy could try answers one by one if the customer's
    reaction told a right one from a wrong one: the scripted customer replies the same to
    both, and its view does not grade the answer."""
    for task in range(12):
        right = answer_key(build_task(task))
        wrong = {key: ("$0.01" if key != "status" else "pending") for key in right}
        if wrong == right:
            wrong = {key: ("$0.02" if key != "status" else "delivered") for key in right}
        said_right, view_right = _user_reply_to(task, right)
        said_wrong, view_wrong = _user_reply_to(task, wrong)
        assert said_right == said_wrong, task
        assert set(view_right) == set(view_wrong) == {"goal", "opening", "last_message"}
        assert view_right["goal"] == view_wrong["goal"]
