"""Scripted agents for the tool-use scenarios: oracles that solve every task, naive contrasts.

The oracles act only through the scenario's public interface (tool calls and messages in the
documented JSON syntax). :class:`CalcOracle` rebuilds the reference from its view (the problem
it is shown); :class:`RetailOracle` needs what the assistant may not know (the customer's hidden
goal) and is ``privileged``: it reads ``info["oracle"]``, which the runner gives only to
in-process agents of such classes (:meth:`parley.scenarios.base.Scenario.oracle`). Every task an
oracle solves is a task proven solvable, with a reference the scenario accepts.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Observation
from parley.scenarios.base import ORACLE_KEY
from parley.scenarios.tool_use.calc_chain import build_problem
from parley.scenarios.tool_use.retail_db import dollars, parse_dollars
from parley.scenarios.tools.calculator import evaluate, round_to

__all__ = [
    "CalcNaive",
    "CalcOracle",
    "RetailAnswerer",
    "RetailNaive",
    "RetailOracle",
    "RetailUser",
]


def _view(observation: Observation) -> dict[str, Any]:
    view = observation.info.get("view", {})
    return view if isinstance(view, dict) else {}


def _two_places(value: Fraction) -> str:
    return f"{Decimal(round_to(value, 2).numerator) / Decimal(round_to(value, 2).denominator):.2f}"


class CalcOracle(ScriptedAgent):
    """Runs the reference tool chain one call per turn, then answers (solves every problem)."""

    name = "calc-oracle"

    def new_episode(self) -> None:
        self.results: list[str] = []
        self.asked = 0

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        for result in view.get("tool_results", []):
            self.results.append(str(result.get("content", "")))
        problem = build_problem(str(view.get("template")), list(view.get("quantities", [])))
        if self.asked < len(problem.steps):
            step = problem.steps[self.asked]
            self.asked += 1
            args = {k: v.format(*self.results) for k, v in step.arguments.items()}
            return json.dumps({"tool_calls": [{"name": step.tool, "arguments": args}]})
        return json.dumps({"answer": _two_places(Fraction(self.results[-1]))})


_ROUGH = {
    "fuel": "{0} / {1} * 3.8 * {2}",
    "shopping": "{0} * {1} * (1 - {2}/100) * (1 + {3}/100)",
    "interest": "{0} * (1 + {1}/100) ** {2}",
    "pace": "{1} / ({0} / 1.6)",
    "shipping": "{0} * {1} * 0.45 * {2}",
    "flooring": "{0} * {1} * 0.093 * {2}",
    "oven": "({0} - 32) / 1.8 - {1}",
}


class CalcNaive(ScriptedAgent):
    """Answers at once, in its head: whole-number quantities, rounded factors, no tools."""

    name = "calc-naive"

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        whole = [str(round(float(q))) for q in view.get("quantities", [])]
        rough = _ROUGH.get(str(view.get("template")), "0").format(*whole)
        return json.dumps({"answer": _two_places(evaluate(rough))})


# --- retail-desk ---------------------------------------------------------------------------


class RetailUser(ScriptedAgent):
    """The scripted customer: states its request, confirms once when asked, then stops."""

    name = "retail-user"

    def new_episode(self) -> None:
        self.spoke = False
        self.confirmed = False

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        if not self.spoke:
            self.spoke = True
            return str(view.get("opening", "Hello."))
        last = str(view.get("last_message", ""))
        if "?" in last and not self.confirmed:
            self.confirmed = True
            return "Yes, please go ahead."
        return "Thank you, that is all. ###STOP###"


def _reference(observation: Observation, agent: str) -> dict[str, Any]:
    oracle = observation.info.get(ORACLE_KEY)
    if not isinstance(oracle, dict) or "email" not in oracle:
        raise ConfigError(
            f"{agent} needs the scenario's privileged oracle data; the runner gives it "
            "only to in-process agents (it cannot play a remote seat)"
        )
    return oracle


class RetailOracle(ScriptedAgent):
    """Performs the task's reference actions through the tools and states the required facts.

    Privileged: reads the reference from ``info["oracle"]`` (never sent to remote agents).
    """

    name = "retail-oracle"
    privileged = True

    def new_episode(self) -> None:
        self.done = False

    def decide(self, observation: Observation) -> str:
        oracle = _reference(observation, "RetailOracle")
        if self.done:
            return json.dumps({"message": "Is there anything else I can help with today"})
        self.done = True
        calls = [{"name": "find_customer", "arguments": {"email": oracle["email"]}}]
        calls += [{"name": name, "arguments": args} for name, args in oracle["actions"]]
        message = "All done. " + " ".join(oracle["facts"]) + "."
        return json.dumps({"tool_calls": calls, "message": message})


class RetailAnswerer(ScriptedAgent):
    """retail-desk-v3's baseline: authenticates the customer, performs the task's reference
    actions and looks up the order asked about, then answers exactly the fields asked with
    the values its tool results show (never the reference's facts).

    Privileged: the actions and the fields asked come from ``info["oracle"]``.
    """

    name = "retail-answerer"
    privileged = True

    def new_episode(self) -> None:
        self.turn = 0

    def decide(self, observation: Observation) -> str:
        oracle = _reference(observation, "RetailAnswerer")
        self.turn += 1
        if self.turn == 1:
            calls = [{"name": "find_customer", "arguments": {"email": oracle["email"]}}]
            calls += [{"name": name, "arguments": args} for name, args in oracle["actions"]]
            if oracle.get("about"):
                calls.append({"name": "get_order", "arguments": {"order_id": oracle["about"]}})
            return json.dumps({"tool_calls": calls})
        if self.turn > 2:
            return json.dumps({"message": "Is there anything else I can help with today"})
        found = _results(_view(observation).get("tool_results", []))
        refund = sum(parse_dollars(r["refund"]) or 0 for r in found if "refund" in r)
        facts = {"refund": dollars(refund)}
        for result in found:
            if "new_total" in result:
                facts["new_total"] = result["new_total"]
            if result.get("order_id") == oracle.get("about") and "total" in result:
                facts.update(status=result["status"], total=result["total"])
        answer = {key: facts[key] for key in oracle["ask"]}
        return json.dumps({"message": "All done.", "answer": answer})


def _results(raw: list[Any]) -> list[dict[str, Any]]:
    """The JSON objects among tool results (errors and other text left out)."""
    found = []
    for result in raw:
        try:
            value = json.loads(str(result.get("content", "")))
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


_ORDER_ID = re.compile(r"#W\d+")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


class RetailNaive(ScriptedAgent):
    """Looks up the first order the customer names and reads it out; never changes anything.

    Solves the status questions only: the contrast to :class:`RetailOracle`.
    """

    name = "retail-naive"

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        results = view.get("tool_results", [])
        if results:
            found = results[-1]
            content = str(found.get("content") or found.get("error"))
            return json.dumps({"message": f"Here is what I found: {content}"})
        said = str(view.get("last_message", ""))
        order, email = _ORDER_ID.search(said), _EMAIL.search(said)
        if order is None or email is None:
            return json.dumps({"message": "Could you tell me your email and order number?"})
        calls = [
            {"name": "find_customer", "arguments": {"email": email.group(0)}},
            {"name": "get_order", "arguments": {"order_id": order.group(0)}},
        ]
        return json.dumps({"tool_calls": calls})
