"""Advantage estimators for multi-agent policy gradient: GRPO, Dr. GRPO, RLOO, REINFORCE.

Every estimator maps the rewards of one batch of samples, and the group each sample
belongs to, to one advantage per sample (list in, list out, same order)::

    rewards (N,)  groups (N,)  ->  advantages (N,)

- ``grpo``: ``(r - mean_g) / (std_g + eps)`` within each group (Shao et al. 2024).
- ``dr_grpo``: ``r - mean_g`` — no division by the std, which up-weights groups that are
  almost solved or almost failed (Liu et al. 2025, "Understanding R1-Zero-like training").
- ``rloo``: ``r - mean of the *other* samples of the group`` (Ahmadian et al. 2024); a
  sample alone in its group gets 0.
- ``reinforce``: ``r - b_g`` with ``b_g`` a moving average of past rewards of group ``g``
  (decay 0.95), updated *after* the batch is scored, so a sample never baselines itself (a
  group seen for the first time: the mean of the others of its group in the batch, or the
  moving average of all rewards when it is alone). The last 4,096 groups are remembered.
  With grouping by role this is SPIRAL's role-conditioned baseline for self-play.

The group of a sample comes from a grouping function (:data:`GROUPINGS`) over the
batch's :class:`SampleKey` s: by prompt (samples of the same scenario seed and seat compete
with each other), by context (the same model input: GRPO's group), by context where it
repeats in the batch and by role where it does not, by role, or by (agent, turn) as in
AT-GRPO. Variants are small functions
picked from dicts (docs/contributing.md), not string flags tested inside one class.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "ESTIMATORS",
    "GROUPINGS",
    "BaselineState",
    "SampleKey",
    "compute_advantages",
]

EPS = 1e-6


@dataclass(frozen=True)
class SampleKey:
    """What a grouping function may look at: where one decision came from."""

    role: str
    """The seat (agent name) that made the decision."""
    turn: int = 0
    """The turn of the episode the decision was made on."""
    prompt: str = ""
    """Identifies the situation: scenario seed (plus seat) — episodes of the same seed
    start from the same state, so their returns are comparable."""
    context: tuple[int, ...] = ()
    """The exact model input of the decision (its prompt token ids): samples with the same
    context are the same question asked again, GRPO's group."""


@dataclass
class BaselineState:
    """Moving-average baselines that outlive one batch (for ``reinforce``)."""

    decay: float = 0.95
    """Weight of the old value in ``b <- decay * b + (1 - decay) * mean(batch rewards)``."""
    values: OrderedDict[Hashable, float] = field(default_factory=OrderedDict)
    """Current baseline per group (least recently seen first); a group seen for the first
    time starts at its batch mean."""
    max_groups: int = 4096
    """Groups remembered; the least recently seen are forgotten. Grouping by prompt or
    context makes a new group for almost every sample (measured without a bound: 128,000
    entries and 2.5 GB after 200 updates of 640 decisions with 512-token contexts)."""
    overall: float | None = None
    """Moving average of every reward: with it a group seen for the first time, alone in
    its batch, is not baselined by itself."""


Estimator = Callable[[np.ndarray, list[Hashable], BaselineState], np.ndarray]


def _group_index(groups: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """``groups`` as dense integer ids (N,) and the number of distinct groups G."""
    ids: dict[Hashable, int] = {}
    index = np.array([ids.setdefault(g, len(ids)) for g in groups], dtype=np.int64)
    return index, len(ids)


def _group_mean(rewards: np.ndarray, index: np.ndarray, n_groups: int) -> np.ndarray:
    sums = np.bincount(index, weights=rewards, minlength=n_groups)  # (G,)
    counts = np.bincount(index, minlength=n_groups)  # (G,)
    mean: np.ndarray = sums[index] / counts[index]  # (N,)
    return mean


def grpo(rewards: np.ndarray, groups: list[Hashable], state: BaselineState) -> np.ndarray:
    index, n = _group_index(groups)
    mean = _group_mean(rewards, index, n)  # (N,)
    var = _group_mean((rewards - mean) ** 2, index, n)  # (N,) population variance
    out: np.ndarray = (rewards - mean) / (np.sqrt(var) + EPS)
    return out


def dr_grpo(rewards: np.ndarray, groups: list[Hashable], state: BaselineState) -> np.ndarray:
    index, n = _group_index(groups)
    out: np.ndarray = rewards - _group_mean(rewards, index, n)
    return out


def rloo(rewards: np.ndarray, groups: list[Hashable], state: BaselineState) -> np.ndarray:
    index, n = _group_index(groups)
    sums = np.bincount(index, weights=rewards, minlength=n)[index]  # (N,)
    counts = np.bincount(index, minlength=n)[index]  # (N,)
    others = np.where(counts > 1, (sums - rewards) / np.maximum(counts - 1, 1), rewards)
    out: np.ndarray = rewards - others
    return out


def reinforce(rewards: np.ndarray, groups: list[Hashable], state: BaselineState) -> np.ndarray:
    index, n = _group_index(groups)
    mean = _group_mean(rewards, index, n)  # (N,)
    counts = np.bincount(index, minlength=n)[index]  # (N,) size of each sample's group
    # A group not seen before: the mean of the *other* samples of its group in the batch;
    # alone there, the moving average of every reward (the first batch: of the others').
    others = (mean * counts - rewards) / np.maximum(counts - 1, 1)  # (N,)
    size = len(rewards)
    if state.overall is not None:
        fallback = np.full(size, state.overall)
    else:
        fallback = (rewards.sum() - rewards) / (size - 1) if size > 1 else np.zeros(size)
    first = np.where(counts > 1, others, fallback)  # (N,)
    known = state.values
    baseline = np.array([known.get(g, b) for g, b in zip(groups, first, strict=True)])
    advantages: np.ndarray = rewards - baseline
    for g, m in dict(zip(groups, mean, strict=True)).items():  # update after scoring
        old = known.pop(g, m)
        known[g] = state.decay * old + (1.0 - state.decay) * m  # (now the most recent)
    while len(known) > state.max_groups:
        known.popitem(last=False)
    batch_mean = float(rewards.mean())
    old_overall = batch_mean if state.overall is None else state.overall
    state.overall = state.decay * old_overall + (1.0 - state.decay) * batch_mean
    return advantages


ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce": reinforce,
}
"""Estimator name -> function ``(rewards, groups, state) -> advantages``."""


def _context_or_role(keys: Sequence[SampleKey]) -> list[Hashable]:
    """A sample's context where another sample of the batch shares it, else its role: a
    seat whose inputs repeat (a speaker naming one of 8 targets) gets a baseline per
    input; one whose inputs never repeat (a listener) keeps its role's, where a group of
    one would have an advantage of 0 and learn nothing."""
    by_context = [(k.role, k.context) for k in keys]
    counts = Counter(by_context)
    return [g if counts[g] > 1 else k.role for g, k in zip(by_context, keys, strict=True)]


GROUPINGS: dict[str, Callable[[Sequence[SampleKey]], list[Hashable]]] = {
    "prompt": lambda keys: [(k.role, k.prompt) for k in keys],
    "context": lambda keys: [(k.role, k.context) for k in keys],
    "context_or_role": _context_or_role,
    "role": lambda keys: [k.role for k in keys],
    "agent_turn": lambda keys: [(k.role, k.turn) for k in keys],
    "batch": lambda keys: [""] * len(keys),
}
"""Grouping name -> the groups of a batch's samples: same prompt (scenario seed and seat),
same context (model input), same context where it repeats else same role, same role, same
(agent, turn), or the whole batch as one group."""


def compute_advantages(
    rewards: Sequence[float],
    keys: Sequence[SampleKey],
    *,
    estimator: str = "grpo",
    grouping: str = "role",
    state: BaselineState | None = None,
) -> np.ndarray:
    """Advantages (N,) of ``rewards`` (N,) grouped by ``grouping`` over ``keys`` (N,).

    ``state`` carries ``reinforce``'s moving averages from batch to batch (pass the same
    object every call); the other estimators ignore it.
    """
    if estimator not in ESTIMATORS:
        raise KeyError(f"unknown estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}")
    if grouping not in GROUPINGS:
        raise KeyError(f"unknown grouping {grouping!r}; choose one of {sorted(GROUPINGS)}")
    if len(rewards) != len(keys):
        raise ValueError(f"{len(rewards)} rewards but {len(keys)} keys")
    r = np.asarray(rewards, dtype=np.float64)  # (N,)
    if r.size == 0:
        return r
    groups = GROUPINGS[grouping](keys)
    return ESTIMATORS[estimator](r, groups, state if state is not None else BaselineState())
