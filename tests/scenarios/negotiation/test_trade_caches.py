"""simple-trade's per-text caches (issue 11 §5) change nothing a player or caller can see."""

from __future__ import annotations

import random

from parley.scenarios import make
from parley.scenarios.helpers import TextMemo
from parley.scenarios.negotiation import simple_trade as st
from parley.scenarios.negotiation import simple_trade_v1 as v1

PIECES = ["[Offer: I give ", "1 Wood", "; You give ", "2 gold", "]", "[Accept]", "[Deny]", ", "]


def test_cached_parse_equals_fresh_parse_on_fuzzed_text() -> None:
    rnd = random.Random(7)
    for _ in range(2000):
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 6)))
        assert st._parse_cached(text) == st.parse_move(text), text


def test_mutating_a_public_parse_result_does_not_poison_play() -> None:
    move = "[Offer: I give 1 Wood; You give 1 Gold]"
    st._parse_cached(move)  # cached now
    _, payload, _ = st.parse_move(move)
    payload[0]["Wood"] = 999  # a careless caller's edit of its own result
    env = make("negotiation/simple-trade-v0")
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"player_0": move, "player_1": ""})
    assert "invalid" not in infos["player_0"]
    assert infos["player_1"]["view"]["pending"] == {"give": {"Gold": 1}, "get": {"Wood": 1}}


def test_a_trade_leaves_the_cached_offer_intact() -> None:
    move = "[Offer: I give 2 Wood; You give 1 Gold]"
    env = make("negotiation/simple-trade-v0")
    for seed in range(3):  # the same cached payload, trade after trade, episode after episode
        env.reset(seed=seed)
        env.step({"player_0": move, "player_1": ""})
        _, _, _, _, infos = env.step({"player_0": "", "player_1": "[Accept]"})
        assert infos["player_1"]["view"]["inventory"] == {"Wood": 12, "Gold": 9}
    assert st._parse_cached(move)[1] == ({"Wood": 2}, {"Gold": 1})


def test_show_cached_equals_show_and_stops_growing() -> None:
    rnd = random.Random(3)
    for _ in range(6000):
        bundle = {r: rnd.randint(0, 40) for r in rnd.sample(st.RESOURCES, rnd.randint(0, 2))}
        assert st.show_cached(bundle) == st.show(bundle)
    assert len(st._SHOWN) <= 4096


V1_PIECES = ["[Offer:", " 1 Wood", " -> ", "2 Gold", "]", "[Accept]", "[deny]", " and ", "."]
# (whole offers in the taught syntax exercise _read's fast path, zero and case variants too)
V1_PIECES += ["[Offer: 1 Gold -> 3 Wood]", "[offer: 1 Gold -> 1 Wood]", "[Offer: 0 Wood -> 1 Gold]"]
# (any case of the brackets, stray brackets and newlines: _read finds the brackets by lowering
# the text, the rules' patterns by IGNORECASE; the two agree on the action space's ASCII)
V1_PIECES += ["[ACCEPT]", "[DeNy]", "[OFFER: 2 wood -> 1 gold]", "[oFfEr:", "\n", "[", "]", "x"]


def test_v1_cached_read_equals_the_uncached_rules_on_fuzzed_text() -> None:
    rnd = random.Random(11)
    for _ in range(20000):
        text = "".join(rnd.choice(V1_PIECES) for _ in range(rnd.randint(0, 9)))
        body = v1.find_offer(text)
        offer = None if body is None else (v1.parse_offer(body.strip()) or "")
        expected = (v1.ACCEPT.search(text) is not None, v1.DENY.search(text) is not None, offer)
        assert v1._read(text) == expected, text


def test_v1_trades_through_the_cached_offer_leave_it_intact() -> None:
    move = "[Offer: 2 Wood -> 1 Gold]"
    env = make("negotiation/simple-trade-v1")
    for seed in range(3):
        env.reset(seed=seed)
        env.step({"player_0": move, "player_1": ""})
        _, _, _, _, infos = env.step({"player_0": "", "player_1": "[Accept]"})
        assert infos["player_1"]["view"]["inventory"] == {"Wood": 12, "Gold": 9}
    assert v1._read(move)[2] == ({"Wood": 2}, {"Gold": 1})


def test_the_text_memo_answers_as_its_function_and_stays_within_its_cap() -> None:
    calls: list[str] = []

    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    memo = TextMemo(length, cap=8)
    rnd = random.Random(5)
    for _ in range(500):
        text = "x" * rnd.randint(0, 20)  # 21 texts: some recur, the memo fills and empties
        assert memo(text) == len(text)
        assert len(memo.memo) <= 8
    assert memo.misses == len(calls) < 500  # recurring texts were answered from the memo
    before = memo.misses
    memo("y")
    memo("y")
    assert memo.misses == before + 1
