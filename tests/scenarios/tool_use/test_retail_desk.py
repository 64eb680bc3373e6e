"""retail-desk-v0: a real SQLite store, policy-enforcing tools, τ-bench reward, oracle vs naive."""

from __future__ import annotations

import json
from typing import Any

import pytest

from parley.agents.scripted.tool_use import RetailNaive, RetailOracle, RetailUser
from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.tool_use.retail_db import RetailDB
from parley.scenarios.tool_use.retail_desk import KINDS, STOP, build_task, reference_db
from parley.scenarios.tools.tool import ToolFailure

ID = "tool_use/retail-desk-v0"
TASKS = range(40)


def _metrics(task: int, assistant: Any) -> dict[str, float]:
    record = play_episode(
        ID, seed=0, task=task, agents={"user": RetailUser(), "assistant": assistant}
    )
    return json.loads(record[-1][1])


def test_at_least_30_distinct_tasks_cover_every_kind() -> None:
    tasks = [build_task(i) for i in TASKS]
    assert len({(t.email, t.opening) for t in tasks}) == len(tasks) >= 30
    assert {KINDS[t.index % len(KINDS)] for t in tasks} == set(KINDS)
    assert all(t.facts for t in tasks)
    assert build_task(7) == build_task(7)  # pure function of the index


def test_oracle_solves_every_task_and_naive_only_the_lookups() -> None:
    oracle = [_metrics(i, RetailOracle())["success"] for i in TASKS]
    naive = [_metrics(i, RetailNaive())["success"] for i in TASKS]
    assert oracle == [1.0] * len(TASKS)
    lookups = [i for i in TASKS if KINDS[i % len(KINDS)] == "status"]
    assert [i for i in TASKS if naive[i]] == lookups


def _run(task: int, actions: list[str]) -> tuple[Any, dict[str, float]]:
    """Play the opening, then the given assistant actions, then the user's stop."""
    env = make(ID, task=task)
    env.reset(seed=0)
    env.step({"user": build_task(task).opening, "assistant": ""})
    for action in actions:
        env.step({"user": "", "assistant": action})
    env.step({"user": "thanks " + STOP, "assistant": ""})
    return env, env.episode_metrics()


def test_reward_needs_both_the_right_database_and_the_facts() -> None:
    task = build_task(0)  # a cancellation
    calls = [{"name": "find_customer", "arguments": {"email": task.email}}]
    calls += [{"name": n, "arguments": a} for n, a in task.actions]
    silent = json.dumps({"tool_calls": calls, "message": "Done."})
    _, metrics = _run(0, [silent])
    assert metrics["db_match"] == 1.0
    assert metrics["facts_said"] == 0.0
    assert metrics["success"] == 0.0
    lying = json.dumps({"message": f"Cancelled, you get {task.facts[0]} back."})
    _, metrics = _run(0, [lying])
    assert (metrics["db_match"], metrics["facts_said"], metrics["success"]) == (0.0, 1.0, 0.0)
    honest = json.dumps({"tool_calls": calls, "message": f"Refund: {task.facts[0]}."})
    env, metrics = _run(0, [honest])
    assert metrics["success"] == 1.0
    status = env.db.conn.execute(
        "SELECT status FROM orders WHERE id=?", (task.actions[0][1]["order_id"],)
    ).fetchone()
    assert status == ("cancelled",)


def test_tools_enforce_the_store_policy() -> None:
    task = build_task(0)
    db = RetailDB.generate(__import__("numpy").random.default_rng([0, 2024]))
    order = task.actions[0][1]["order_id"]
    with pytest.raises(ToolFailure, match="find_customer"):
        db.get_order(order)
    found = db.find_customer(task.email)
    assert order in found["orders"]
    other = db.conn.execute(
        "SELECT id FROM orders WHERE customer_id != ? LIMIT 1", (found["customer_id"],)
    ).fetchone()[0]
    with pytest.raises(ToolFailure, match="not found"):
        db.get_order(other)
    delivered = db.conn.execute(
        "SELECT id FROM orders WHERE customer_id=? AND status='delivered'", (found["customer_id"],)
    ).fetchone()[0]
    with pytest.raises(ToolFailure, match="only pending orders"):
        db.cancel_order(delivered, "no longer needed")
    before = db.dump()
    db.cancel_order(order, "ordered by mistake")
    with pytest.raises(ToolFailure, match="only pending orders"):
        db.cancel_order(order, "ordered by mistake")
    after = db.dump()
    assert len(after["refunds"]) == len(before["refunds"]) + 1
    assert after == reference_db(task)


def test_assistant_tool_errors_and_bad_actions_are_reported() -> None:
    env = make(ID, task=1)
    env.reset(seed=0)
    env.step({"user": build_task(1).opening, "assistant": ""})
    bad_args = {"name": "cancel_order", "arguments": {"order_id": "#W1", "reason": "because"}}
    action = json.dumps({"tool_calls": [bad_args, {"name": "drop_table", "arguments": {}}]})
    observations, _, _, _, infos = env.step({"user": "", "assistant": action})
    text = observations["assistant"]
    assert 'arguments.reason must be one of ["no longer needed", "ordered by mistake"]' in text
    assert "unknown tool 'drop_table'" in text
    assert infos["assistant"]["to_act"]  # no message: the assistant goes on
    _, _, _, _, infos = env.step({"user": "", "assistant": "{}"})
    assert "tool_calls" in infos["assistant"]["invalid"]
