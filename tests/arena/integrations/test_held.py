"""HeldEpisodes: the work-bounded episode table the verl and SkyRL integrations share."""

from __future__ import annotations

from parley.arena.integrations.held import HeldEpisodes


def test_idle_counts_calls_and_skips_an_episode_being_played() -> None:
    held: HeldEpisodes[str, int] = HeldEpisodes(max_sessions=10, idle_calls=2)
    for key in "abc":
        held.call()
        held.add(key, ord(key))
    assert held.idle() == []
    with held.playing("a"):  # a's call is played while others make three calls
        for _ in range(3):
            held.call()
        assert "a" not in held.idle()
        assert held.idle() == ["b", "c"]
    assert held.idle() == ["b", "c"]  # a is idle only counting from its answer
    for _ in range(3):
        held.call()
    assert held.idle() == ["b", "c", "a"]


def test_over_is_the_least_recent_past_capacity() -> None:
    held: HeldEpisodes[str, int] = HeldEpisodes(max_sessions=2, idle_calls=100)
    for key in "abc":
        held.add(key, 0)
    assert held.over() == ["a"]
    assert held.over(room=1) == ["a", "b"]
    with held.playing("a"):  # touched: now the most recent
        assert held.over() == ["b"]
    assert held.in_order() == ["b", "c", "a"]


def test_an_episode_let_go_of_during_its_call_stays_gone() -> None:
    held: HeldEpisodes[str, int] = HeldEpisodes(max_sessions=2, idle_calls=1)
    held.add("a", 1)
    with held.playing("a"):
        assert held.pop("a") == 1
    assert "a" not in held
    assert held.pop("a") is None
    held.add("a", 2)  # a new episode under the same key is not the old call's
    assert held["a"] == 2
