"""Generated retail-desk tasks with a difficulty: more customers, more orders, more requests.

``make("tool_use/retail-desk-v3", difficulty=d)`` draws each episode's task here instead of
from the 40 fixed tasks: a store of ``6 + 2d`` customers in which the customer served has
``d + 1`` more orders than the others, and a conversation of ``d + 1`` requests on distinct
orders of theirs — cancel a pending order (refund its total), change a quantity in one (at
most one per task: its new total), return an item line or refund a damaged unit of a
delivered order — plus, from ``d = 2`` on, a question about the status and total of another
order. The answer asks ``refund`` (the sum of every refund), ``new_total``, ``status`` and
``total`` as those requests need. Every seed draws a new task (a task number in ``0 ..
2**31``; ``task=`` pins one).

Everything is a pure function of ``(index, difficulty)``: the store
(:func:`generated_store`), the task (:func:`build_generated_task`) and the reference
database (:func:`generated_reference`); the facts are what the store's own tools return when
the reference actions run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np

from parley.scenarios.difficulty import check_difficulty
from parley.scenarios.tool_use.retail_db import RetailDB, dollars, parse_dollars
from parley.scenarios.tool_use.retail_desk import Task

__all__ = [
    "MAX_DIFFICULTY",
    "GeneratedTask",
    "build_generated_task",
    "generated_reference",
    "generated_store",
]

MAX_DIFFICULTY = 5
"""Six requests and a question: with ``find_customer`` and ``get_order``, the 8 tool calls
one turn holds (the scripted answerer makes them all in its first turn)."""
TASK_SPACE = 2**31
"""Generated task numbers are drawn from ``range(TASK_SPACE)``."""
_REASONS = ("ordered by mistake", "no longer needed")
DB = TypeVar("DB", bound=RetailDB)


@dataclasses.dataclass(frozen=True)
class GeneratedTask(Task):
    """A generated task: ``ask`` names the answer's fields (``facts`` holds their values
    in the same order), ``about`` the order of the status question (or None)."""

    difficulty: int = 0
    ask: tuple[str, ...] = ()
    about: str | None = None


def generated_store(cls: type[DB], index: int, difficulty: int) -> DB:
    """The store of generated task ``index``: ``6 + 2 * difficulty`` customers, the one
    served (customer ``index`` modulo their number) with ``difficulty + 1`` extra orders."""
    rng = np.random.default_rng([index, 3206, difficulty])
    customers = 6 + 2 * difficulty
    db = cls.generate(rng, customers=customers)
    cid = f"C{101 + index % customers}"
    (last,) = db.conn.execute("SELECT COUNT(*) FROM orders").fetchone()
    for k in range(difficulty + 1):
        status = ("pending", "delivered")[int(rng.integers(2))]
        db._add_order(rng, f"#W{1001 + last + k}", cid, status)
    db.conn.commit()
    return db


def _lines(db: RetailDB, oid: str) -> list[tuple[str, str, int]]:
    return db.conn.execute(
        "SELECT i.product_id, p.name, i.quantity FROM items i JOIN products p "
        "ON p.id = i.product_id WHERE i.order_id=? ORDER BY i.product_id",
        (oid,),
    ).fetchall()


def build_generated_task(index: int, difficulty: int) -> GeneratedTask:
    """Generated task ``index`` at ``difficulty`` (pure; module docstring)."""
    check_difficulty(difficulty, MAX_DIFFICULTY)
    db = generated_store(RetailDB, index, difficulty)
    rng = np.random.default_rng([index, 3207, difficulty])
    cid = f"C{101 + index % (6 + 2 * difficulty)}"
    name, email = db.conn.execute("SELECT name, email FROM customers WHERE id=?", (cid,)).fetchone()
    rows = db.conn.execute("SELECT id, status FROM orders WHERE customer_id=? ORDER BY id", (cid,))
    orders = [tuple(r) for r in rows.fetchall()]
    order = [orders[int(i)] for i in rng.permutation(len(orders))]
    actions: list[tuple[str, dict[str, Any]]] = []
    asks: list[str] = []
    goals: list[str] = []
    changed = False
    for oid, status in order[: difficulty + 1]:
        pid, product, quantity = _lines(db, oid)[int(rng.integers(len(_lines(db, oid))))]
        if status == "pending" and not changed and rng.integers(2):
            changed = True
            new = [q for q in range(1, quantity + 3) if q != quantity][
                int(rng.integers(quantity + 1))
            ]
            args = {"order_id": oid, "product_id": pid, "quantity": new}
            actions.append(("change_quantity", args))
            asks.append(f"In order {oid}, please change the {product} to {new} units.")
            goals.append(f"change the {product} in order {oid} to {new} units")
        elif status == "pending":
            reason = _REASONS[int(rng.integers(2))]
            actions.append(("cancel_order", {"order_id": oid, "reason": reason}))
            asks.append(f"Please cancel order {oid}, {'I' if 'mistake' in reason else 'it is'} "
                        f"{reason}.")  # fmt: skip
            goals.append(f"cancel order {oid} ({reason})")
        elif rng.integers(2):
            actions.append(("return_item", {"order_id": oid, "product_id": pid}))
            asks.append(f"I want to return the {product} from order {oid}.")
            goals.append(f"return the {product} (all units) from order {oid}")
        else:
            actions.append(("refund_damaged", {"order_id": oid, "product_id": pid}))
            asks.append(f"One {product} in my order {oid} arrived damaged; please refund it.")
            goals.append(f"get a refund for one damaged {product} in order {oid}")
    # The facts: what the store's tools answer when the reference actions run.
    reference = generated_store(RetailDB, index, difficulty)
    reference.find_customer(email)
    results = [getattr(reference, tool)(**args) for tool, args in actions]
    facts: dict[str, str] = {}
    refunds = [r["refund"] for r in results if "refund" in r]
    if refunds:
        cents = sum(parse_dollars(r) or 0 for r in refunds)
        facts["refund"] = dollars(cents)
        asks.append("How much will I get back in all?")
    for result in results:
        if "new_total" in result:
            facts["new_total"] = str(result["new_total"])
            asks.append(f"What is the new total of order {result['order_id']}?")
    about = None
    if difficulty >= 2 and len(order) > difficulty + 1:
        about = order[difficulty + 1][0]
        shown = reference.get_order(about)
        facts.update(status=shown["status"], total=shown["total"])
        asks.append(f"Also, what is the status and total of order {about}?")
        goals.append(f"learn the status and total of order {about}")
    opening = f"Hi, I am {name}, my email is {email}. " + " ".join(asks)
    ask = tuple(key for key in ("refund", "new_total", "status", "total") if key in facts)
    return GeneratedTask(
        index=index,
        email=email,
        goal="; ".join(goals) + "; learn the amounts",
        opening=opening,
        actions=tuple(actions),
        facts=tuple(facts[key] for key in ask),
        difficulty=difficulty,
        ask=ask,
        about=about,
    )


def generated_reference(task: GeneratedTask) -> dict[str, list[tuple[Any, ...]]]:
    """The database after ``task``'s reference actions (run through the tools)."""
    db = generated_store(RetailDB, task.index, task.difficulty)
    db.find_customer(task.email)
    for name, args in task.actions:
        getattr(db, name)(**args)
    return db.dump()
