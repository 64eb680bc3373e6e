"""bench env's distinct-moves case (issue 11 §5): no move text recurs, so the rules code's
per-text caches never hit and the figure is what an LLM's moves would cost."""

from __future__ import annotations

from parley.arena.bench import textarena
from parley.scenarios.negotiation import simple_trade, simple_trade_v1


def test_distinct_moves_never_hit_the_parse_caches() -> None:
    for scenario, cached in (
        ("negotiation/simple-trade-v0", simple_trade._parse_cached),
        ("negotiation/simple-trade-v1", simple_trade_v1._read),
    ):
        textarena._ours(scenario, 3, distinct=True)  # (fills the cache with its own texts)
        before = cached.cache_info()
        assert textarena._ours(scenario, 5, distinct=True) > 0
        after = cached.cache_info()
        assert after.hits == before.hits
        assert after.misses == before.misses + 5 * textarena.TURNS
        textarena._ours(scenario, 2)  # the repeated moves do hit: the case above is the contrast
        assert cached.cache_info().hits > after.hits
