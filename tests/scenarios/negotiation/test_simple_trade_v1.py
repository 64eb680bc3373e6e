"""negotiation/simple-trade-v1 follows SPIRAL's SimpleNegotiation rule for rule (issue 10 s4).

Each test names the rule of spiral/envs/SimpleNegotiation/env.py (TextArena 0.6.4,
error_allowance=0) that it checks.
"""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import pytest

from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.negotiation.simple_trade_v1 import find_offer, parse_offer

ID = "negotiation/simple-trade-v1"


def _play(*moves: str, **kwargs: Any) -> tuple[Any, list[Any]]:
    """Play ``moves`` alternately from player_0; return the env and every step's output."""
    env = make(ID, **kwargs)
    env.reset(seed=0)
    out = []
    for move in moves:
        seat = env.acting()[0]
        out.append(env.step({a: (move if a == seat else "") for a in env.agents}))
    return env, out


@pytest.mark.parametrize(
    ("body", "parsed"),
    [
        ("3 Wood -> 2 Gold", ({"Wood": 3}, {"Gold": 2})),
        ("I give 1 Wood and 2 Gold -> 3 Wood", ({"Wood": 1, "Gold": 2}, {"Wood": 3})),
        ("i offer 2 woods, 1 gold -> 1 GOLD.", ({"Wood": 2, "Gold": 1}, {"Gold": 1})),
        ("2 Wood, 1 Wood -> 1 Gold", ({"Wood": 3}, {"Gold": 1})),
        ("0 Wood -> 1 Gold", None),  # every quantity > 0: no gifts
        ("2 Wood -> nothing", None),
        ("2 Wood", None),
        ("2 Stone -> 1 Gold", None),
        ("I give 2 Wood; You give 1 Gold", None),  # v0's syntax
        ("1 Wood -> 1 Gold -> 1 Wood", None),
    ],
)
def test_offer_syntax(body: str, parsed: Any) -> None:
    assert parse_offer(body) == parsed


def test_an_offer_persists_until_answered() -> None:
    env, _ = _play("[Offer: 2 Wood -> 1 Gold]", "Let me think.", "Still there?")
    assert env.view("player_1")["pending"] == {"give": {"Gold": 1}, "get": {"Wood": 2}}
    env.step({"player_0": "", "player_1": "ok [Accept]"})
    assert env.view("player_1")["inventory"] == {"Wood": 12, "Gold": 9}


def test_accept_and_a_new_offer_in_one_turn() -> None:
    env, _ = _play("[Offer: 2 Wood -> 1 Gold]", "[Accept] and now [Offer: 1 Wood -> 2 Gold]")
    assert env.trade.trades == 1
    assert env.view("player_0")["pending"] == {"give": {"Gold": 2}, "get": {"Wood": 1}}
    assert env.view("player_0")["pending_from_partner"]


@pytest.mark.parametrize("move", ["[Accept]", "[Deny]", "[Accept] [Deny]"])
def test_accept_or_deny_with_nothing_pending_is_ignored(move: str) -> None:
    env, out = _play(move, move)
    assert env.agents
    assert all("invalid" not in info for info in out[-1][4].values())
    assert env.trade.trades == 0


def test_deny_clears_the_offer_and_a_counter_offer_replaces_it() -> None:
    env, _ = _play("[Offer: 2 Wood -> 1 Gold]", "[Deny]")
    assert env.trade.pending is None
    env, _ = _play("[Offer: 2 Wood -> 1 Gold]", "[Offer: 1 Gold -> 1 Wood]")
    assert env.trade.pending == {"from": "player_1", "give": {"Gold": 1}, "get": {"Wood": 1}}


@pytest.mark.parametrize(
    "moves",
    [
        ("[Offer: 0 Wood -> 1 Gold]",),
        ("[Offer: 11 Wood -> 1 Gold]",),  # more than you hold
        ("[Offer: 2 Wood -> 1 Gold]", "fine", "[Accept]"),  # accepting your own offer
        ("[Offer: 1 Wood -> 11 Gold]", "[Accept]"),  # accepting what you cannot pay
        ("hi", "[Offer: 2 Wood]"),
        ("caf\u00e9",),  # outside the action space
    ],
)
def test_the_first_invalid_move_ends_the_game_minus_one_to_the_offender(moves: tuple[str]) -> None:
    env, out = _play(*moves)
    offender = ("player_0", "player_1")[(len(moves) - 1) % 2]
    _, rewards, terminations, _, infos = out[-1]
    assert all(terminations.values())
    assert "invalid" in infos[offender]
    partner = "player_1" if offender == "player_0" else "player_0"
    assert rewards == {offender: -1.0, partner: 0.0}
    assert env.episode_metrics()["forfeit"] == 1.0


def test_an_offerer_short_of_what_it_offered_cancels_the_trade_without_fault() -> None:
    env, _ = _play("[Offer: 10 Wood -> 1 Gold]", "no", "[Offer: 10 Wood -> 10 Gold]")
    # player_0's second offer replaced its first; now make it uncoverable by a trade.
    env.trade.inventory["player_0"]["Wood"] = 3
    _, _, terminations, _, infos = env.step({"player_0": "", "player_1": "[Accept]"})
    assert not any(terminations.values())
    assert "invalid" not in infos["player_1"]
    assert env.trade.pending is None
    assert env.trade.trades == 0


def test_ten_turns_then_the_larger_gain_wins_and_equal_gains_draw() -> None:
    env, out = _play("[Offer: 2 Wood -> 1 Gold]", "[Accept]", *["..."] * 8)
    _, rewards, terminations, _, _ = out[-1]
    assert all(terminations.values())
    assert len(out) == 10
    # player_0: -2 Wood (5) +1 Gold (15) = +5; player_1: +2 Wood (15) -1 Gold (5) = +25.
    assert rewards == {"player_0": -1.0, "player_1": 1.0}
    env, out = _play(*["..."] * 10)
    assert out[-1][1] == {"player_0": 0.0, "player_1": 0.0}
    assert env.episode_metrics()["draw"] == 1.0


def test_randomize_varies_values_and_stocks_by_seed_reproducibly() -> None:
    seen = set()
    for seed in range(20):
        env = make(ID, randomize=True)
        env.reset(seed=seed)
        again = make(ID, randomize=True)
        again.reset(seed=seed)
        assert env.state() == again.state()
        seen.add(env.state())
        values = [env.view(seat)["values"] for seat in env.possible_agents]
        assert values[0]["Wood"] * values[1]["Gold"] != values[0]["Gold"] * values[1]["Wood"]
        assert all(
            5 <= n <= 15 for seat in env.possible_agents for n in env.trade.start[seat].values()
        )
    assert len(seen) == 20
    fixed = make(ID)
    fixed.reset(seed=3)
    assert fixed.view("player_0")["values"] == {"Wood": 5, "Gold": 15}


@pytest.mark.parametrize("randomize", [False, True])
def test_the_scripted_traders_never_forfeit_and_trade(randomize: bool) -> None:
    trades = 0.0
    for seed in range(10):
        record = play_episode(ID, seed=seed, randomize=randomize)
        metrics = json.loads(record[-1][1])
        assert metrics["forfeit"] == 0.0
        assert metrics["invalid_moves"] == 0.0
        trades += metrics["trades"]
    assert trades > 0


SPIRAL_OFFER = re.compile(
    r"\[Offer:\s*(?:I\s+(?:give|offer)\s+)?([^\[\]]+?)\s*\.*\]", re.IGNORECASE | re.DOTALL
)
PIECES = ["[Offer:", "[offer: ", "I give ", "i offer ", "I  offer  ", " ", ".", "..", " . ",
          "]", "[", "3 Wood", "->", " and ", ",", "x", "\n", "Gold", "[Accept]", "I", "give",
          "I\ngive\n"]  # fmt: skip


def test_find_offer_captures_what_spirals_pattern_captures() -> None:
    rng = random.Random(0)
    for _ in range(30_000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        match = SPIRAL_OFFER.search(text)
        assert find_offer(text) == (match.group(1) if match else None), repr(text)


@pytest.mark.parametrize(
    "text",
    ["[Offer: x" + " " * 990 + "y", "[Offer: x" + " " * 500 + "." * 480 + "y]", "[Offer:" * 142],
)
def test_find_offer_is_linear_where_spirals_pattern_is_quadratic(text: str) -> None:
    start = time.thread_time()
    find_offer(text)
    assert time.thread_time() - start < 0.002
