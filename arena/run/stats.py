"""Statistics the runner reports: mean with a 95% confidence interval, and τ-bench's pass^k.

Pure functions over plain numbers, so the summary of a run can be recomputed from its
``transcripts.jsonl`` alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "MeanCI",
    "Moments",
    "PassHatK",
    "mean_ci",
    "pass_hat_k_curve",
    "t975",
]

# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (no scipy dependency
# for one table); beyond 30, a Cornish-Fisher expansion (error below 1e-4).
_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z = 1.959963984540054


def t975(df: float) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (Welch's df may be
    fractional: interpolated in the table up to 30, Cornish-Fisher expansion above)."""
    if not math.isfinite(df) or df <= 0:
        return math.nan
    if df < 1:
        return _T_975[0]
    if df <= 30:
        lo = math.floor(df)
        hi = min(lo + 1, 30)
        return _T_975[lo - 1] + (df - lo) * (_T_975[hi - 1] - _T_975[lo - 1])
    z = _Z
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True)
class MeanCI:
    """A sample mean and the half-width of its 95% confidence interval."""

    mean: float
    """Sample mean (NaN when there are no values)."""
    ci95: float
    """Half-width of the 95% interval, Student's t; NaN with fewer than two values."""
    n: int
    """Number of values the mean is over."""

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-ready: NaN becomes ``None`` (JSON has no NaN)."""
        return {"mean": _finite(self.mean), "ci95": _finite(self.ci95), "n": self.n}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


_SCALE = 1074
"""Every finite double is a multiple of 2**-1074 (the smallest subnormal)."""

_PENDING = 64
"""Distinct values a :class:`Moments` counts before folding them (others fold at once)."""


class Moments:
    """Count, sum and sum of squares of a stream of numbers, held exactly.

    Every float is a multiple of 2**-1074, so both sums are kept as exact integers: the result
    does not depend on the order values were added in (concurrent episodes finish in any
    order) and equals what the whole list would give. Memory stays a few integers however
    many values are added (and a count of each of at most :data:`_PENDING` distinct finite
    values not folded in yet: the runner's values repeat, rewards and metrics alike, and a
    count costs a dict update where folding a value costs integer arithmetic on ~1,100-bit
    numbers; a count of equal values folds to the very sums they would have given).
    """

    __slots__ = ("_nonfinite", "_pending", "_squares", "_sum", "n")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.n = 0
        self._sum = 0  # sum of the values x 2**_SCALE: an exact integer
        self._squares = 0  # sum of the squares x 2**(2 * _SCALE)
        self._nonfinite = 0.0  # sum of the NaN and infinite values, which no integer holds
        self._pending: dict[float, int] = {}  # finite value -> times added, not folded yet
        for value in values:
            self.add(value)

    def add(self, value: float) -> None:
        """Count one more value."""
        self.n += 1
        pending = self._pending
        count = pending.get(value)
        if count is not None:
            pending[value] = count + 1
        elif len(pending) < _PENDING and math.isfinite(value):
            pending[value] = 1  # (0.0 and -0.0 are one key: both fold to nothing)
        else:
            self._fold(value, 1)

    def _fold(self, value: float, count: int) -> None:
        """Fold ``count`` values equal to ``value`` into the sums."""
        if math.isfinite(value):
            # value = num / 2**k with k <= _SCALE, so both shifts are exact (and fast ints).
            num, den = float(value).as_integer_ratio()
            shift = _SCALE - den.bit_length() + 1
            self._sum += count * (num << shift)
            self._squares += count * ((num * num) << (2 * shift))
        else:
            self._nonfinite += value  # (one at a time: never counted)

    def mean_ci(self) -> MeanCI:
        """Mean with a 95% t-interval half-width (sample variance, ``n - 1``).

        The mean is the correctly rounded sum divided by ``n`` (as ``math.fsum(values) /
        n``); the variance is computed exactly and rounded once. A NaN or infinite value
        makes the mean NaN or infinite and the interval NaN.
        """
        n = self.n
        if n == 0:
            return MeanCI(math.nan, math.nan, 0)
        for value, count in self._pending.items():
            self._fold(value, count)
        self._pending.clear()
        if self._nonfinite:
            return MeanCI(self._nonfinite, math.nan, n)
        mean = float(Fraction(self._sum, 1 << _SCALE)) / n
        if n == 1:
            return MeanCI(mean, math.nan, 1)
        spread = n * self._squares - self._sum * self._sum  # n (n-1) var x 2**(2 * _SCALE)
        try:
            var = float(Fraction(spread, n * (n - 1) << (2 * _SCALE)))
        except OverflowError:  # values near the float limit: their variance is not a float
            var = math.inf
        t = t975(n - 1)
        return MeanCI(mean, t * math.sqrt(var / n), n)


def mean_ci(values: Sequence[float]) -> MeanCI:
    """Mean of ``values`` with a 95% t-interval half-width (sample std, ``n - 1``)."""
    return Moments(values).mean_ci()


def pass_hat_k(successes: Sequence[int], trials: Sequence[int], k: int) -> float:
    """pass^k = mean over tasks of C(c, k) / C(n, k) (τ-bench, arXiv 2406.12045).

    ``successes[i]`` and ``trials[i]`` are task ``i``'s successful and valid trials. Tasks
    with fewer than ``k`` valid trials cannot say whether ``k`` trials would all succeed and
    are left out (infrastructure failures are never counted as failures); NaN when no task
    is left.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    terms = [
        math.comb(c, k) / math.comb(n, k) for c, n in zip(successes, trials, strict=True) if n >= k
    ]
    return math.fsum(terms) / len(terms) if terms else math.nan


def pass_hat_k_curve(per_task: Mapping[int, Sequence[float]], max_k: int) -> dict[int, float]:
    """pass^k for k = 1..``max_k`` from each task's list of 0/1 ``success`` values."""
    successes = [sum(1 for s in values if s >= 0.5) for values in per_task.values()]
    trials = [len(values) for values in per_task.values()]
    return {k: pass_hat_k(successes, trials, k) for k in range(1, max_k + 1)}


class PassHatK:
    """pass^k for k = 1..``max_k`` built one episode at a time, in any order.

    A task is folded into the running sums once all ``max_k`` of its trials are in (failed
    ones included), so only tasks with trials still playing are held: memory follows the
    episodes in flight, not the length of the run. Equals :func:`pass_hat_k_curve` over
    the same episodes.
    """

    def __init__(self, max_k: int) -> None:
        if max_k < 1:
            raise ValueError(f"max_k must be at least 1, got {max_k}")
        self.max_k = max_k
        self._open: dict[int, list[int]] = {}  # task -> [trials in, valid trials, successes]
        self._sums = [Fraction(0)] * max_k  # exact sum of C(c, k) / C(n, k) over tasks
        self._counts = [0] * max_k  # tasks with at least k valid trials
        self.tasks = 0
        """Tasks with at least one valid ``success`` value (folded or still open)."""

    def add(self, task: int, success: float | None) -> None:
        """One trial of ``task``: its ``success`` value, or ``None`` (failed, or no metric)."""
        state = self._open.setdefault(task, [0, 0, 0])
        state[0] += 1
        if success is not None:
            if state[1] == 0:
                self.tasks += 1
            state[1] += 1
            state[2] += success >= 0.5
        if state[0] >= self.max_k:
            self._fold(self._open.pop(task))

    def _fold(self, state: list[int]) -> None:
        _, n, c = state
        for k in range(1, min(n, self.max_k) + 1):
            self._sums[k - 1] += Fraction(math.comb(c, k) / math.comb(n, k))
            self._counts[k - 1] += 1

    def curve(self) -> dict[int, float]:
        """pass^k for k = 1..max_k (NaN where no task had k valid trials)."""
        sums, counts = list(self._sums), list(self._counts)
        for _, n, c in self._open.values():  # tasks whose trials did not all run
            for k in range(1, min(n, self.max_k) + 1):
                sums[k - 1] += Fraction(math.comb(c, k) / math.comb(n, k))
                counts[k - 1] += 1
        return {
            k: float(sums[k - 1]) / counts[k - 1] if counts[k - 1] else math.nan
            for k in range(1, self.max_k + 1)
        }
