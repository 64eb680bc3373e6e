"""Policy-gradient objectives as published, one small function each, picked from a dict.

Every objective maps one micro-batch of scored tokens to its share of the minibatch loss
(micro-batch losses add up to the minibatch loss, so gradient accumulation is exact)::

    logp (n, T)   log pi_theta of each generated token (0 on padding)
    old  (n, T)   log pi_old: the logprobs recorded when the token was generated
    valid (n, T)  1 on real tokens, 0 on padding
    adv  (n,)     the advantage of each sequence (the same for all its tokens)
    kl   (n, T)   the KL penalty per token, kl_coef * KL estimate (zeros without one)

    ratio_t = exp(logp_t - old_t)                                       # (n, T)
    clipped surrogate, per token: -min(ratio_t A, clip(ratio_t, 1 - eps_low, 1 + eps_high) A)

- ``grpo`` (Shao et al. 2024, DeepSeekMath eq. 3): clipped surrogate with a symmetric
  eps; per sequence the token mean ``1/|o_i| sum_t``, then the mean over sequences.
  Advantages ``(r - mean) / std`` per group.
- ``dapo`` (Yu et al. 2025, DAPO): token-level loss, ``sum over all tokens / total tokens``
  of the minibatch (long answers weigh per token, not per sequence), with clip-higher
  (``eps_low = 0.2``, ``eps_high = 0.28``). GRPO advantages. (DAPO's dynamic sampling and
  overlong shaping are not part of the loss and are not implemented here.)
- ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-like training"): clipped surrogate,
  no length normalisation: ``sum over tokens / (sequences * L)`` with ``L`` a constant (the
  generation budget); advantages without the std division, ``r - mean``.
- ``rloo`` (Ahmadian et al. 2024, "Back to basics"): REINFORCE on the whole sequence,
  ``-A sum_t logp_t`` with the leave-one-out baseline; samples of an older policy weighted
  by the truncated sequence ratio ``min(exp(sum_t logp - sum_t old), is_cap)`` (detached).
- ``reinforce``: the same sequence-level REINFORCE loss with moving-average baselines per
  group (by role: SPIRAL's role-conditioned baseline).

``ratio = 1`` at the first minibatch of on-policy data; several epochs or minibatches per
batch (``PGConfig.epochs``, ``minibatches``) or stale samples make it differ, and the clip
then bounds each token's update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["OBJECTIVES", "LossInputs", "LossSettings", "Objective", "clipped_tokens"]


@dataclass(frozen=True)
class LossSettings:
    """The hyper-parameters the objectives read (from ``PGConfig``)."""

    clip_low: float = 0.2
    """eps_low: the ratio is clipped at ``1 - clip_low`` (when A < 0)."""
    clip_high: float = 0.2
    """eps_high: the ratio is clipped at ``1 + clip_high`` (when A > 0)."""
    is_cap: float = 2.0
    """Truncation of the sequence importance weight of the REINFORCE objectives."""
    length_norm: int = 0
    """Dr. GRPO's constant L (tokens per sequence)."""


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, and the size of the minibatch it belongs to."""

    logp: Any  # (n, T) float tensor, with gradient
    old: Any  # (n, T)
    valid: Any  # (n, T)
    adv: Any  # (n,)
    kl: Any  # (n, T)
    sequences: int
    """Sequences in the whole minibatch (the mean's denominator)."""
    tokens: int
    """Real tokens in the whole minibatch (the token-level mean's denominator)."""


def _clipped_token_loss(x: LossInputs, low: float, high: float) -> Any:
    """-min(r A, clip(r, 1 - low, 1 + high) A) per token, plus the KL term: (n, T)."""
    ratio = (x.logp - x.old).exp()  # (n, T)
    adv = x.adv[:, None]  # (n, 1)
    unclipped = ratio * adv  # (n, T)
    # Where the clipped side is the smaller one its gradient is 0: that token stops moving.
    clipped = ratio.clamp(1 - low, 1 + high) * adv  # (n, T)
    return -unclipped.minimum(clipped) + x.kl


def grpo(x: LossInputs, s: LossSettings) -> Any:
    per_token = _clipped_token_loss(x, s.clip_low, s.clip_high) * x.valid  # (n, T)
    per_sequence = per_token.sum(1) / x.valid.sum(1).clamp(min=1)  # (n,) 1/|o_i| sum_t
    return per_sequence.sum() / x.sequences  # mean over the minibatch's sequences


def dapo(x: LossInputs, s: LossSettings) -> Any:
    per_token = _clipped_token_loss(x, s.clip_low, s.clip_high) * x.valid  # (n, T)
    return per_token.sum() / x.tokens  # mean over the minibatch's tokens


def dr_grpo(x: LossInputs, s: LossSettings) -> Any:
    per_token = _clipped_token_loss(x, s.clip_low, s.clip_high) * x.valid  # (n, T)
    return per_token.sum() / (x.sequences * s.length_norm)  # a constant, not |o_i|


def reinforce(x: LossInputs, s: LossSettings) -> Any:
    seq_logp = (x.logp * x.valid).sum(1)  # (n,)
    seq_old = (x.old * x.valid).sum(1)  # (n,)
    # Truncated importance weight: corrects samples of an older policy, never > is_cap.
    weight = (seq_logp.detach() - seq_old).exp().clamp(max=s.is_cap)  # (n,)
    per_sequence = -weight * x.adv * seq_logp + (x.kl * x.valid).sum(1)  # (n,)
    return per_sequence.sum() / x.sequences


@dataclass(frozen=True)
class Objective:
    """A published objective: its loss and the advantage estimator it comes with."""

    loss: Callable[[LossInputs, LossSettings], Any]
    estimator: str
    """Default advantage estimator (:data:`~parley.arena.training.advantages.ESTIMATORS`)."""
    clip_high: float | None = None
    """Default eps_high (None: the same as eps_low)."""
    clipped: bool = True
    """Whether the loss clips the token ratio (the REINFORCE ones do not)."""


OBJECTIVES: dict[str, Objective] = {
    "grpo": Objective(grpo, "grpo"),
    "dapo": Objective(dapo, "grpo", clip_high=0.28),
    "dr_grpo": Objective(dr_grpo, "dr_grpo"),
    "rloo": Objective(reinforce, "rloo", clipped=False),
    "reinforce": Objective(reinforce, "reinforce", clipped=False),
}
"""Objective name -> :class:`Objective`."""


def clipped_tokens(x: LossInputs, s: LossSettings) -> float:
    """How many real tokens have their clipped side active (their gradient is zero)."""
    ratio = (x.logp.detach() - x.old).exp()  # (n, T)
    adv = x.adv[:, None]  # (n, 1)
    active = ((adv > 0) & (ratio > 1 + s.clip_high)) | ((adv < 0) & (ratio < 1 - s.clip_low))
    return float((active * x.valid).sum())
