"""Work the adapters do per step (issue 31 §4: an imported game's step against the library's
own): counted, not timed."""

from __future__ import annotations

import random

import pytest

from parley.scenarios import make
from parley.scenarios.imported.moves import LegalMoves


def test_the_same_legal_moves_are_built_once_and_shared() -> None:
    first = LegalMoves.of(["Pass", "Bet"], [0, 1])
    again = LegalMoves.of(["Pass", "Bet"], [0, 1])
    assert again is first  # (built anew on every step before)
    assert isinstance(first.shown, tuple)  # shared, so it cannot be changed
    assert first.by_text == {"pass": 0, "bet": 1}
    assert first.listed() == "Pass, Bet"
    assert LegalMoves.of(["x", "x"], [3, 4]).shown == ("x #3", "x #4")


@pytest.mark.timeout(60)
def test_a_textarena_episode_never_copies_the_callers_random_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """random.getstate copies 625 words: the adapter used to swap states four times around
    every call into TextArena (two calls a step), then copied the caller's state once per
    episode; now its own generator is seeded per episode, and the caller's generator and
    functions are as they were."""
    pytest.importorskip("textarena")
    env = make("textarena:TicTacToe-v0")
    copies = 0
    real = random.getstate

    def counting() -> object:
        nonlocal copies
        copies += 1
        return real()

    monkeypatch.setattr(random, "getstate", counting)
    functions = {name: getattr(random, name) for name in ("choice", "seed", "shuffle", "random")}
    random.seed(7)
    expected = random.Random(7).random()
    _, infos = env.reset(seed=0)
    steps = 0
    for move in ["[4]", "[0]", "[8]", "[2]", "[6]", "[1]", "[7]", "[3]", "[5]"]:
        if not env.agents:
            break
        seat = next(s for s in env.agents if infos[s]["to_act"])
        _, _, _, _, infos = env.step({seat: move})
        steps += 1
    assert steps >= 5
    assert copies == 0  # (4 per call, 2 calls a step, at first; then 1 an episode)
    assert random.random() == expected  # the caller's stream did not move
    assert {name: getattr(random, name) for name in functions} == functions
