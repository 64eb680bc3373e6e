"""tool_use/calc-chain-v0 — multi-step word problems that need a calculator and unit conversion.

Each episode is one word problem (fuel cost across units, a shopping bill with discount and
tax, compound interest, a running pace, shipping by weight, flooring by area, a recipe
temperature) whose exact answer, rounded half up to 2 decimals, takes two or three steps with
exact conversion factors: mental arithmetic or rounded factors (1 mile ~ 1.6 km) get it
wrong. The problem comes from ``reset(seed=...)`` (seven templates, random quantities).

Seat: ``solver``.

Tools (results arrive in the next observation, one line per call ``[call_id] name -> result``
or ``[call_id] name -> ERROR: reason``):

- ``calculate(expression)`` — exact arithmetic: numbers, ``+ - * / // % **``, parentheses,
  ``abs min max round floor ceil sqrt``; the result has up to 10 decimals.
- ``convert(value, from_unit, to_unit)`` — ``value`` is a number or an expression; units
  ``m km cm mi ft in kg g lb oz L mL gal s min h degC degF m2 ft2``.

Action: one JSON object per turn (the tool-use syntax of :mod:`parley.scenarios.tools.tool`)::

    {"tool_calls": [{"name": "convert", "arguments": {"value": "26.2", "from_unit": "mi",
                                                       "to_unit": "km"}}]}
    {"answer": "42.16"}

``answer`` ends the episode; tool calls in the same action run first. Anything else is an
invalid move. The episode also ends after ``max_turns`` actions (no answer: reward 0).

Observations: the problem and the tool list first, then the tool results.
``infos["solver"]["view"]`` holds ``template`` and ``quantities`` (what the text says,
structured), ``text``, ``turns_left``, ``tools`` (OpenAI function specs) and ``tool_results``
(the last turn's :class:`~parley.protocols.messages.ToolResult` values as dicts);
``infos["solver"]["constraint"]`` is a ``json`` constraint for structured output (the
tool-call form or the answer form; :func:`parley.scenarios.tools.tool.action_schema`).

Rewards (on the last step):

=========  ==========================================================================
component  value
=========  ==========================================================================
task       1 if the answer equals the reference (rounded half up to 2 decimals), else 0
format     ``format_weight`` (0.1) if the answer is a plain number with exactly 2 decimals
invalid    -``invalid_penalty`` (0.1) per invalid move
=========  ==========================================================================

The reference is the exact value; an answer equal to the value computed through the tools
(which carry 10 decimals between steps) is also accepted.

Metrics: ``success`` (= task), ``format_ok``, ``tool_calls``; ``difficulty`` when set.

Arguments: ``max_turns`` (6), ``format_weight`` (0.1), ``difficulty`` (None), ``invalid_penalty``,
``max_cycles``, ``render_mode``.

``difficulty`` (an integer 0-10; None, the default, keeps the seven templates): every seed
draws a generated problem (:mod:`parley.scenarios.tool_use.calc_chain_gen`, ``template``
``chain``): a quantity with a unit and ``difficulty + 1`` operations in order (the first a
unit conversion; then conversions, ``* / + -`` and percentage changes), each a tool call that
needs the previous result. The scripted oracle makes one call per turn, so it solves every
problem up to ``max_turns - 2`` (4 at the default 6) and none beyond;
``parley train``'s curriculum raises it as success rises.

    >>> env = make("tool_use/calc-chain-v1", difficulty=2)

    >>> env = make("tool_use/calc-chain-v0", max_turns=6)

Version history: v0 — first version. Later fixes that change no score of a finished
episode: answers are read in bounded time (``"1e999999999"`` used to stall ``step`` for hours;
any exponent over 1,000 is a wrong answer, as it always was); JSON nested deeper than 64 levels
or holding integers over 4,300 digits is an invalid move (it used to raise out of ``step``);
text from the action is escaped into the observation charset.
v1 — a move the action space refuses (characters outside the charset, too long) uses
up the seat's turn (:mod:`parley.scenarios.refusals`), so every episode ends within the
scenario's limits; v0 is kept as it was.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from parley.protocols.messages import ToolCall
from parley.scenarios.base import Scenario
from parley.scenarios.declaring import text_metadata, turn_limit
from parley.scenarios.difficulty import check_difficulty
from parley.scenarios.refusals import RefusedMoveTakesTurn
from parley.scenarios.registry import registered
from parley.scenarios.tool_use.calc_chain_gen import (
    CHAIN,
    MAX_DIFFICULTY,
    chain_parts,
    draw_chain,
)
from parley.scenarios.tools.calculator import (
    CalcError,
    convert,
    evaluate,
    format_number,
    parse_number,
    round_to,
)
from parley.scenarios.tools.tool import (
    ToolBox,
    ToolFailure,
    action_constraint,
    parse_turn,
    render_result,
    result_dicts,
    tool,
)

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["CalcChainV0", "CalcChainV1"]

SEAT = "solver"
PLACES = 2
_ANSWER = re.compile(r"^-?\d+\.\d{2}$")


@dataclasses.dataclass(frozen=True)
class Step:
    """One tool call of the reference solution; ``{0}``, ``{1}`` name earlier results."""

    tool: str
    arguments: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Problem:
    template: str
    quantities: tuple[str, ...]
    text: str
    steps: tuple[Step, ...]
    exact: str
    """The exact answer (a fraction as text) before rounding."""


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (numbers, + - * / // % **, parentheses,
    abs min max round floor ceil sqrt).

    Args:
        expression: the expression, e.g. "3.5 * (2 + 4) / 7"
    """
    try:
        return str(format_number(evaluate(expression)))
    except CalcError as exc:
        raise ToolFailure(str(exc)) from exc


def convert_units(value: str, from_unit: str, to_unit: str) -> str:
    """Convert a quantity between units (m km cm mi ft in kg g lb oz L mL gal s min h
    degC degF m2 ft2).

    Args:
        value: a number or an arithmetic expression
        from_unit: the unit of value
        to_unit: the unit wanted
    """
    try:
        return str(format_number(convert(evaluate(value), from_unit, to_unit)))
    except CalcError as exc:
        raise ToolFailure(str(exc)) from exc


def calc_tools() -> ToolBox:
    """The solver's tools."""
    return ToolBox([tool(calculate), tool(convert_units, name="convert")])


def run_steps(steps: tuple[Step, ...], tools: ToolBox) -> list[str]:
    """Run the reference steps through ``tools``; returns every step's result text."""
    results: list[str] = []
    for i, step in enumerate(steps):
        args = {k: v.format(*results) for k, v in step.arguments.items()}
        out = tools.call(ToolCall(call_id=f"ref{i}", name=step.tool, arguments=json.dumps(args)))
        if out.error:
            raise ValueError(f"reference step {i} failed: {out.error}")
        results.append(out.content)
    return results


Built = tuple[str, tuple[Step, ...], str]
"""A template's output: problem text, reference steps, exact expression."""


def _fuel(miles: str, mpg: str, price: str) -> Built:
    text = (
        f"A road trip covers {miles} miles in a car that does {mpg} miles per US gallon. "
        f"Fuel costs {price} dollars per liter. How many dollars does the fuel cost?"
    )
    steps = (
        Step("calculate", {"expression": f"{miles} / {mpg}"}),
        Step("convert", {"value": "{0}", "from_unit": "gal", "to_unit": "L"}),
        Step("calculate", {"expression": "{1} * " + price}),
    )
    return text, steps, f"{miles} / {mpg} * 3.785411784 * {price}"


def _shopping(n: str, price: str, disc: str, tax: str) -> Built:
    text = (
        f"A shop sells {n} identical jackets at {price} dollars each. The bill gets a {disc}% "
        f"discount, and then {tax}% sales tax is added. What is the total in dollars?"
    )
    expr = f"{n} * {price} * (1 - {disc}/100) * (1 + {tax}/100)"
    return text, (Step("calculate", {"expression": expr}),), expr


def _interest(principal: str, rate: str, years: str) -> Built:
    text = (
        f"{principal} dollars are deposited at {rate}% interest per year, compounded yearly. "
        f"How many dollars are in the account after {years} years?"
    )
    expr = f"{principal} * (1 + {rate}/100) ** {years}"
    return text, (Step("calculate", {"expression": expr}),), expr


def _pace(km: str, minutes: str) -> Built:
    text = f"A runner covers {km} km in {minutes} minutes. What is the pace in minutes per mile?"
    steps = (
        Step("convert", {"value": km, "from_unit": "km", "to_unit": "mi"}),
        Step("calculate", {"expression": minutes + " / {0}"}),
    )
    return text, steps, f"{minutes} / ({km} * 1000 / 1609.344)"


def _shipping(boxes: str, pounds: str, rate: str) -> Built:
    text = (
        f"A shipment has {boxes} boxes of {pounds} lb each. The carrier charges {rate} "
        "dollars per kilogram. What does shipping cost in dollars?"
    )
    steps = (
        Step("calculate", {"expression": f"{boxes} * {pounds}"}),
        Step("convert", {"value": "{0}", "from_unit": "lb", "to_unit": "kg"}),
        Step("calculate", {"expression": "{1} * " + rate}),
    )
    return text, steps, f"{boxes} * {pounds} * 0.45359237 * {rate}"


def _flooring(a: str, b: str, price: str) -> Built:
    text = (
        f"A room measures {a} ft by {b} ft. Flooring costs {price} dollars per square meter. "
        "How many dollars does flooring the whole room cost?"
    )
    steps = (
        Step("calculate", {"expression": f"{a} * {b}"}),
        Step("convert", {"value": "{0}", "from_unit": "ft2", "to_unit": "m2"}),
        Step("calculate", {"expression": "{1} * " + price}),
    )
    return text, steps, f"{a} * {b} * 0.09290304 * {price}"


def _oven(fahrenheit: str, drop: str) -> Built:
    text = (
        f"A recipe says to bake at {fahrenheit} degrees Fahrenheit; a fan oven should be set "
        f"{drop} degrees Celsius lower. What setting is that in degrees Celsius?"
    )
    steps = (
        Step("convert", {"value": fahrenheit, "from_unit": "degF", "to_unit": "degC"}),
        Step("calculate", {"expression": "{0} - " + drop}),
    )
    return text, steps, f"({fahrenheit} - 32) * 5 / 9 - {drop}"


Range = tuple[float, float, int]
TEMPLATES: dict[str, tuple[Callable[..., Built], tuple[Range, ...]]] = {
    "fuel": (_fuel, ((120, 900, 0), (18, 45, 1), (1.2, 2.4, 2))),
    "shopping": (_shopping, ((3, 17, 0), (4, 90, 2), (5, 35, 0), (3, 11, 2))),
    "interest": (_interest, ((500, 20000, 0), (1, 9, 2), (2, 12, 0))),
    "pace": (_pace, ((5, 42, 1), (25, 240, 0))),
    "shipping": (_shipping, ((2, 40, 0), (3, 60, 1), (0.8, 6, 2))),
    "flooring": (_flooring, ((8, 30, 1), (8, 30, 1), (12, 95, 2))),
    "oven": (_oven, ((300, 480, 0), (5, 40, 0))),
}
"""Problem templates by name: the builder and the range (low, high, decimals) of each quantity."""


def build_problem(template: str, quantities: list[str]) -> Problem:
    """The problem of ``template`` (or a generated ``chain``, :mod:`.calc_chain_gen`) with
    these quantities (pure: the oracle rebuilds it)."""
    if template == CHAIN:
        text, calls, value = chain_parts(quantities)
        steps = tuple(Step(name, arguments) for name, arguments in calls)
        exact = str(value)
    else:
        text, steps, expression = TEMPLATES[template][0](*quantities)
        exact = str(evaluate(expression))
    text += " Answer with the number only, rounded half up to 2 decimal places."
    return Problem(template, tuple(quantities), text, steps, exact)


def generate_problem(rng: np.random.Generator) -> Problem:
    """One problem: a template and its quantities drawn from ``rng``."""
    name = sorted(TEMPLATES)[int(rng.integers(len(TEMPLATES)))]
    quantities = []
    for lo, hi, places in TEMPLATES[name][1]:
        scale = 10**places
        drawn = int(rng.integers(int(lo * scale), int(hi * scale) + 1))
        quantities.append(format_number(Fraction(drawn, scale)))
    return build_problem(name, quantities)


def accepted_answers(problem: Problem) -> set[Fraction]:
    """The exact reference rounded, and the value the reference tool chain gives, rounded."""
    chained = Fraction(run_steps(problem.steps, calc_tools())[-1])
    return {round_to(Fraction(problem.exact), PLACES), round_to(chained, PLACES)}


@dataclasses.dataclass
class CalcState:
    problem: Problem
    turns_left: int
    answer: str | None = None
    correct: bool = False
    format_ok: bool = False
    tool_calls: int = 0
    last_results: list[dict[str, Any]] = dataclasses.field(default_factory=list)


_SCRIPTED = "parley.agents.scripted.tool_use"
_BASELINES = {"solver": f"{_SCRIPTED}:CalcOracle"}
_ABOUT = (
    "Multi-step word problems with unit conversions; exact answers need the "
    "calculator and convert tools."
)


@registered(baselines=_BASELINES, description=_ABOUT)
class CalcChainV0(Scenario):
    """Word problems solved with calculator tools; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("tool_use/calc-chain-v0")
    default_invalid_penalty = 0.1
    chain: CalcState

    def snapshot(self) -> Any:
        return self.chain

    def __init__(
        self,
        max_turns: int = 6,
        format_weight: float = 0.1,
        *,
        difficulty: int | None = None,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            [SEAT], render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self.max_turns = turn_limit(max_turns)
        check_difficulty(difficulty, MAX_DIFFICULTY)
        self.format_weight = format_weight
        self.difficulty = difficulty
        self.tools = calc_tools()
        self._constraint = action_constraint(self.tools, {"answer": {"type": "string"}})

    def new_episode(self, rng: np.random.Generator) -> None:
        if self.difficulty is None:
            problem = generate_problem(rng)
        else:
            problem = build_problem(CHAIN, draw_chain(rng, self.difficulty))
        self.chain = CalcState(problem, self.max_turns)
        self.tell(SEAT, f"Problem: {self.chain.problem.text}\nTools:\n{self.tools.describe()}")

    def acting(self) -> list[str]:
        return [SEAT]

    def play(self, seat: str, action: str) -> str | None:
        self.chain.turns_left -= 1
        parsed = parse_turn(action, turn=self.turn)
        reason = parsed if isinstance(parsed, str) else None
        self.chain.last_results = []
        if not isinstance(parsed, str):
            unknown = set(parsed.fields) - {"answer"}
            if unknown:
                reason = f"unknown keys {sorted(unknown)}; use tool_calls and answer"
            results = [self.tools.call(call) for call in parsed.calls]
            self.chain.tool_calls += len(results)
            self.chain.last_results = result_dicts(results)
            for result in results:
                self.tell(SEAT, render_result(result))
            if "answer" in parsed.fields:
                self._grade(str(parsed.fields["answer"]).strip())
                return reason
        if self.chain.turns_left <= 0:
            self.announce("No answer within the turn limit.")
            self._grade(None)
        return reason

    def _grade(self, answer: str | None) -> None:
        self.chain.answer = answer
        if answer is not None:
            self.chain.format_ok = bool(_ANSWER.match(answer))
            value = parse_number(answer)  # bounded: Fraction("1e999999999") runs for hours
            self.chain.correct = value is not None and value in accepted_answers(self.chain.problem)
        self.reward(SEAT, "task", float(self.chain.correct))
        self.reward(SEAT, "format", self.format_weight * self.chain.format_ok)
        verdict = "correct" if self.chain.correct else "wrong"
        self.announce(f"Answer {answer!r}: {verdict}.")
        self.finish()

    def prompt(self, seat: str) -> str:
        return (
            f"Your move ({self.chain.turns_left} turns left): a JSON object with tool_calls "
            "and/or answer."
        )

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return dict(self._constraint)

    def view(self, seat: str) -> dict[str, Any]:
        return {
            "template": self.chain.problem.template,
            "quantities": list(self.chain.problem.quantities),
            "text": self.chain.problem.text,
            "turns_left": self.chain.turns_left,
            "tools": self.tools.specs(),
            "tool_results": self.chain.last_results,
        }

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Nothing is hidden: the answer follows from the problem the solver is shown."""
        return False

    def system_prompt(self, seat: str) -> str:
        return (
            "You solve a word problem with tools. Each turn, reply with one JSON object: "
            '{"tool_calls": [{"name": "calculate", "arguments": {"expression": "..."}}]} to '
            "use tools (several calls allowed; results arrive next turn), or "
            '{"answer": "123.45"} to give the final answer: the number only, rounded half up '
            "to 2 decimal places. Use exact unit conversions (the convert tool), not "
            "approximations.\nTools:\n" + str(self.tools.describe())
        )

    def metrics(self) -> dict[str, float]:
        if not self._finished():
            return {}
        figures = {
            "success": float(self.chain.correct),
            "format_ok": float(self.chain.format_ok),
            "tool_calls": float(self.chain.tool_calls),
        }
        if self.difficulty is not None:  # (absent by default: v0 transcripts stay as pinned)
            figures["difficulty"] = float(self.difficulty)
        return figures

    def _finished(self) -> bool:
        return self.chain.answer is not None or self.chain.turns_left <= 0


@registered(baselines=_BASELINES, description=_ABOUT + " v1: a refused move uses up the turn.")
class CalcChainV1(RefusedMoveTakesTurn, CalcChainV0):
    """v1: a move the action space refuses uses up the turn (:mod:`parley.scenarios.refusals`)."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("tool_use/calc-chain-v1")


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
CalcChain = CalcChainV0
