"""The tool-use game of ``parley new scenario --kind tool-use`` (:mod:`parley.arena.cli.new`):
the scenario module and its baseline, as templates (placeholders as in
:mod:`parley.arena.cli.new_templates`); and :func:`scenario_class`, the start of the scenario
class that every scenario template writes alike (here, where
:mod:`~parley.arena.cli.new_templates` imports it from)."""

from __future__ import annotations

_CLASS = '''\
@registered(
    baselines={"*": "<<PACKAGE>>.agents:<<CLASS>>Baseline"},  # the scripted agent of every seat
    description="<<NAME>>: describe the game in one line.",
)
class <<CLASS>>V0(Scenario):
    """[[GAME]]; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "<<ID>>",
        "render_modes": ["ansi", "human"],
        "is_parallelizable": True,
    }
    default_invalid_penalty = 0.1
    refused_move_takes_turn: ClassVar[bool] = True
[[EXTRA]]    [[STATE]]: State

    def snapshot(self) -> Any:
        return self.[[STATE]]

    def __init__(
        self,
        [[ARG]]: int = [[DEFAULT]],
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            [[SEATS]], render_mode=render_mode, max_cycles=max_cycles,
            invalid_penalty=invalid_penalty,
        )
        if [[ARG]] < 1:
            raise ConfigError(f"[[ARG]] must be >= 1, got {[[ARG]]}")
        self.[[ARG]] = [[ARG]]
'''


def scenario_class(
    game: str, *, state: str, argument: tuple[str, int], seats: str, extra: str = ""
) -> str:
    """The start of a template's scenario class, to its ``__init__``'s end: the
    ``@registered`` declaration, ``metadata``, the class attributes (``extra``: more of them,
    whole lines), the ``state`` attribute that :meth:`snapshot` returns, and ``__init__`` with
    its one integer ``argument`` (name, default: checked >= 1 and kept on ``self``) and the
    ``seats`` expression. Placeholders (``<<ID>>``, ...) are left for ``parley new`` to fill."""
    name, default = argument
    text = _CLASS.replace("[[GAME]]", game).replace("[[EXTRA]]", extra)
    text = text.replace("[[STATE]]", state).replace("[[SEATS]]", seats)
    return text.replace("[[ARG]]", name).replace("[[DEFAULT]]", str(default))


TOOL_USE = (
    '''\
"""<<ID>> — compute ``a * b + c`` for large numbers with ``multiply`` and ``add`` tools.

Seat: ``solver``. The numbers come from ``reset(seed=...)``.

Tools (results arrive in the next observation as ``[call_id] name -> result``):
``multiply(a, b)`` and ``add(a, b)``, integers of at most 12 digits.

Action: one JSON object per turn (the tool-use syntax of :mod:`parley.scenarios.tools.tool`)::

    {"tool_calls": [{"name": "multiply", "arguments": {"a": 4821, "b": 9377}}]}
    {"answer": "45209240"}

``answer`` ends the episode (tool calls in the same action run first). Anything else is an
invalid move. The episode also ends after ``max_turns`` actions (no answer: reward 0).

Observations: the problem and the tool list, then tool results.
``infos["solver"]["view"]``: ``a``, ``b``, ``c``, ``turns_left``, ``tools`` (OpenAI function
specs) and ``tool_results`` (the last turn's results as ToolResult dicts).
``infos["solver"]["constraint"]``: a ``json`` constraint (tool calls or the answer).

Rewards: ``task`` 1 when the answer is right; ``invalid`` -``invalid_penalty`` (0.1) per
invalid move.

Metrics: ``success``, ``tool_calls``.

Arguments: ``max_turns`` (5), ``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("<<ID>>", max_turns=5)

Version history: v0 — first version.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from parley.scenarios import ConfigError, Scenario, registered
from parley.scenarios.tools.tool import (
    ToolBox,
    ToolFailure,
    action_constraint,
    parse_turn,
    render_result,
    result_dicts,
    tool,
)

SEAT = "solver"
LIMIT = 10**12


def _checked(*values: int) -> None:
    if any(abs(v) >= LIMIT for v in values):
        raise ToolFailure(f"numbers must have at most 12 digits (below {LIMIT})")


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    _checked(a, b)
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    _checked(a, b)
    return a + b


@dataclasses.dataclass
class State:
    a: int
    b: int
    c: int
    turns_left: int
    answer: str | None = None
    correct: bool = False
    tool_calls: int = 0
    last_results: list[dict[str, Any]] = dataclasses.field(default_factory=list)


'''
    + scenario_class(
        "Arithmetic with tools",
        state="sum",
        argument=("max_turns", 5),
        seats="[SEAT]",
    )
    + '''\
        self.tools = ToolBox([tool(multiply), tool(add)])
        self._constraint = action_constraint(self.tools, {"answer": {"type": "string"}})

    def new_episode(self, rng: np.random.Generator) -> None:
        a, b, c = (int(x) for x in rng.integers(1000, 100_000, size=3))
        self.sum = State(a, b, c, self.max_turns)

    def brief(self) -> None:
        self.tell(SEAT, f"What is {self.sum.a} * {self.sum.b} + {self.sum.c}?\\n"
                        f"Tools:\\n{self.tools.describe()}")

    def acting(self) -> list[str]:
        return [SEAT]

    def play(self, seat: str, action: str) -> str | None:
        self.sum.turns_left -= 1
        self.sum.last_results = []
        parsed = parse_turn(action, turn=self.turn)
        reason = parsed if isinstance(parsed, str) else None
        if not isinstance(parsed, str):
            if set(parsed.fields) - {"answer"}:
                reason = "use the keys tool_calls and answer only"
            results = [self.tools.call(call) for call in parsed.calls]
            self.sum.tool_calls += len(results)
            self.sum.last_results = result_dicts(results)
            for result in results:
                self.tell(SEAT, render_result(result))
            if "answer" in parsed.fields:
                self.sum.answer = str(parsed.fields["answer"]).strip()
                self.sum.correct = self.sum.answer == str(self.sum.a * self.sum.b + self.sum.c)
                self.reward(SEAT, "task", float(self.sum.correct))
                self.finish()
                return reason
        if self.sum.turns_left <= 0:
            self.announce("No answer within the turn limit.")
            self.finish()
        return reason

    def prompt(self, seat: str) -> str:
        return f"Your move ({self.sum.turns_left} turns left): tool_calls and/or answer."

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return dict(self._constraint)

    def view(self, seat: str) -> dict[str, Any]:
        return {
            "a": self.sum.a, "b": self.sum.b, "c": self.sum.c, "turns_left": self.sum.turns_left,
            "tools": self.tools.specs(), "tool_results": self.sum.last_results,
        }

    def system_prompt(self, seat: str) -> str:
        return (
            "Compute the expression with the tools. Reply with one JSON object each turn: "
            '{"tool_calls": [{"name": "multiply", "arguments": {"a": 1, "b": 2}}]} or '
            '{"answer": "123"}.\\nTools:\\n' + self.tools.describe()
        )

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Nothing is hidden: the answer follows from the problem the solver is shown."""
        return False

    def metrics(self) -> dict[str, float]:
        return {"success": float(self.sum.correct), "tool_calls": float(self.sum.tool_calls)}


'''
)

TOOL_USE_AGENT = '''\
"""The scripted baseline of <<ID>>: multiply, then add, then answer."""

import json

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.messages import Observation


class <<CLASS>>Baseline(ScriptedAgent):
    """Calls the tools in order and answers with the last result."""

    name = "<<NAME>>-baseline"

    def new_episode(self) -> None:
        self.results: list[str] = []

    def decide(self, observation: Observation) -> str:
        view = observation.info.get("view", {})
        self.results += [str(r.get("content", "")) for r in view.get("tool_results", [])]
        if not self.results:
            call = {"name": "multiply", "arguments": {"a": view["a"], "b": view["b"]}}
        elif len(self.results) == 1:
            call = {"name": "add", "arguments": {"a": int(self.results[0]), "b": view["c"]}}
        else:
            return json.dumps({"answer": self.results[-1]})
        return json.dumps({"tool_calls": [call]})
'''
