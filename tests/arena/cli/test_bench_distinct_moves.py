"""bench env's distinct-moves case (issue 11 §5): no move text recurs, as an LLM's would not.
The rules code remembers offers, not messages: the offer brackets inside the distinct texts
recur and hit, the whole texts are never kept."""

from __future__ import annotations

from parley.arena.bench import textarena
from parley.scenarios.negotiation import simple_trade, simple_trade_v1


def test_distinct_moves_hit_only_the_offer_memos_which_keep_no_message() -> None:
    for scenario, memo in (
        ("negotiation/simple-trade-v0", simple_trade._offer_memo),
        ("negotiation/simple-trade-v1", simple_trade_v1._offer_in),
    ):
        textarena._ours(scenario, 3, distinct=True)  # (the offers are in the memo now)
        first = next(textarena._UNIQUE)
        before, size = memo.misses, len(memo.memo)
        assert textarena._ours(scenario, 5, distinct=True) > 0
        assert next(textarena._UNIQUE) > first + 5 * textarena.TURNS // 2  # new texts each move
        assert memo.misses == before  # the recurring offers were not parsed again
        assert len(memo.memo) == size  # and no message was kept
        assert all("offer" in key.lower() and "Note" not in key for key in memo.memo)
