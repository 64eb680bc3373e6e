"""LazyRng's memo of seed -> first generator state: the same draws as a new generator, the
generator reused only where this object made it, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest

from parley.scenarios import helpers, make
from parley.scenarios.helpers import LazyRng


def draws(rng: np.random.Generator) -> list[object]:
    """A little of every kind of draw, 32-bit ones too (they buffer half a 64-bit word)."""
    return [
        int(rng.integers(1 << 30, dtype=np.uint32)),
        float(rng.random()),
        rng.integers(0, 1 << 40, size=3).tolist(),
        float(rng.normal()),
        rng.permutation(6).tolist(),
        rng.choice(10, size=2, replace=False).tolist(),
        rng.bytes(5),
        int(rng.integers(7, dtype=np.int32)),
    ]


@pytest.mark.parametrize("seeds", [[0, 1, 0, 1, 0], [5, 2**40, 5, 5, 2**40, 7]])
def test_a_recurring_seed_draws_what_a_new_generator_draws(seeds: list[int]) -> None:
    owner = LazyRng()
    for seed in seeds:
        owner.seed_rng(seed)
        assert draws(owner.rng) == draws(np.random.default_rng(seed))
        owner.rng.integers(1 << 20, dtype=np.uint32)  # (left mid-word: the next seed resets it)


def test_the_generator_it_made_is_reused_and_an_assigned_one_never_is() -> None:
    owner = LazyRng()
    for _ in range(2):  # (a seed's state is kept from its second time on)
        owner.seed_rng(11)
        made = owner.rng
    owner.seed_rng(11)
    assert owner.rng is made  # re-seeded in place, not made again
    mine = np.random.default_rng(3)
    before = mine.bit_generator.state
    owner.rng = mine
    owner.seed_rng(11)
    assert owner.rng is made
    assert mine.bit_generator.state == before
    assert draws(owner.rng) == draws(np.random.default_rng(11))


def test_the_memo_is_bounded_and_keeps_the_recently_used() -> None:
    cap = helpers._FIRST_STATES_CAP
    owner = LazyRng()

    def see(seed: int) -> None:
        owner.seed_rng(seed)
        _ = owner.rng

    see(10**9)
    see(10**9)
    for seed in range(cap + 20):
        see(10**9 + 1 + seed)
        see(10**9 + 1 + seed)  # (seen twice: its state is kept)
        if seed % 100 == 0:
            see(10**9)  # used often: never the least recent
    assert len(helpers._FIRST_STATES) <= cap
    assert 10**9 in helpers._FIRST_STATES
    assert 10**9 + 1 not in helpers._FIRST_STATES
    for seed in range(5 * cap):  # fresh seeds: none kept, the set of seen ones bounded
        see(2 * 10**9 + seed)
    assert len(helpers._SEEN) <= 4 * cap
    assert 2 * 10**9 not in helpers._FIRST_STATES


def test_episodes_on_one_env_equal_episodes_on_fresh_ones() -> None:
    def transcript(env: object, seed: int) -> list[object]:
        observations, infos = env.reset(seed=seed)  # type: ignore[attr-defined]
        out: list[object] = [observations]
        rng = np.random.default_rng(seed)
        while env.agents:  # type: ignore[attr-defined]
            seat = next(s for s in env.agents if infos[s]["to_act"])  # type: ignore[attr-defined]
            legal = infos[seat]["view"]["legal"]
            step = env.step({seat: legal[int(rng.integers(len(legal)))]})  # type: ignore[attr-defined]
            infos = step[4]
            out.append(step[:4])
        return out

    pytest.importorskip("pyspiel")
    reused = make("openspiel:kuhn_poker")
    seeds = [3, 4, 3, 3, 4, 9]
    assert [transcript(reused, s) for s in seeds] == [
        transcript(make("openspiel:kuhn_poker"), s) for s in seeds
    ]
