"""Statistics the runner reports: mean with a 95% confidence interval, and τ-bench's pass^k.

Pure functions over plain numbers, so the summary of a run can be recomputed from its
``transcripts.jsonl`` alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MeanCI", "mean_ci", "pass_hat_k", "pass_hat_k_curve"]

# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom; beyond 30 the
# normal quantile 1.96 is within 4% (no scipy dependency for one table).
_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


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


def mean_ci(values: Sequence[float]) -> MeanCI:
    """Mean of ``values`` with a 95% t-interval half-width (sample std, ``n - 1``)."""
    n = len(values)
    if n == 0:
        return MeanCI(math.nan, math.nan, 0)
    mean = math.fsum(values) / n
    if n == 1:
        return MeanCI(mean, math.nan, 1)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    t = _T_975[n - 2] if n - 1 <= len(_T_975) else 1.96
    return MeanCI(mean, t * math.sqrt(var / n), n)


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
