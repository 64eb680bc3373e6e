"""Small helpers of :mod:`parley.scenarios.base` (kept apart for its line budget)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Generic, TypeVar

import numpy as np

from parley.scenarios.charset import OUTSIDE_CHARSET

__all__ = [
    "LazyRng",
    "NoDraws",
    "SeedDraws",
    "TextMemo",
    "all_clean",
    "check_action",
    "json_default",
]

T = TypeVar("T")

_MASK, _GAMMA = (1 << 64) - 1, 0x9E3779B97F4A7C15  # splitmix64's word and increment


class NoDraws:
    """``new_episode``'s ``rng`` where the class says it draws nothing: any use is its bug."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __getattr__(self, name: str) -> Any:
        raise TypeError(
            f"{self.cls.__name__}.new_episode used rng.{name}, but the class sets "
            "new_episode_draws = False (use self.rng, or leave it True)"
        )


def all_clean(actions: Collection[Any], limit: int) -> bool:
    """Whether every action is printable ASCII and all of them together fit in ``limit``."""
    try:
        joined = "".join(actions)
    except TypeError:  # not all strings: the per-action check names the culprit
        return False
    return len(joined) <= limit and joined.isascii() and joined.isprintable()


def check_action(action: Any, limit: int) -> str | None:
    """Why ``action`` is not in an action space of ``limit`` characters (``None``: it is):
    ``not action_space.contains(action)`` (:data:`CHARSET` is fixed), at C speed."""
    if not isinstance(action, str):
        return f"action must be a string, got {type(action).__name__}"
    if len(action) > limit:
        return f"action is {len(action)} characters long; at most {limit}"
    if OUTSIDE_CHARSET.search(action) is None:
        return None
    bad = sorted(set(OUTSIDE_CHARSET.findall(action)))
    shown = "".join(bad[:10]).encode("ascii", "backslashreplace").decode("ascii")
    return f"action uses characters outside printable ASCII and newline: {shown!r}"


def json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"state holds a {type(value).__name__}, which has no JSON form")


_ABSENT: Any = object()


# A plain dict emptied when full rather than an LRU: a miss costs one lookup and one insert,
# an LRU's bookkeeping several times that, and most of a language model's moves never recur
# whole, while a scripted agent's few moves recur in every episode.
class TextMemo(Generic[T]):
    """``fn`` (a pure function of a text) remembered per text, forgotten all at once when
    ``cap`` texts are held. Results are shared between calls: callers only read them."""

    __slots__ = ("cap", "fn", "memo", "misses")

    def __init__(self, fn: Callable[[str], T], cap: int = 2048) -> None:
        self.fn, self.cap = fn, cap
        self.memo: dict[str, T] = {}
        self.misses = 0
        """Calls that ran ``fn`` (for tests and benchmarks)."""

    def __call__(self, text: str) -> T:
        memo = self.memo
        # One lookup (not ``in`` then ``[]``): a memo shared by threads (observing.py's
        # prompts, runner worker threads) may be emptied by another between two.
        result = memo.get(text, _ABSENT)
        if result is not _ABSENT:
            return result  # type: ignore[no-any-return]
        self.misses += 1
        result = self.fn(text)
        if len(memo) >= self.cap:
            memo.clear()
        memo[text] = result
        return result


# Lazy because a generator costs ~15-20 us to make, per scenario or agent and episode in a
# run, and many never draw.
class LazyRng:
    """An ``rng`` made on first use: :meth:`seed_rng` with a non-negative int only records
    the seed, and the generator made from it later draws the same stream as one made at once
    (nothing drew in between); other seeds (``None``: OS entropy, numpy's seed types, or
    numpy's error) make it at once."""

    # Plain attributes (class defaults): touching an instance's __dict__ would make its every
    # attribute load slower.
    _rng: np.random.Generator | None = None
    _seed: int | None = None
    _episode_seed: int | None = None

    @property
    def rng(self) -> np.random.Generator:
        """The generator: seeded by the last :meth:`seed_rng`; until then, OS entropy."""
        rng = self._rng
        if rng is None:
            rng = self._rng = np.random.default_rng(self._seed)
        return rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value

    def seed_rng(self, seed: Any) -> None:
        """Seed :attr:`rng` with ``seed`` (see the class docstring)."""
        if type(seed) is int and seed >= 0:
            self._rng, self._seed = None, seed
            self._episode_seed = seed if seed <= _MASK else None
        else:
            self._rng = np.random.default_rng(seed)
            self._episode_seed = None

    def episode_seed(self) -> int | None:
        """The int seed (within :class:`SeedDraws`' range) of the ``reset`` that started this
        episode, taken once (``reset`` seeds before ``new_episode``): None after a reset
        without such a seed, whose draws continue :attr:`rng`."""
        seed, self._episode_seed = self._episode_seed, None
        return seed


class SeedDraws:
    """Uniform draws in [0, 1) from an int seed: splitmix64 (Steele, Lea and Flood, 2014;
    Vigna's constants), started at its first output from ``seed``, so that neighbouring seeds
    start far apart. The ``k``-th draw is a function of (seed, k) alone, 53 bits each.

    Why not numpy's generator, as everything else in a scenario: seeding one (SeedSequence,
    PCG64) costs ~8 us, more than a whole kuhn_poker episode of the library, and every
    episode of ``parley run`` is a fresh env and seed; this costs under 1 us a seed or draw.
    Its outputs pass BigCrush; a test checks outcome frequencies against their
    probabilities (chi-square) over many seeds."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        if not 0 <= seed <= _MASK:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed}")
        self.state = self._mix((seed + _GAMMA) & _MASK)

    @staticmethod
    def _mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def random(self) -> float:
        """The next draw (the name and contract of ``np.random.Generator.random()``)."""
        self.state = z = (self.state + _GAMMA) & _MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK  # (_mix, inlined: ~0.1 us)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return ((z ^ (z >> 31)) >> 11) * 2.0**-53
