"""deal-or-no-deal-v0: the published context constraints and golden hand-made cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.negotiation.deal_or_no_deal import (
    agreement,
    generate_context,
    pareto_optimal,
    parse_claim,
    score,
    valid_context,
    value_vectors,
)

ID = "negotiation/deal-or-no-deal-v0"


def test_generated_contexts_meet_the_published_constraints() -> None:
    rng = np.random.default_rng(0)
    seen_totals = set()
    for _ in range(500):
        counts, a, b = generate_context(rng)
        seen_totals.add(sum(counts))
        assert all(1 <= c <= 4 for c in counts)
        assert 5 <= sum(counts) <= 7
        assert score(counts, a) == score(counts, b) == 10
        assert all(x > 0 or y > 0 for x, y in zip(a, b, strict=True))  # none worthless to both
        assert any(x > 0 and y > 0 for x, y in zip(a, b, strict=True))  # one valued by both
        assert valid_context(counts, a, b)
    assert seen_totals == {5, 6, 7}


def test_value_vectors_enumerate_exactly_the_sums_to_ten() -> None:
    assert len(value_vectors((1, 1, 1))) == 66  # compositions of 10 into 3 parts
    assert value_vectors((4, 3, 3)) == [(1, 0, 2), (1, 1, 1), (1, 2, 0)]


@pytest.mark.parametrize(
    ("counts", "a", "b", "ok"),
    [
        ((1, 2, 3), (4, 0, 2), (0, 2, 2), True),
        ((1, 2, 3), (4, 0, 2), (2, 1, 2), True),
        ((1, 2, 3), (4, 0, 2), (4, 0, 2), False),  # hats worthless to both
        ((1, 2, 3), (10, 0, 0), (0, 5, 0), False),  # balls worthless to both; nothing shared
        ((1, 1, 1), (4, 3, 3), (4, 3, 3), False),  # 3 items in total
        ((2, 2, 2), (5, 0, 0), (0, 0, 5), False),  # hats worthless to both
    ],
)
def test_valid_context_golden(counts, a, b, ok) -> None:  # type: ignore[no-untyped-def]
    assert valid_context(counts, a, b) is ok


def test_agreement_score_and_pareto_golden() -> None:
    counts, a, b = (1, 2, 3), (4, 0, 2), (0, 2, 2)
    assert agreement(counts, (1, 0, 2), (0, 2, 1))
    assert not agreement(counts, (1, 0, 2), (0, 2, 2))  # 5 balls claimed, 3 exist
    assert not agreement(counts, (1, 0, 1), (0, 2, 1))  # a ball left over
    assert score((1, 0, 2), a) == 8
    assert score((0, 2, 1), b) == 6
    assert pareto_optimal(counts, a, b, (1, 0, 2))
    assert pareto_optimal(counts, a, b, (1, 0, 3))  # 10 / 4: still undominated
    assert not pareto_optimal(counts, a, b, (0, 2, 1))  # hats wasted on A, book on B


def test_parse_claim() -> None:
    counts = (1, 2, 3)
    assert parse_claim("book=1 hat=0 ball=2 / book=0 hat=2 ball=1", counts) == ((1, 0, 2), None)
    assert parse_claim(" BOOK=1  hat=0 ball=2/book=0 hat=2 ball=1 ", counts)[0] == (1, 0, 2)
    assert parse_claim("no agreement", counts) == (None, None)
    assert parse_claim("book=2 hat=0 ball=2 / book=0 hat=2 ball=1", counts)[1]  # > count
    assert parse_claim("I take the book", counts)[1]


def _hand_made(env: Any) -> None:
    env.reset(seed=0)
    env.deal.counts, env.deal.values = (1, 2, 3), {"player_0": (4, 0, 2), "player_1": (0, 2, 2)}
    env.deal.speaker = env.deal.first = "player_0"


def test_episode_with_agreement() -> None:
    env = make(ID)
    _hand_made(env)
    obs, _, _, _, infos = env.step({"player_0": "I want the book and two balls."})
    assert "player_0: I want the book" in obs["player_1"]
    assert infos["player_1"]["to_act"]
    _, _, _, _, infos = env.step({"player_1": "<selection>"})
    assert infos["player_0"]["to_act"]
    assert infos["player_1"]["to_act"]
    assert infos["player_0"]["constraint"]["type"] == "regex"
    _, rewards, terms, _, infos = env.step(
        {
            "player_0": "book=1 hat=0 ball=2 / book=0 hat=2 ball=1",
            "player_1": "book=0 hat=2 ball=1 / book=1 hat=0 ball=2",
        }
    )
    assert rewards == {"player_0": 8.0, "player_1": 6.0}
    assert all(terms.values())
    assert infos["player_0"]["components"] == {"task": 8.0}
    metrics = env.episode_metrics()
    assert metrics["agreed"] == 1.0
    assert metrics["score"] == 7.0
    assert metrics["score_agreed"] == 7.0
    assert metrics["pareto_optimal"] == 1.0
    assert metrics["success"] == 1.0


def test_claims_that_do_not_add_up_score_zero_and_invalid_claims_are_recorded() -> None:
    env = make(ID)
    _hand_made(env)
    env.step({"player_0": "<selection>"})
    _, rewards, _, _, infos = env.step(
        {"player_0": "book=1 hat=0 ball=3 / book=0 hat=2 ball=0", "player_1": "gimme"}
    )
    assert rewards == {"player_0": 0.0, "player_1": -0.5}
    assert "invalid" in infos["player_1"]
    assert "invalid" not in infos["player_0"]
    metrics = env.episode_metrics()
    assert metrics["agreed"] == 0.0
    assert "score_agreed" not in metrics
    assert "pareto_optimal" not in metrics


def test_turn_limit_forces_the_choice() -> None:
    env = make(ID, max_turns=2)
    _hand_made(env)
    env.step({"player_0": "hi"})
    _, _, _, _, infos = env.step({"player_1": "hello"})
    assert infos["player_0"]["view"]["phase"] == "choose"
    assert infos["player_0"]["to_act"]
    assert infos["player_1"]["to_act"]


def test_first_speaker_is_random() -> None:
    firsts = {make(ID).reset(seed=s)[1]["player_0"]["to_act"] for s in range(20)}
    assert firsts == {True, False}


def test_scripted_self_play_agrees_with_plausible_scores() -> None:
    results = []
    for seed in range(60):
        env = make(ID)
        play_episode(ID, seed=seed, env=env)
        results.append(env.episode_metrics())
    agreed = np.mean([m["agreed"] for m in results])
    assert agreed >= 0.9
    assert all(0 <= m["score_player_0"] <= 10 for m in results)
    assert 5.0 <= np.mean([m["score"] for m in results]) <= 10.0
