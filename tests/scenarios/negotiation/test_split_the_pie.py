"""split-the-pie-v0: scripted players reach the closed-form stationary SPE outcome."""

from __future__ import annotations

import json

import pytest

from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.negotiation.split_the_pie import parse_proposal, quota, spe_shares

ID = "negotiation/split-the-pie-v0"


@pytest.mark.parametrize("delta", [0.9, 0.5])
@pytest.mark.parametrize("n", [3, 4, 5, 7])
def test_scripted_outcome_matches_the_closed_form(n: int, delta: float) -> None:
    proposer_share, member = spe_shares(n, delta)
    if n % 2:
        assert proposer_share == pytest.approx(1 - delta * (n - 1) / (2 * n))
    for seed in range(5):
        env = make(ID, n_players=n, delta=delta)
        play_episode(ID, seed=seed, env=env)
        payoffs = sorted(env.bargain.payoffs.values(), reverse=True)
        assert env.bargain.agreed
        assert env.bargain.round == 0
        assert payoffs[0] == pytest.approx(proposer_share, abs=1e-5)
        assert payoffs[1 : quota(n)] == pytest.approx([member] * (quota(n) - 1), abs=1e-5)
        assert payoffs[quota(n) :] == [0.0] * (n - quota(n))
        assert env.bargain.payoffs[env.bargain.proposer] == payoffs[0]


def test_rejection_shrinks_the_pie_and_the_round_limit_pays_nothing() -> None:
    env = make(ID, n_players=3, delta=0.5, max_rounds=2)
    _, infos = env.reset(seed=1)
    proposer = env.bargain.proposer
    env.step({proposer: "propose: 1 0 0"})
    _, _, _, _, infos = env.step(dict.fromkeys(env.possible_agents, "no"))
    view = infos["player_0"]["view"]
    assert view["round"] == 1
    assert view["pie"] == 0.5
    assert view["phase"] == "propose"
    proposer = env.bargain.proposer
    _, _rewards, terms, _, infos = env.step({proposer: "propose: 0.5 0.5 0.5"})  # sums to 1.5
    assert "invalid" in infos[proposer]
    assert all(terms.values())
    assert env.episode_metrics()["agreed"] == 0.0


def test_majority_passes_and_invalid_votes_count_as_no() -> None:
    env = make(ID, n_players=5, delta=0.9)
    env.reset(seed=3)
    proposer = env.bargain.proposer
    env.step({proposer: "propose: 0.2 0.2 0.2 0.2 0.2"})
    votes = {"player_0": "yes", "player_1": "vote yes", "player_2": "YES", "player_3": "maybe"}
    _, rewards, _, _, infos = env.step({**votes, "player_4": "no"})
    assert "invalid" in infos["player_3"]
    assert rewards["player_4"] == pytest.approx(0.2)
    assert json.loads(env.state())["state"]["agreed"] is True


def test_parse_proposal() -> None:
    assert parse_proposal("propose: 0.5 0.25 .25", 3) == ([0.5, 0.25, 0.25], None)
    assert parse_proposal("propose 0.5 0.5", 3)[1]
    assert parse_proposal("propose: 0.5 0.5 0.1", 3)[1]
    assert parse_proposal("propose: " + "1" * 900, 1)[1]  # huge number, no hang
    assert parse_proposal("share: a b c", 3)[1]


def test_the_pie_never_pays_more_than_itself() -> None:
    """Found by review: shares summing to 1 + 1e-6 passed the tolerance and paid 1.000001."""
    shares, reason = parse_proposal("propose: 1.000001 0 0", 3)
    assert reason is None
    assert shares is not None
    assert sum(shares) == pytest.approx(1.0, abs=1e-12)
    assert sum(shares) <= 1.0
    assert parse_proposal("propose: 0.333 0.333 0.334", 3) == ([0.333, 0.333, 0.334], None)
    env = make(ID, n_players=3, delta=0.9)
    env.reset(seed=3)
    env.step({env.bargain.proposer: "propose: 0.5 0.5 0.000001"})
    _, rewards, *_ = env.step(dict.fromkeys(env.agents, "yes"))
    assert sum(rewards.values()) <= 1.0
