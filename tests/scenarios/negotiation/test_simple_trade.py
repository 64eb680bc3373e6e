"""simple-trade-v0: offers, accepts, denials and the zero-sum outcome."""

from __future__ import annotations

from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.negotiation.simple_trade import parse_move

ID = "negotiation/simple-trade-v0"


def test_offer_accept_executes_the_trade_and_the_larger_gain_wins() -> None:
    env = make(ID, max_turns=2)
    _, infos = env.reset(seed=0)
    assert infos["player_0"]["to_act"]
    assert not infos["player_1"]["to_act"]
    obs, *_, infos = env.step({"player_0": "Try this [Offer: I give 3 Wood; You give 1 Gold]"})
    assert "Pending offer to you" in obs["player_1"]
    assert infos["player_1"]["view"]["pending"] == {"give": {"Gold": 1}, "get": {"Wood": 3}}
    _, rewards, terms, _, _ = env.step({"player_1": "[Accept]"})
    assert env.trade.inventory["player_0"] == {"Wood": 7, "Gold": 11}
    # player_0: -15 + 15 = 0; player_1: +45 - 5 = 40 -> player_1 wins.
    assert rewards == {"player_0": -1.0, "player_1": 1.0}
    assert all(terms.values())
    assert env.episode_metrics()["gain_player_1"] == 40.0


def test_invalid_moves_lose_the_turn() -> None:
    env = make(ID)
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"player_0": "[Accept]"})
    assert "no offer" in infos["player_0"]["invalid"]
    _, _, _, _, infos = env.step({"player_1": "[Offer: I give 11 Wood; You give 1 Gold]"})
    assert "cannot give" in infos["player_1"]["invalid"]
    _, _, _, _, infos = env.step({"player_0": "[Deny] [Accept]"})
    assert "one bracketed move" in infos["player_0"]["invalid"]
    assert env.trade.turn_index == 3
    assert env.trade.pending is None


def test_a_pending_offer_lapses_unless_accepted() -> None:
    env = make(ID)
    env.reset(seed=0)
    env.step({"player_0": "[Offer: I give 1 Wood; You give 1 Gold]"})
    env.step({"player_1": "hmm, no"})
    _, _, _, _, infos = env.step({"player_0": "[Accept]"})
    assert "invalid" in infos["player_0"]


def test_tie_gives_zero_and_scripted_play_finishes() -> None:
    env = make(ID, max_turns=2)
    env.reset(seed=0)
    env.step({"player_0": "hello"})
    _, rewards, _, _, _ = env.step({"player_1": "[Deny]"})  # nothing to deny: invalid
    assert rewards["player_0"] == 0.0
    env = make(ID)
    play_episode(ID, seed=0, env=env)
    metrics = env.episode_metrics()
    assert metrics["trades"] >= 1
    assert metrics["invalid_moves"] == 0


def test_parse_move() -> None:
    assert parse_move("[offer: i give 2 wood, 1 gold; you give 3 gold]")[1] == (
        {"Wood": 2, "Gold": 1},
        {"Gold": 3},
    )
    assert parse_move("[Offer: I give 2 Silver; You give 1 Gold]")[2]
    assert parse_move("just chatting")[0] == "talk"
