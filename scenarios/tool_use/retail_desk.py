"""tool_use/retail-desk-v0 — a customer-service desk over a real SQLite database (τ-bench style).

An online store's database (customers, products, orders with items, refunds; see
:mod:`parley.scenarios.tool_use.retail_db`) is generated per task. A customer contacts the
desk with a goal it does not show: cancel a pending order, return an item, change a quantity,
get a refund for a damaged item, ask for an order's status and total, or two of these. The
assistant serves it with tools, following the store's policy.

Seats: ``user`` (the customer; the scripted :class:`~parley.agents.scripted.tool_use.RetailUser`
ships, any agent can take the seat) and ``assistant``. The user speaks first; then the seats
alternate, except that an assistant action without a ``message`` (tool calls only) is followed
by another assistant action, with the results.

Tasks: ``num_tasks`` (40) tasks, task ``i`` generated from seed ``i`` (database, customer,
goal) with its reference actions and the facts the assistant must state. ``reset(seed=...)``
draws the task; the ``task`` argument pins one.

Assistant tools (results arrive in its next observation as ``[call_id] name -> result``):
``find_customer(email)``, ``get_order(order_id)``, ``get_product(product_id)``,
``cancel_order(order_id, reason)`` (reason ``"no longer needed"`` | ``"ordered by mistake"``),
``return_item(order_id, product_id)``, ``refund_damaged(order_id, product_id)``,
``change_quantity(order_id, product_id, quantity)``.

Actions:

- assistant — one JSON object: ``{"tool_calls": [{"name": "get_order", "arguments":
  {"order_id": "#W1003"}}], "message": "text for the customer"}``; ``tool_calls`` run first,
  in order; ``message`` (optional) goes to the user and passes the turn. An object with
  neither is an invalid move.
- user — free text to the assistant; a text containing ``###STOP###`` ends the episode.

Observations: the user is told its goal privately and sees the assistant's messages; the
assistant sees the user's messages and its tool results. ``infos[seat]["view"]``: for the user
``goal``, ``opening`` (a first message that states the goal) and ``last_message``; for the
assistant ``last_message``, ``tools`` (OpenAI function specs) and ``tool_results`` (this turn's
results as ToolResult dicts). Nothing in the assistant's infos names the task: the task tables
are public, so an index would hand any agent the user's goal and the reference actions.
Scripted oracles get the reference through the privileged :meth:`RetailDeskV0.oracle` hook
(``email``, ``actions``, ``facts``), which the runner gives only to in-process agents marked
``privileged``. The
assistant's ``infos["assistant"]["constraint"]`` is a ``json`` constraint for structured
output (the tool-call form or the message form).

Reward (both seats, when the episode ends by ``###STOP###`` or after ``max_steps`` actions):

==========  ======================================================================
component   value
==========  ======================================================================
task        1 iff the final database equals the one the reference actions produce
            AND every required fact (a dollar amount, a status) appears in the
            assistant's messages; else 0 (τ-bench's reward)
invalid     -``invalid_penalty`` (0.0) per invalid move
==========  ======================================================================

Metrics: ``success`` (= task), ``db_match``, ``facts_said``, ``tool_calls``, ``tool_errors``.

Arguments: ``num_tasks`` (40), ``task`` (None: drawn by the seed), ``max_steps`` (30),
``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("tool_use/retail-desk-v0", task=3)

Version history: v0 — first version. Later fixes that change no score: the assistant's view
no longer holds the task index (the privileged ``oracle`` hook replaces it); JSON nested
deeper than 64 levels or holding integers over 4,300 digits is an invalid move (it used to
raise out of ``step``); text from agents is escaped into the observation charset.
v1 — a move the action space refuses (characters outside the charset, too long) uses
up the seat's turn (:mod:`parley.scenarios.refusals`), so every episode ends within the
scenario's limits; v0 is kept as it was.
v2 — v1 with ``quote_messages`` on: a message cannot forge a line of the scenario's (a tool
result, a notice) in the other seat's observation.
v3 (:mod:`parley.scenarios.tool_use.retail_desk_v3`, its own page) — the facts are a
structured answer, and the assistant acts for the customer it serves only: a message listing
every candidate fact, and switching to another customer, scored 1.0 in v0-v2.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.protocols.messages import ToolCall
from parley.scenarios.base import Scenario, printable
from parley.scenarios.declaring import quoted_description, text_metadata
from parley.scenarios.refusals import RefusedMoveTakesTurn
from parley.scenarios.registry import registered
from parley.scenarios.tool_use.retail_db import RetailDB, dollars
from parley.scenarios.tools.tool import (
    ToolBox,
    Turn,
    action_constraint,
    ascii_text,
    parse_turn,
    render_result,
    result_dicts,
)

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["RetailDeskV0", "RetailDeskV1", "RetailDeskV2"]

SEATS = ("user", "assistant")
STOP = "###STOP###"
KINDS = ("cancel", "return", "quantity", "damaged", "status", "cancel+status")


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: the customer, the goal, the reference actions and the facts to state."""

    index: int
    email: str
    goal: str
    opening: str
    actions: tuple[tuple[str, dict[str, Any]], ...]
    facts: tuple[str, ...]


def _rng(index: int) -> np.random.Generator:
    return np.random.default_rng([index, 2024])


def _orders(db: RetailDB, cid: str, status: str) -> list[str]:
    rows = db.conn.execute(
        "SELECT id FROM orders WHERE customer_id=? AND status=? ORDER BY id", (cid, status)
    )
    return [r[0] for r in rows]


def _total(db: RetailDB, oid: str) -> int:
    """The total of order ``oid``, in cents."""
    (total,) = db.conn.execute("SELECT total FROM orders WHERE id=?", (oid,)).fetchone()
    return int(total)


def _line(db: RetailDB, oid: str, rng: np.random.Generator) -> tuple[str, str, int, int]:
    rows = db.conn.execute(
        "SELECT i.product_id, p.name, i.quantity, i.price FROM items i "
        "JOIN products p ON p.id = i.product_id WHERE i.order_id=? ORDER BY i.product_id",
        (oid,),
    ).fetchall()
    pid, name, quantity, price = rows[int(rng.integers(len(rows)))]
    return pid, name, quantity, price


def build_task(index: int) -> Task:
    """Task ``index``: pure function of the index (the database comes from the same seed)."""
    rng = _rng(index)
    db = RetailDB.generate(rng)
    customers = db.conn.execute("SELECT id, name, email FROM customers ORDER BY id").fetchall()
    cid, name, email = customers[int(rng.integers(len(customers)))]
    kind = KINDS[index % len(KINDS)]
    pending = _orders(db, cid, "pending")[int(rng.integers(len(_orders(db, cid, "pending"))))]
    delivered_all = _orders(db, cid, "delivered")
    delivered = delivered_all[int(rng.integers(len(delivered_all)))]
    hello = f"Hi, I am {name}, my email is {email}."
    actions: list[tuple[str, dict[str, Any]]] = []
    if kind == "cancel" or kind == "cancel+status":
        total = _total(db, pending)
        actions.append(("cancel_order", {"order_id": pending, "reason": "ordered by mistake"}))
        goal = f"cancel order {pending} (you ordered it by mistake) and learn the refund amount"
        opening = (
            f"{hello} Please cancel order {pending}, I ordered it by mistake. "
            "How much will I get back?"
        )
        facts = [dollars(total)]
        if kind == "cancel+status":
            status_total = _total(db, delivered)
            goal += f"; also learn the status and total of order {delivered}"
            opening += f" Also, what is the status and total of order {delivered}?"
            facts += ["delivered", dollars(status_total)]
    elif kind in ("return", "damaged"):
        pid, product, quantity, price = _line(db, delivered, rng)
        if kind == "return":
            actions.append(("return_item", {"order_id": delivered, "product_id": pid}))
            goal = f"return the {product} (all units) from order {delivered}; learn the refund"
            opening = (
                f"{hello} I want to return the {product} from order {delivered}. "
                "How much is the refund?"
            )
            facts = [dollars(quantity * price)]
        else:
            actions.append(("refund_damaged", {"order_id": delivered, "product_id": pid}))
            goal = f"one {product} in order {delivered} arrived damaged; get it refunded"
            opening = (
                f"{hello} One {product} in my order {delivered} arrived damaged. "
                "Can I get a refund, and how much?"
            )
            facts = [dollars(price)]
    elif kind == "quantity":
        pid, product, quantity, price = _line(db, pending, rng)
        new = quantity % 3 + 1 + int(rng.integers(2)) * 3  # 1-6, never the current quantity
        total = _total(db, pending)
        actions.append(
            ("change_quantity", {"order_id": pending, "product_id": pid, "quantity": new})
        )
        goal = f"change the {product} in order {pending} to {new} units; learn the new total"
        opening = (
            f"{hello} In order {pending}, please change the {product} to {new} units. "
            "What is the new total?"
        )
        facts = [dollars(total + (new - quantity) * price)]
    else:
        status, total = db.conn.execute(
            "SELECT status, total FROM orders WHERE id=?", (delivered,)
        ).fetchone()
        goal = f"learn the status and the total of order {delivered}"
        opening = f"{hello} What is the status of my order {delivered}, and what was its total?"
        facts = [status, dollars(total)]
    return Task(index, email, goal, opening, tuple(actions), tuple(facts))


def reference_db(task: Task) -> dict[str, list[tuple[Any, ...]]]:
    """The database after the task's reference actions (run through the tools themselves)."""
    db = RetailDB.generate(_rng(task.index))
    db.find_customer(task.email)
    for name, args in task.actions:
        getattr(db, name)(**args)
    dump: dict[str, list[tuple[Any, ...]]] = db.dump()
    return dump


def _normal(text: str) -> str:
    return text.lower().replace(",", "")


@dataclasses.dataclass
class DeskState:
    task: Task
    speaker: str = "user"
    steps: int = 0
    said: list[str] = dataclasses.field(default_factory=list)
    last_message: dict[str, str] = dataclasses.field(default_factory=dict)
    last_results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    db_match: bool = False
    facts_said: bool = False
    ended: bool = False


_SCRIPTED = "parley.agents.scripted.tool_use"
_BASELINES = {"user": f"{_SCRIPTED}:RetailUser", "assistant": f"{_SCRIPTED}:RetailOracle"}
_ABOUT = (
    "tau-bench-style customer service over SQLite: a user with a hidden "
    "goal, an assistant with tools; reward = final database and stated "
    "facts match the reference."
)


@registered(baselines=_BASELINES, description=_ABOUT)
class RetailDeskV0(Scenario):
    """Customer service with tools over SQLite; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("tool_use/retail-desk-v0")
    max_action_length = 4000
    desk: DeskState

    def __init__(
        self,
        num_tasks: int = 40,
        task: int | None = None,
        max_steps: int = 30,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            SEATS, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        if num_tasks < 1 or max_steps < 2:
            raise ConfigError("num_tasks must be >= 1 and max_steps >= 2")
        self.num_tasks, self.fixed_task, self.max_steps = num_tasks, task, max_steps
        self.db = RetailDB()
        self.tools = ToolBox(self.db.tools())
        self._constraint = action_constraint(self.tools, {"message": {"type": "string"}})

    def new_episode(self, rng: np.random.Generator) -> None:
        index = (
            self.fixed_task if self.fixed_task is not None else int(rng.integers(self.num_tasks))
        )
        task = build_task(index)
        self._open_store(index, task)
        self.desk = DeskState(task)

    def _open_store(self, index: int, task: Task) -> None:
        """The store of task ``index``'s seed, serving ``task``'s customer, and its tools."""
        self.db = RetailDB.generate(_rng(index))
        self.tools = ToolBox(self.db.tools())

    def brief(self) -> None:
        task = self.desk.task
        self.tell(
            "user",
            f"You are a customer writing to an online store's support desk. Your goal: "
            f"{task.goal}. Your email is {task.email}. Say what you want, answer the "
            f"assistant's questions, and write {STOP} when you are done.",
        )
        self.tell(
            "assistant",
            "You are the store's support assistant. Tools:\n" + str(self.tools.describe()),
        )

    def acting(self) -> list[str]:
        return [self.desk.speaker]

    def play(self, seat: str, action: str) -> str | None:
        self.desk.steps += 1
        reason = self._play_user(action) if seat == "user" else self._play_assistant(action)
        if not self.desk.ended and self.desk.steps >= self.max_steps:
            self.announce("The conversation reached its step limit.")
            self._end()
        return reason

    def _play_user(self, action: str) -> str | None:
        text = action.replace(STOP, "").strip()
        if text:
            self.say("user", text)
            self.desk.last_message["assistant"] = text
        if STOP in action:
            self._end()
            return None
        if not text:
            return "empty message; write to the assistant or " + STOP
        self.desk.speaker = "assistant"
        return None

    def _play_assistant(self, action: str) -> str | None:
        parsed = parse_turn(action, turn=self.turn)
        self.desk.last_results = []
        if isinstance(parsed, str):
            return parsed
        return self._play_turn(parsed)

    def _play_turn(self, parsed: Turn) -> str | None:
        """Play one parsed assistant action; return the reason when it is invalid."""
        message = parsed.fields.get("message")
        if not parsed.calls and not isinstance(message, str):
            return 'give "tool_calls" and/or a string "message" for the customer'
        self._run_calls(parsed.calls)
        if isinstance(message, str) and message.strip():
            self._reply(message.strip(), message)
        extra = set(parsed.fields) - {"message"}
        return f"unknown keys {sorted(extra)}; use tool_calls and message" if extra else None

    def _run_calls(self, calls: list[ToolCall]) -> None:
        """Run the assistant's tool calls in order; their results go to its observation."""
        results = [self.tools.call(call) for call in calls]
        self.db.conn.commit()
        self.desk.tool_calls += len(results)
        self.desk.tool_errors += sum(bool(r.error) for r in results)
        self.desk.last_results = result_dicts(results)
        for result in results:
            self.tell("assistant", ascii_text(render_result(result)))

    def _reply(self, text: str, said: str) -> None:
        """Send ``text`` to the customer (``said``: what the fact check reads) and pass the
        turn to them."""
        self.say("assistant", ascii_text(text, limit=4000))
        self.desk.said.append(said)
        self.desk.last_message["user"] = text
        self.desk.speaker = "user"

    def _reference_db(self, task: Task) -> dict[str, list[tuple[Any, ...]]]:
        """The database the episode must end with (the task's reference actions run)."""
        return reference_db(task)

    def _facts_stated(self) -> bool:
        """Whether the assistant told the customer every fact of the task (v0-v2: each
        appears somewhere in its messages)."""
        spoken = _normal(" ".join(self.desk.said))
        return all(_normal(fact) in spoken for fact in self.desk.task.facts)

    def _success(self) -> bool:
        return self.desk.db_match and self.desk.facts_said

    def _end(self) -> None:
        task = self.desk.task
        self.desk.ended = True
        self.desk.db_match = self.db.dump() == self._reference_db(task)
        self.desk.facts_said = self._facts_stated()
        success = float(self._success())
        for agent in SEATS:
            self.reward(agent, "task", success)
        self.announce(f"Episode over: {'success' if success else 'failure'}.")
        self.finish()

    def prompt(self, seat: str) -> str:
        if seat == "user":
            return f"Your message to the assistant (or {STOP} when done):"
        return 'Your move: {"tool_calls": [...], "message": "..."} (JSON).'

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return dict(self._constraint) if seat == "assistant" else None

    def view(self, seat: str) -> dict[str, Any]:
        last = printable(self.desk.last_message.get(seat, ""))
        if seat == "user":
            return {
                "goal": self.desk.task.goal,
                "opening": self.desk.task.opening,
                "last_message": last,
            }
        return {
            "last_message": last,
            "tools": self.tools.specs(),
            "tool_results": self.desk.last_results,
        }

    def oracle(self, seat: str) -> dict[str, Any]:
        """Privileged (see :meth:`Scenario.oracle`): the assistant's reference solution."""
        if seat != "assistant":
            return {}
        task = self.desk.task
        actions = [[name, dict(args)] for name, args in task.actions]
        return {"email": task.email, "actions": actions, "facts": list(task.facts)}

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """The user's task (goal, reference, facts) for the assistant; the store's database
        for the user (only the assistant's tools read it)."""
        other = self.desk.task.index + 1 + int(rng.integers(1000))  # any other task
        if keep == "assistant":
            self.desk.task = build_task(other)
        else:
            self._open_store(other, self.desk.task)
        return True

    def system_prompt(self, seat: str) -> str:
        if seat == "user":
            return (
                "You play a customer of an online store talking to its support assistant. "
                "Pursue the goal you are given, one step at a time; give your email when "
                "asked; do not invent order ids or facts. When your goal is met (or cannot be "
                f"met), write {STOP}."
            )
        return (
            "You are an online store's support assistant. Identify the customer with "
            "find_customer before touching orders, follow the store policy the tools enforce, "
            "and tell the customer the outcome, including amounts in dollars ($12.34). Each "
            'turn reply with one JSON object: {"tool_calls": [{"name": ..., "arguments": '
            '{...}}], "message": "..."}. Tool calls run first; their results arrive in your '
            "next turn. A message goes to the customer and ends your turn.\nTools:\n"
            + str(self.tools.describe())
        )

    def snapshot(self) -> Any:
        return {"task": self.desk.task.index, "steps": self.desk.steps, "db": self.db.dump()}

    def metrics(self) -> dict[str, float]:
        if not self.desk.ended:
            return {}
        return {
            "success": float(self._success()),
            "db_match": float(self.desk.db_match),
            "facts_said": float(self.desk.facts_said),
            "tool_calls": float(self.desk.tool_calls),
            "tool_errors": float(self.desk.tool_errors),
        }


@registered(baselines=_BASELINES, description=_ABOUT + " v1: a refused move uses up the turn.")
class RetailDeskV1(RefusedMoveTakesTurn, RetailDeskV0):
    """v1: a move the action space refuses uses up the turn (:mod:`parley.scenarios.refusals`)."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("tool_use/retail-desk-v1")


@registered(baselines=_BASELINES, description=quoted_description(RetailDeskV1))
class RetailDeskV2(RetailDeskV1):
    """v2: v1 with ``quote_messages`` on; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("tool_use/retail-desk-v2")
    quote_messages = True


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
RetailDesk = RetailDeskV0
