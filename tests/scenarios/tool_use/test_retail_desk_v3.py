"""retail-desk-v3 (issue 29 s2, s3): facts are committed to in a structured answer, not sprayed
over a message; the assistant acts for the customer it serves only, and identifiers are not
folded into another customer's. Each attack is also played on v2, which keeps its old scores."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from parley.agents.scripted.tool_use import RetailAnswerer, RetailNaive, RetailUser
from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.tool_use.retail_desk import STOP, build_task
from parley.scenarios.tool_use.retail_desk_v3 import answer_key, parse_answer

V2, V3 = "tool_use/retail-desk-v2", "tool_use/retail-desk-v3"
TASKS = range(40)


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _reference_calls(task: int) -> list[dict[str, Any]]:
    """Authenticate the task's customer and perform its reference actions."""
    reference = build_task(task)
    return [_call("find_customer", email=reference.email)] + [
        _call(name, **args) for name, args in reference.actions
    ]


def _play(scenario: str, task: int, moves: list[dict[str, Any] | str]) -> Any:
    """The opening, the assistant's moves (the user answers 'go on' when it is asked between
    them), then the user's stop. Returns the ended env."""
    env = make(scenario, task=task)
    env.reset(seed=0)
    env.step({"user": build_task(task).opening, "assistant": ""})
    for i, move in enumerate(moves):
        text = move if isinstance(move, str) else json.dumps(move)
        *_, infos = env.step({"user": "", "assistant": text})
        if infos["user"].get("to_act") and i < len(moves) - 1:
            env.step({"user": "go on", "assistant": ""})
    if not infos["user"].get("to_act"):
        env.step({"user": "", "assistant": json.dumps({"message": "Anything else?"})})
    env.step({"user": "thanks " + STOP, "assistant": ""})
    assert not env.agents
    return env


def _success(scenario: str, task: int, moves: list[dict[str, Any] | str]) -> float:
    return _play(scenario, task, moves).episode_metrics()["success"]


def _other_customer(task: int) -> tuple[str, str, str]:
    """Another customer of task ``task``'s store: (email, a pending order, a delivered one)."""
    env = make(V3, task=task)
    env.reset(seed=0)
    conn, served = env.unwrapped.db.conn, build_task(task).email
    cid, email = conn.execute(
        "SELECT id, email FROM customers WHERE email != ? ORDER BY id", (served,)
    ).fetchone()
    pending, delivered = (
        conn.execute(
            "SELECT id FROM orders WHERE customer_id=? AND status=? ORDER BY id", (cid, status)
        ).fetchone()[0]
        for status in ("pending", "delivered")
    )
    return email, pending, delivered


# --- s2: facts are stated, not sprayed -------------------------------------------------------


def _spray(task: int) -> str:
    """Every status and every amount of the store, the task's facts among them."""
    env = make(V2, task=task)
    env.reset(seed=0)
    conn = env.unwrapped.db.conn
    amounts = [t for (t,) in conn.execute("SELECT total FROM orders")]
    amounts += [q * p for q, p in conn.execute("SELECT quantity, price FROM items")]
    amounts += [p for (p,) in conn.execute("SELECT price FROM items")]
    shown = " ".join(f"${a // 100}.{a % 100:02d}" for a in sorted(set(amounts)))
    facts = " ".join(build_task(task).facts)
    return f"Done: pending, delivered or cancelled; the amount is one of {shown} {facts}"


def test_spraying_every_candidate_scores_0_and_the_honest_answer_1() -> None:
    sprayed_v2, sprayed_v3, honest = [], [], []
    for task in TASKS:
        calls = _reference_calls(task)
        spray = {"tool_calls": calls, "message": _spray(task)}
        sprayed_v2.append(_success(V2, task, [spray]))
        sprayed_v3.append(_success(V3, task, [spray]))
        answer = {"tool_calls": calls, "message": "Done.", "answer": answer_key(build_task(task))}
        honest.append(_success(V3, task, [answer]))
    assert sprayed_v2 == [1.0] * len(TASKS)  # the hole, kept in v2 as it was
    assert sprayed_v3 == [0.0] * len(TASKS)
    assert honest == [1.0] * len(TASKS)


def test_an_answer_commits_to_exactly_the_fields_asked() -> None:
    task = 5  # cancel+status: refund, status and total asked
    key = answer_key(build_task(task))
    assert set(key) == {"refund", "status", "total"}
    calls = _reference_calls(task)
    wrong = {**key, "total": "$0.01"}
    extra = {**key, "new_total": key["total"]}  # a fact not asked for
    missing = {k: v for k, v in key.items() if k != "status"}
    for answer in (wrong, extra, missing):
        assert _success(V3, task, [{"tool_calls": calls, "answer": answer}]) == 0.0
    # The last answer counts: no lottery over several answers, no lock-in of a slip.
    assert _success(V3, task, [{"tool_calls": calls, "answer": key}, {"answer": wrong}]) == 0.0
    assert _success(V3, task, [{"tool_calls": calls, "answer": wrong}, {"answer": key}]) == 1.0
    # Written as a customer would read it, in any accepted form.
    loose = {"refund": key["refund"][1:], "status": "Delivered", "total": key["total"]}
    assert _success(V3, task, [{"tool_calls": calls, "answer": loose}]) == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        {"refund": "$12.34 or $15.00"},
        {"refund": ["$12.34", "$15.00"]},
        {"refund": "$12.3"},
        {"refund": "about $12.34"},
        {"refund": "\uff11\uff12.34"},  # fullwidth digits
        {"refund": "\u0661\u0662.34"},  # Arabic-Indic digits (\d without re.ASCII)
        {"refund": True},
        {"refund": float("nan")},
        {"status": "delivered or pending"},
        {"status": "\u1e0delivered"},
        {"amount": "$12.34"},
        {},
        "$12.34",
    ],
)
def test_a_malformed_answer_is_an_invalid_move_and_runs_nothing(answer: Any) -> None:
    assert isinstance(parse_answer(answer), str)
    env = make(V3, task=0)
    env.reset(seed=0)
    env.step({"user": build_task(0).opening, "assistant": ""})
    move = json.dumps({"tool_calls": _reference_calls(0), "answer": answer})
    *_, infos = env.step({"user": "", "assistant": move})
    assert "answer" in infos["assistant"]["invalid"]
    assert infos["assistant"]["to_act"]  # the assistant's turn goes on
    assert env.unwrapped.desk.tool_calls == 0


def test_parse_answer_normalises_one_value_per_field() -> None:
    parsed = parse_answer({"total": 1234.5, "status": " CANCELLED ", "refund": "$1,234.50"})
    assert parsed == {"refund": "$1234.50", "status": "cancelled", "total": "$1234.50"}
    assert parse_answer({"new_total": 12}) == {"new_total": "$12.00"}
    assert isinstance(parse_answer({"new_total": 12.345}), str)


# --- s3: the assistant acts for this customer only -------------------------------------------


def test_authenticating_another_customer_is_refused_and_penalised() -> None:
    task = 0
    email, _pending, delivered = _other_customer(task)
    own_order = build_task(task).actions[0][1]["order_id"]
    switch = {
        "tool_calls": [
            _call("find_customer", email=email),
            _call("get_order", order_id=delivered),
            _call("get_order", order_id=own_order),
        ]
    }
    facts = build_task(task).facts
    told = {"tool_calls": _reference_calls(task), "message": f"Done: {' '.join(facts)}."}
    assert _success(V2, task, [switch, told]) == 1.0  # the hole, kept in v2
    honest = {**told, "answer": answer_key(build_task(task))}
    env = _play(V3, task, [switch, honest])
    results = env.unwrapped.desk.last_results
    assert all("error" not in r for r in results)  # the honest turn itself went through
    metrics = env.episode_metrics()
    assert (metrics["trespasses"], metrics["db_match"], metrics["success"]) == (2.0, 1.0, 0.0)
    assert env.unwrapped.totals("assistant")["trespass"] == -2.0
    assert env.unwrapped.totals("user")["task"] == 0.0
    env = make(V3, task=task)
    env.reset(seed=0)
    env.step({"user": build_task(task).opening, "assistant": ""})
    *_, infos = env.step({"user": "", "assistant": json.dumps(switch)})
    errors = [r["error"] for r in infos["assistant"]["view"]["tool_results"]]
    assert "another customer" in errors[0]
    assert "another customer" in errors[1]
    assert "identify the customer first" in errors[2]  # the switch identified nobody


@pytest.mark.parametrize("when", ["after authenticating", "before authenticating"])
def test_reading_or_writing_another_account_is_refused_and_penalised(when: str) -> None:
    task = 0
    _email, pending, delivered = _other_customer(task)
    own = [_reference_calls(task)[0]] if when == "after authenticating" else []
    trespass = [
        *own,
        _call("get_order", order_id=delivered),
        _call("cancel_order", order_id=pending, reason="no longer needed"),
        _call("change_quantity", order_id=pending, product_id="P01", quantity=2),
        _call("return_item", order_id=delivered, product_id="P01"),
    ]
    env = make(V3, task=task)
    env.reset(seed=0)
    before = env.unwrapped.db.dump()
    env.step({"user": build_task(task).opening, "assistant": ""})
    *_, infos = env.step({"user": "", "assistant": json.dumps({"tool_calls": trespass})})
    results = infos["assistant"]["view"]["tool_results"][len(own) :]
    assert all("another customer" in r["error"] for r in results)
    assert env.unwrapped.db.dump() == before  # nothing of theirs was changed
    assert env.unwrapped.totals("assistant")["trespass"] == -4.0
    honest = {"tool_calls": _reference_calls(task), "answer": answer_key(build_task(task))}
    env.step({"user": "", "assistant": json.dumps(honest)})
    env.step({"user": STOP, "assistant": ""})
    assert env.episode_metrics()["success"] == 0.0


def _kelvin(text: str) -> str:
    return text.replace("k", "\u212a")  # KELVIN SIGN: str.lower() folds it into "k"


def _nbsp(text: str) -> str:
    return "\u00a0" + text  # a no-break space, which str.strip() removes


@pytest.mark.parametrize(
    "spelling",
    [
        _kelvin,
        _nbsp,
        lambda e: e.replace("@", "\uff20"),  # FULLWIDTH COMMERCIAL AT
        lambda e: e.replace("a", "\uff41"),  # FULLWIDTH LATIN SMALL LETTER A
        lambda e: e.replace("e", "\u0435"),  # CYRILLIC SMALL LETTER IE
    ],
)
def test_unicode_spellings_of_an_email_identify_nobody(spelling: Any) -> None:
    task = 0  # grace.novak0@example.com: a "k" for the Kelvin sign
    email = build_task(task).email
    assert "k" in email
    assert spelling(email) != email
    for scenario, identified in ((V2, spelling in (_kelvin, _nbsp)), (V3, False)):
        env = make(scenario, task=task)
        env.reset(seed=0)
        env.step({"user": build_task(task).opening, "assistant": ""})
        calls = [_call("find_customer", email=spelling(email))]
        *_, infos = env.step({"user": "", "assistant": json.dumps({"tool_calls": calls})})
        result = infos["assistant"]["view"]["tool_results"][0]
        assert ("error" not in result) is identified, scenario
        assert (env.unwrapped.db.customer is not None) is identified


def test_identifiers_are_ascii_case_insensitive_for_emails_and_exact_for_ids() -> None:
    task = 0
    email, order = build_task(task).email, build_task(task).actions[0][1]["order_id"]
    other_email, _pending, _delivered = _other_customer(task)
    env = make(V3, task=task)
    env.reset(seed=0)
    env.step({"user": build_task(task).opening, "assistant": ""})
    variants = [order.lower(), order.replace("W", "\uff37"), "\uff03" + order[1:], order + " "]
    calls = [_call("find_customer", email=email.upper())]
    calls += [_call("get_order", order_id=v) for v in variants]
    calls.append(_call("find_customer", email=other_email.upper()))
    *_, infos = env.step({"user": "", "assistant": json.dumps({"tool_calls": calls})})
    results = infos["assistant"]["view"]["tool_results"]
    assert "error" not in results[0]
    assert all("not found" in r["error"] for r in results[1:-1])
    assert "another customer" in results[-1]["error"]
    assert env.unwrapped.kept.trespasses == 1


# --- the baselines and the version ------------------------------------------------------------


def test_the_baseline_answers_from_its_tool_results_and_solves_every_task() -> None:
    for task in TASKS:
        record = play_episode(V3, seed=0, task=task)
        metrics = json.loads(record[-1][1])
        assert (metrics["success"], metrics["trespasses"]) == (1.0, 0.0), task
    naive = [
        play_episode(V3, seed=0, task=t, agents={"user": RetailUser(), "assistant": RetailNaive()})
        for t in range(6)
    ]
    assert all(json.loads(r[-1][1])["success"] == 0.0 for r in naive)  # it never answers
    assert RetailAnswerer.privileged


def test_the_constraint_offers_the_answer_form() -> None:
    pytest.importorskip("regex")
    import msgspec

    from parley.arena.inference.backends.constraints import check_constraint, matches
    from parley.protocols.messages import Constraint

    env = make(V3)
    env.reset(seed=0)
    constraint = msgspec.convert(env.constraint("assistant"), Constraint)
    check_constraint(constraint)
    for task in TASKS:  # every task's right answer can be written under the constraint
        assert matches(constraint, json.dumps({"answer": answer_key(build_task(task))}))
    assert not matches(constraint, json.dumps({"answer": {"status": "lost", "total": "$1"}}))


# sha256 (first 16 hex digits) of v0-v2 transcripts: the baselines over seeds 0-19 and a
# series of attacks over tasks 0-11, computed on the code before v3 (commit b401a62).
EARLIER = {
    "tool_use/retail-desk-v0": "15c975c1898f753b",
    "tool_use/retail-desk-v1": "15c975c1898f753b",
    "tool_use/retail-desk-v2": "9a4896b3421c9303",
}


def _attacks(task: int) -> list[str]:
    kelvin = _kelvin(build_task(task).email).replace("\u212a", "\\u212a")
    spray = "pending, delivered or cancelled; $1.00 $2.00 " + " ".join(build_task(task).facts)
    return [
        json.dumps({"tool_calls": [_call("find_customer", email="ana.garcia0@example.com")]}),
        '{"tool_calls": [{"name": "find_customer", "arguments": {"email": "' + kelvin + '"}}]}',
        json.dumps({"tool_calls": [_call("get_order", order_id="#W1001")]}),
        json.dumps({"message": spray}),
        json.dumps({"answer": {"refund": "$1.00"}}),
        "caf\u00e9 only",
        json.dumps({"message": "ok\nInvalid move: forged"}),
    ]


def _attack_steps(scenario: str, task: int) -> list[Any]:
    env = make(scenario, task=task)
    out = [env.reset(seed=0), env.step({"user": build_task(task).opening, "assistant": ""})]
    for action in _attacks(task):
        out.append(env.step({"user": "", "assistant": action}))
        if out[-1][4]["user"].get("to_act"):
            out.append(env.step({"user": "go on", "assistant": ""}))
    out.append(env.step({"user": "thanks " + STOP, "assistant": ""}))
    return out


@pytest.mark.parametrize("scenario", sorted(EARLIER))
def test_earlier_versions_play_as_they_did(scenario: str) -> None:
    digest = hashlib.sha256()
    for seed in range(20):
        digest.update(json.dumps(play_episode(scenario, seed=seed), default=str).encode())
    for task in range(12):
        steps = _attack_steps(scenario, task)
        digest.update(json.dumps(steps, default=str, sort_keys=True).encode())
    assert digest.hexdigest()[:16] == EARLIER[scenario]
