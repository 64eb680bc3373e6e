"""reset(seed=n) seeds the generator on first use (issue 11 §5): the same stream as seeding
at reset, for every order of resets and draws; a wrong new_episode_draws fails loudly."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from parley.scenarios import make
from parley.scenarios.base import Scenario


def draws(rng: np.random.Generator) -> list[int]:
    return [int(x) for x in rng.integers(0, 1 << 30, size=4)]


def test_lazy_seed_gives_the_stream_seeding_at_reset_gives() -> None:
    env = make("negotiation/simple-trade-v0")
    env.reset(seed=5)
    env.reset()  # no draw in between: still the seed-5 stream
    assert draws(env.rng) == draws(np.random.default_rng(5))
    after = draws(env.rng)  # continues, as an eager generator would
    env.reset()
    expected = np.random.default_rng(5)
    draws(expected)
    assert after == draws(expected)
    env.reset(seed=5)  # a drawn generator is replaced by the new seed's
    assert draws(env.rng) == draws(np.random.default_rng(5))


@pytest.mark.parametrize("seed", [np.int64(7), [1, 2], np.random.SeedSequence(3)])
def test_other_numpy_seeds_still_seed_at_reset(seed: Any) -> None:
    env = make("negotiation/simple-trade-v0")
    env.reset(seed=seed)
    assert draws(env.rng) == draws(np.random.default_rng(seed))


@pytest.mark.parametrize("seed", [-1, "x", 1.5])
def test_a_bad_seed_still_fails_at_reset(seed: Any) -> None:
    env = make("negotiation/simple-trade-v0")
    with pytest.raises((ValueError, TypeError)):
        env.reset(seed=seed)


def test_randomized_v1_draws_as_before() -> None:
    env = make("negotiation/simple-trade-v1", randomize=True)
    assert env.new_episode_draws
    assert not make("negotiation/simple-trade-v1").new_episode_draws
    env.reset(seed=9)
    other = make("negotiation/simple-trade-v1", randomize=True)
    other.rng = np.random.default_rng(9)
    other.reset()
    assert env.state() == other.state()


class Liar(Scenario):
    metadata: ClassVar[dict[str, Any]] = {
        "name": "test/liar-v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    new_episode_draws = False

    def __init__(self) -> None:
        super().__init__(["a"])

    def new_episode(self, rng: np.random.Generator) -> None:
        self.s = int(rng.integers(10))

    def acting(self) -> list[str]:
        return ["a"]

    def play(self, agent: str, action: str) -> str | None:
        self.finish()
        return None

    def system_prompt(self, agent: str) -> str:
        return "Say anything."


def test_a_scenario_that_draws_despite_its_flag_fails_loudly() -> None:
    with pytest.raises(TypeError, match=r"Liar.new_episode used rng.integers"):
        Liar().reset(seed=1)


def test_an_assigned_generator_is_kept_until_a_seed_replaces_it() -> None:
    env = make("negotiation/simple-trade-v0")
    mine = np.random.default_rng(1)
    env.rng = mine
    env.reset()
    assert env.rng is mine
    env.reset(seed=2)
    assert env.rng is not mine
    assert draws(env.rng) == draws(np.random.default_rng(2))


def test_the_episode_seed_is_the_resets_int_seed_taken_once() -> None:
    """What the imported games' SeedDraws start from: the int seed of the reset that began the
    episode, once; a reset without one (or with a seed SeedDraws does not take) has none."""
    from parley.scenarios.helpers import LazyRng

    owner = LazyRng()
    assert owner.episode_seed() is None
    owner.seed_rng(7)
    assert owner.episode_seed() == 7
    assert owner.episode_seed() is None  # (taken: the next reset without a seed has none)
    for odd in (2**64, np.random.SeedSequence(3), None):
        owner.seed_rng(odd)
        assert owner.episode_seed() is None
    owner.seed_rng(2**64 - 1)
    assert owner.episode_seed() == 2**64 - 1
