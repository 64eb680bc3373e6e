"""The replica router (:mod:`parley.arena.inference.routing`): longest held prefix wins,
an overloaded replica is passed over, sessions stick, memory stays bounded, and a removed
replica's sessions are routed afresh."""

from __future__ import annotations

import pytest

from parley.arena.inference.routing import Router, RoutingConfig
from parley.protocols.errors import ConfigError

SYSTEM = list(range(1000, 1032))  # a 2-block system prompt every session shares


def turns(session: int, n: int) -> list[int]:
    """The prompt of ``session``'s turn ``n``: the system prompt, then 24 tokens per turn,
    each turn extending the last."""
    out = list(SYSTEM)
    for t in range(n):
        out += [session * 100 + t] * 24
    return out


def test_the_replica_holding_the_longest_prefix_wins_over_a_less_busy_one() -> None:
    router = Router()
    router.record(0, "p", turns(1, 1))  # replica 0: the shared system prompt, session 1
    router.record(1, "p", turns(2, 3))  # replica 1: session 2's three turns
    # Session 2's fourth turn: replica 1 holds 6 of its blocks, replica 0 only 2.
    assert router.pick("p", turns(2, 4), [0, 1], [0, 2]) == 1
    assert router.counts.by_prefix == 1
    assert router.counts.matched_blocks == 6
    # Another policy's weights computed nothing of it: routed by load.
    assert router.pick("q", turns(2, 4), [0, 1], [0, 2]) == 0
    assert router.counts.by_load == 1
    # least_busy ignores what is held.
    plain = Router(RoutingConfig(policy="least_busy"))
    plain.record(1, "p", turns(2, 3))
    assert plain.pick("p", turns(2, 4), [0, 1], [0, 2]) == 0


def test_an_overloaded_replica_is_passed_over_for_the_least_busy() -> None:
    router = Router(RoutingConfig(balance_abs_threshold=2, balance_rel_threshold=1.5))
    for session in (2, 3, 4):
        router.record(1, "p", turns(session, 3))
    assert router.pick("p", turns(2, 4), [0, 1], [0, 3]) == 0  # 3 - 0 > 2 and 3 > 0
    assert router.counts.overloaded == 1
    # Both conditions must hold: 40 vs 30 is 10 more, but not 1.5 times as many ...
    assert router.pick("p", turns(3, 4), [0, 1], [30, 40]) == 1
    assert router.pick("p", turns(4, 4), [0, 1], [1, 3]) == 1  # ... and 2 more is within
    assert router.counts.by_prefix == 2
    # The fallback took session 2's fourth turn to replica 0: its fifth follows it there.
    assert router.pick("p", turns(2, 5), [0, 1], [1, 0]) == 0
    # Of two replicas holding as much, the less busy one.
    for replica in (0, 1):
        router.record(replica, "p", turns(9, 3))
    assert router.pick("p", turns(9, 3), [0, 1], [1, 0]) == 1
    assert router.pick("p", turns(9, 3), [0, 1], [0, 1]) == 0


def test_a_session_key_keeps_its_replica_when_its_prompt_changes() -> None:
    router = Router()
    first = router.pick("p", turns(7, 1), [0, 1], [1, 0], session="e7/a")
    assert first == 1
    # Its context was folded: the prompt no longer extends the last one, but the key does.
    folded = SYSTEM + [5] * 40
    router.record(0, "p", folded)  # replica 0 even holds the new prompt
    assert router.pick("p", folded, [0, 1], [0, 1], session="e7/a") == 1
    assert router.counts.by_session == 1
    assert router.pick("p", folded, [0, 1], [0, 1]) == 0  # without the key: by prefix


def test_memory_stays_bounded_over_10k_sessions_and_keeps_the_shared_prefix() -> None:
    config = RoutingConfig(max_blocks=2_000, max_sessions=500)
    router = Router(config)
    for session in range(10_000):
        for turn in (1, 2, 3):
            replica = router.pick("p", turns(session, turn), [0, 1], [0, 0], session=str(session))
            router.record(replica, "p", turns(session, turn) + [7] * 8)
        blocks, sessions = router.size
        assert blocks <= config.max_blocks
        assert sessions <= config.max_sessions
    assert router.held(0) + router.held(1) == router.size[0]
    # The shared system prompt is refreshed by every session: it was never evicted, while
    # the first sessions' own blocks were.
    assert router.counts.by_session == 2 * 10_000  # every later turn found its replica
    assert router.pick("p", turns(10_001, 1), [0, 1], [0, 0]) in (0, 1)
    assert router.counts.by_prefix == 10_000  # every first turn: by the system prompt

    def held(session: int) -> int:  # blocks of the session's third turn on any replica
        return max(router._match(r, router._chain("p", turns(session, 3))) for r in (0, 1))

    assert held(0) == 2  # the first sessions: only the system prompt is left
    assert held(9_999) == 6  # the last one: all of its 104 tokens' full blocks


def test_a_removed_replicas_sessions_and_prefixes_are_routed_afresh() -> None:
    router = Router()
    assert router.pick("p", turns(3, 2), [0, 1], [0, 0], session="s") == 0
    router.record(0, "p", turns(3, 2))
    assert router.held(0) > 0
    router.remove(0)  # it died
    assert router.held(0) == 0
    assert all(key[0] != 0 for key in router._blocks)
    # Its session goes to the survivor, and sticks there once a replacement is back.
    assert router.pick("p", turns(3, 3), [1], [0, 5], session="s") == 1
    assert router.pick("p", turns(3, 4), [0, 1], [0, 1], session="s") == 1
    # A weight change empties the map (the backends drop their caches), keys stay.
    router.clear()
    assert router.size == (0, 1)


@pytest.mark.parametrize(
    "options",
    [{"policy": "round_robin"}, {"block_tokens": 0}, {"balance_rel_threshold": 0.5}],
)
def test_bad_routing_options_say_what_is_allowed(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="routing"):
        RoutingConfig(**options)  # type: ignore[arg-type]
