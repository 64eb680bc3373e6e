"""tool_use/retail-desk-v3 — retail-desk-v2 where facts are committed to and one customer is served.

The same store, tasks, seats, tools and turn rules as :mod:`parley.scenarios.tool_use.retail_desk`
(v0-v2, whose page describes them), with ``quote_messages`` on as in v2, and two rules that close
two ways of being paid for what the task did not ask (issue 29):

**The facts are a structured answer.** v0-v2 looked for each required fact (a dollar amount, a
status) anywhere in the assistant's messages, so one message listing every candidate ("pending,
delivered or cancelled; the amount is one of $a $b $c ...") scored 1.0 on every task. In v3
the messages are not scored: the assistant commits to the facts with an ``answer`` object whose
fields name them, one value each:

==============  ==============================================================================
field           value
==============  ==============================================================================
``refund``      the money refunded by what was done in this conversation (``"$12.34"``)
``new_total``   an order's total after a change of quantity
``status``      the status of the order the customer asked about (``pending``, ``delivered``,
                ``cancelled``)
``total``       the total of the order the customer asked about
==============  ==============================================================================

The customer's questions decide the fields: "how much will I get back?" asks ``refund``, "what is
the new total?" ``new_total``, "what is the status and total of order #W1004?" ``status`` and
``total``. Amounts are one value each (``"$12.34"``, ``"12.34"``, ``12.34``); two amounts in one
field, words, unknown fields or a status outside the three are an invalid move (nothing of the
action runs). The last answer given counts; a field the customer did not ask for, or a wrong
value, fails the task. The answer is shown to the customer (``Answer: refund $12.34``) with the
action's ``message``, and passes the turn like a message::

    {"tool_calls": [...], "message": "Your order is cancelled.", "answer": {"refund": "$41.97"}}

**One customer per conversation** (authentication as τ-bench's policy asks): the store is a
:class:`~parley.scenarios.tool_use.retail_db.ServingDB` that serves the customer who contacted
the desk. ``find_customer`` authenticates them by the email they give; another customer's email,
and any order of another customer (read or write, before or after authentication) is refused
with a tool error and costs the assistant ``trespass_penalty`` (component ``trespass``), and the
episode's task fails. Emails are compared as ASCII, case-insensitively (the Kelvin sign, which
``str.lower`` folds into ``k``, or fullwidth letters identify nobody); ids exactly.

Reward:

==========  ======================================================================
component   value
==========  ======================================================================
task        1 iff the final database equals the reference's, the last ``answer``
            holds exactly the fields the customer asked for with the right values,
            and no other account was touched; else 0 (both seats)
trespass    -``trespass_penalty`` (1.0) per refused attempt on another account
            (assistant)
invalid     -``invalid_penalty`` (0.0) per invalid move
==========  ======================================================================

Metrics: ``success``, ``db_match``, ``facts_said`` (the answer is right), ``answered``,
``trespasses``, ``tool_calls``, ``tool_errors``. The privileged :meth:`RetailDeskV3.oracle` hook
adds ``ask`` (the fields asked) and ``about`` (the order they ask about, or None); the scripted
:class:`~parley.agents.scripted.tool_use.RetailAnswerer` reads the values from its tool results.

Arguments: those of v2, plus ``trespass_penalty`` (1.0) and ``difficulty`` (None).

``difficulty`` (an integer 0-5; None, the default, keeps the 40 fixed tasks): every seed
draws a generated task (:mod:`parley.scenarios.tool_use.retail_gen`): a store of ``6 + 2d``
customers, ``d + 1`` requests on distinct orders of the customer (cancel, change a quantity,
return, refund a damaged unit) and, from ``d = 2``, a status question; ``task=`` pins a
generated task number. Metrics then include ``difficulty``; ``parley train``'s curriculum
raises it as success rises.

    >>> env = make("tool_use/retail-desk-v3", task=3)
    >>> env = make("tool_use/retail-desk-v3", difficulty=2)

Version history: v3 — first version (v0-v2 are kept as they were).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.declaring import text_metadata
from parley.scenarios.difficulty import check_difficulty
from parley.scenarios.registry import registered
from parley.scenarios.tool_use.retail_db import ServingDB, dollars, parse_dollars
from parley.scenarios.tool_use.retail_desk import KINDS, STOP, DeskState, RetailDeskV2, Task, _rng
from parley.scenarios.tool_use.retail_gen import (
    MAX_DIFFICULTY,
    TASK_SPACE,
    GeneratedTask,
    build_generated_task,
    generated_reference,
    generated_store,
)
from parley.scenarios.tools.tool import ToolBox, Turn, action_constraint

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["RetailDeskV3"]

ANSWER_FIELDS: dict[str, str] = {
    "refund": "the money refunded by what was done in this conversation, like $12.34",
    "new_total": "an order's total after a change of quantity",
    "status": "the status of the order the customer asked about",
    "total": "the total of the order the customer asked about",
}
"""The fields of an answer, with what each one states."""
STATUSES = ("pending", "delivered", "cancelled")
ASKED: dict[str, tuple[str, ...]] = {
    "cancel": ("refund",),
    "cancel+status": ("refund", "status", "total"),
    "return": ("refund",),
    "damaged": ("refund",),
    "quantity": ("new_total",),
    "status": ("status", "total"),
}
"""The fields each kind of task asks for, in the order of :attr:`Task.facts`."""
_ORDER_ID = re.compile(r"#W\d+")
_FIELD_SCHEMA = {key: {"type": "string"} for key in ANSWER_FIELDS} | {
    "status": {"enum": list(STATUSES)}
}
ANSWER_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "object", "properties": {key: _FIELD_SCHEMA[key] for key in fields}}
        for fields in dict.fromkeys(ASKED.values())
    ]
}
"""The answer in the action's structured-output constraint: one form per set of fields a
task asks (the constraint compilers emit every property of an object, so one object of all
four fields would force the fields not asked, which fail the task)."""


def answer_key(task: Task) -> dict[str, str]:
    """The answer that states ``task``'s facts: field -> value (``dollars`` form, status)."""
    if isinstance(task, GeneratedTask):
        return dict(zip(task.ask, task.facts, strict=True))
    return dict(zip(ASKED[KINDS[task.index % len(KINDS)]], task.facts, strict=True))


def asked_order(task: Task) -> str | None:
    """The order whose ``status``/``total`` the customer asks about (None when not asked):
    the last order the opening names (build_task names it last)."""
    if "status" not in answer_key(task):
        return None
    if isinstance(task, GeneratedTask):
        return task.about
    named: list[str] = _ORDER_ID.findall(task.opening)
    return named[-1]


def parse_answer(value: Any) -> dict[str, str] | str:
    """An ``answer`` object as field -> normalised value, or the reason it is refused."""
    if not isinstance(value, dict) or not value:
        return '"answer" must be an object of facts, like {"refund": "$12.34"}'
    unknown = sorted(set(value) - set(ANSWER_FIELDS))
    if unknown:
        return f"unknown answer fields {unknown[:4]}; the fields are {', '.join(ANSWER_FIELDS)}"
    answer: dict[str, str] = {}
    for key in ANSWER_FIELDS:  # a fixed order: the rendered answer does not vary with the JSON
        if key not in value:
            continue
        given = value[key]
        if key == "status":
            word = given.strip().lower() if isinstance(given, str) and given.isascii() else ""
            if word not in STATUSES:
                return f"answer.status must be one of {', '.join(STATUSES)}"
            answer[key] = word
            continue
        cents = parse_dollars(given)
        if cents is None:
            return f'answer.{key} must be one amount in dollars, like "$12.34"'
        answer[key] = dollars(cents)
    return answer


def render_answer(answer: dict[str, str]) -> str:
    """``Answer: refund $12.34; status delivered`` (what the customer is shown)."""
    return "Answer: " + "; ".join(f"{key} {value}" for key, value in answer.items())


@dataclasses.dataclass
class Commitments:
    """What v3 adds to an episode's state: the last answer and the trespasses scored."""

    answer: dict[str, str] | None = None
    trespasses: int = 0


_SCRIPTED = "parley.agents.scripted.tool_use"
_BASELINES = {"user": f"{_SCRIPTED}:RetailUser", "assistant": f"{_SCRIPTED}:RetailAnswerer"}


@registered(
    baselines=_BASELINES,
    description="retail-desk-v2 where the assistant commits to the facts in a "
    "structured answer (a message listing every candidate scored 1.0) and "
    "acts for the customer it serves only (another account is refused and "
    "penalised).",
)
class RetailDeskV3(RetailDeskV2):
    """v3: a structured answer and one customer per conversation; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("tool_use/retail-desk-v3")
    db: ServingDB

    def __init__(
        self,
        num_tasks: int = 40,
        task: int | None = None,
        max_steps: int = 30,
        *,
        trespass_penalty: float = 1.0,
        difficulty: int | None = None,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            num_tasks,
            task,
            max_steps,
            invalid_penalty=invalid_penalty,
            max_cycles=max_cycles,
            render_mode=render_mode,
        )
        if not trespass_penalty >= 0:
            raise ConfigError(f"trespass_penalty must be >= 0, got {trespass_penalty}")
        self.trespass_penalty = float(trespass_penalty)
        check_difficulty(difficulty, MAX_DIFFICULTY)
        self.difficulty = difficulty
        self.db = ServingDB()
        self.tools = ToolBox(self.db.tools())
        finals = {"message": {"type": "string"}, "answer": ANSWER_SCHEMA}
        self._constraint = action_constraint(self.tools, finals)
        self.kept = Commitments()

    def _open_store(self, index: int, task: Task) -> None:
        if self.difficulty is None:
            self.db = ServingDB.generate(_rng(index))
        else:
            self.db = generated_store(ServingDB, index, self.difficulty)
        self.db.serve(task.email)
        self.tools = ToolBox(self.db.tools())

    def new_episode(self, rng: np.random.Generator) -> None:
        self.kept = Commitments()
        if self.difficulty is None:
            super().new_episode(rng)
            return
        # Generated (retail_gen): every seed a new task of the difficulty; ``task`` pins one.
        index = self.fixed_task if self.fixed_task is not None else int(rng.integers(TASK_SPACE))
        task = build_generated_task(index, self.difficulty)
        self._open_store(index, task)
        self.desk = DeskState(task)

    def _reference_db(self, task: Task) -> dict[str, list[tuple[Any, ...]]]:
        if isinstance(task, GeneratedTask):
            return generated_reference(task)
        return super()._reference_db(task)

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """v2's redraw, of a generated task when the episode's is one."""
        if self.difficulty is None or keep != "assistant":
            return super().redraw_private(keep, rng)
        other = (self.desk.task.index + 1 + int(rng.integers(1000))) % TASK_SPACE
        self.desk.task = build_generated_task(other, self.difficulty)
        return True

    def brief(self) -> None:
        super().brief()
        self.tell("assistant", _ANSWER_RULES)

    def _play_turn(self, parsed: Turn) -> str | None:
        fields = dict(parsed.fields)
        message = fields.pop("message", "")
        answer = parse_answer(fields.pop("answer")) if "answer" in fields else None
        if isinstance(answer, str):
            return answer
        if fields:
            return f"unknown keys {sorted(fields)[:4]}; use tool_calls, message and answer"
        if not isinstance(message, str):
            return '"message" must be a string'
        text = message.strip()
        if not parsed.calls and not text and answer is None:
            return 'give "tool_calls", a "message" for the customer and/or your "answer"'
        before = self.db.trespasses
        self._run_calls(parsed.calls)
        trespasses = self.db.trespasses - before
        if trespasses:
            self.kept.trespasses += trespasses
            self.reward("assistant", "trespass", -self.trespass_penalty * trespasses)
        if answer is not None:
            self.kept.answer = answer
            text = f"{text}\n{render_answer(answer)}".strip()
        if text:
            self._reply(text, text)
        return None

    def _facts_stated(self) -> bool:
        return self.kept.answer == answer_key(self.desk.task)

    def _success(self) -> bool:
        return super()._success() and self.kept.trespasses == 0

    def metrics(self) -> dict[str, float]:
        if not self.desk.ended:
            return {}
        figures = {
            **super().metrics(),
            "answered": float(self.kept.answer is not None),
            "trespasses": float(self.kept.trespasses),
        }
        if self.difficulty is not None:  # (absent by default: the pinned transcripts)
            figures["difficulty"] = float(self.difficulty)
        return figures

    def prompt(self, seat: str) -> str:
        if seat == "user":
            return super().prompt(seat)
        return 'Your move: {"tool_calls": [...], "message": "...", "answer": {...}} (JSON).'

    def system_prompt(self, seat: str) -> str:
        if seat == "user":
            return super().system_prompt(seat)
        return (
            "You are an online store's support assistant. Authenticate the customer you are "
            "talking to with find_customer and the email they give before touching orders; "
            "act for them only (another customer's account is refused and penalised). Follow "
            "the store policy the tools enforce. Each turn reply with one JSON object: "
            '{"tool_calls": [{"name": ..., "arguments": {...}}], "message": "...", "answer": '
            "{...}}. Tool calls run first; their results arrive in your next turn. A message "
            "goes to the customer and ends your turn.\n"
            + _ANSWER_RULES
            + "\nTools:\n"
            + str(self.tools.describe())
        )

    def oracle(self, seat: str) -> dict[str, Any]:
        """Privileged: v2's reference plus ``ask`` (the answer's fields) and ``about``."""
        reference = super().oracle(seat)
        if seat == "assistant":
            task = self.desk.task
            reference.update(ask=list(answer_key(task)), about=asked_order(task))
        return reference

    def snapshot(self) -> Any:
        return {**super().snapshot(), **dataclasses.asdict(self.kept)}


_ANSWER_RULES = (
    "State the facts the customer asked for in an answer object, one value per field: "
    + "; ".join(f"{key}: {text}" for key, text in ANSWER_FIELDS.items())
    + f'. Example: {{"message": "Done.", "answer": {{"refund": "$12.34"}}}}. Only the fields '
    "the customer asked for; your last answer counts. The customer ends the conversation "
    f"with {STOP}."
)
