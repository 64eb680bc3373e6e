"""What the policy-gradient trainer is given: :class:`Sample` (one decision) and
:class:`PGConfig` (its settings). Both are re-exported by :mod:`parley.arena.training.pg`,
whose docstring says why each setting is what it is."""

from __future__ import annotations

from dataclasses import dataclass

from parley.arena.training.advantages import ESTIMATORS, GROUPINGS, SampleKey
from parley.arena.training.objectives import OBJECTIVES, LossSettings
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Constraint

__all__ = ["PGConfig", "Sample"]


@dataclass
class Sample:
    """One decision of one agent, as the trainer consumes it."""

    policy: str
    """Which trained model produced it (a pool policy name)."""
    prompt_ids: list[int]
    """The prompt exactly as the backend saw it."""
    token_ids: list[int]
    """The generated tokens (end-of-sequence included when the model produced it)."""
    logprobs: list[float]
    """The backend's logprob of each generated token under the distribution sampled from."""
    policy_version: int
    """Version of the weights that generated it."""
    reward: float
    """The (shaped) return credited to this decision."""
    key: SampleKey
    """Role, turn and situation, for grouping."""
    constraint: Constraint | None = None
    """The constraint the backend decoded under (rebuilds the legal-token masks)."""
    advantage: float = 0.0
    """Filled in by :meth:`PolicyGradientTrainer.step`."""


@dataclass
class PGConfig:
    """Policy-gradient hyper-parameters. Validated at construction."""

    objective: str = "grpo"
    """The loss, as published: ``grpo``, ``dapo``, ``dr_grpo``, ``rloo``, ``reinforce``
    (:data:`~parley.arena.training.objectives.OBJECTIVES`)."""
    estimator: str | None = None
    """Advantage estimator (:data:`~parley.arena.training.advantages.ESTIMATORS`); None:
    the objective's own (grpo and dapo: ``grpo``; dr_grpo: ``dr_grpo``; rloo: ``rloo``;
    reinforce: ``reinforce``)."""
    grouping: str = "role"
    """How samples are grouped for the baseline (:data:`~parley.arena.training.advantages.
    GROUPINGS`): ``prompt``, ``context``, ``context_or_role``, ``role``, ``agent_turn``,
    ``batch``."""
    baseline_decay: float = 0.95
    """Decay of the moving-average baselines of ``reinforce``."""
    clip_eps: float = 0.2
    """eps (eps_low): the clipped objectives clip the token ratio at ``1 - clip_eps``."""
    clip_eps_high: float | None = None
    """eps_high, the upper clip ``1 + clip_eps_high`` (None: ``clip_eps``; dapo: 0.28)."""
    epochs: int = 1
    """Passes over each batch (PPO-style; > 1 reuses samples, so ratios leave 1)."""
    minibatches: int = 1
    """Optimizer steps per epoch: the batch is shuffled and split into this many."""
    length_norm: int = 0
    """Dr. GRPO's constant L in ``sum over tokens / (sequences * L)``: the generation
    budget. ``parley train`` uses ``agent.max_tokens`` when 0."""
    lr: float = 1e-3
    """Adam learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    max_grad_norm: float = 1.0
    """Gradient clipping (global L2 norm, per policy)."""
    temperature: float = 1.0
    """Sampling temperature the agents used: logits are divided by it before the softmax."""
    is_cap: float = 2.0
    """rloo and reinforce: truncation of the sequence importance weights (TIS)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to a frozen copy of the initial policy (0: none, no copy)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus: minus this times the mean per-token entropy of the policy
    (over the tokens the constraint allowed) is added to the loss (0: none, and the
    ``entropy`` metric stays 0)."""
    micro_batch: int = 64
    """Most samples per forward/backward; gradients accumulate over a minibatch's
    micro-batches."""
    token_budget: int = 0
    """Most padded tokens (rows x the longest prompt + completion among them) per
    forward/backward (0: no limit but ``micro_batch``). Samples are packed by length; one
    sample longer than the budget goes alone (counted in the ``over_budget`` metric)."""
    replay: int = 0
    """Past samples kept in a replay buffer and mixed into each update (0: none)."""
    replay_fraction: float = 0.0
    """Fraction of each update's samples drawn from the replay buffer."""
    replay_max_age: int | None = None
    """Most versions a replayed sample's action may be behind the weights it trains; older
    ones leave the buffer (None: no limit; ``parley train`` uses the sampler's staleness S,
    so that no sample older than S is trained on, replayed or not)."""
    seed: int | None = None
    """Seeds the trainer's generator: minibatch order and replay draws (None: 0;
    ``parley train`` uses the run's ``seed``)."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"objective {self.objective!r}: choose one of {sorted(OBJECTIVES)} "
                "(pg.estimator picks only the advantage estimator)"
            )
        if self.estimator is not None and self.estimator not in ESTIMATORS:
            raise ConfigError(
                f"estimator {self.estimator!r}: the advantage estimator is one of "
                f"{sorted(ESTIMATORS)}; the loss is pg.objective, one of {sorted(OBJECTIVES)}"
            )
        if self.grouping not in GROUPINGS:
            raise ConfigError(f"grouping must be one of {sorted(GROUPINGS)}")
        if not 0 <= self.baseline_decay < 1:
            raise ConfigError("baseline_decay must be in [0, 1)")
        if self.lr <= 0 or self.temperature <= 0 or self.is_cap <= 0:
            raise ConfigError("lr, temperature and is_cap must be > 0")
        if not 0 < self.clip_eps < 1 or (
            self.clip_eps_high is not None and self.clip_eps_high <= 0
        ):
            raise ConfigError("clip_eps must be in (0, 1) and clip_eps_high > 0")
        if self.micro_batch < 1 or self.epochs < 1 or self.minibatches < 1:
            raise ConfigError("micro_batch, epochs and minibatches must be >= 1")
        if self.token_budget < 0:
            raise ConfigError("token_budget must be >= 0 (0: no token limit)")
        if self.length_norm < 0:
            raise ConfigError("length_norm must be >= 0")
        if self.entropy_coef < 0:
            raise ConfigError("entropy_coef must be >= 0")
        if self.kl_coef < 0 or self.replay < 0 or not 0 <= self.replay_fraction < 1:
            raise ConfigError("kl_coef >= 0, replay >= 0 and 0 <= replay_fraction < 1")
        if self.replay_max_age is not None and self.replay_max_age < 0:
            raise ConfigError("replay_max_age must be >= 0 (or None: no limit)")

    @property
    def advantage_estimator(self) -> str:
        """The estimator in use: ``estimator``, or the objective's own."""
        return self.estimator or OBJECTIVES[self.objective].estimator

    def loss_settings(self) -> LossSettings:
        objective = OBJECTIVES[self.objective]
        high = self.clip_eps_high
        if high is None:
            high = objective.clip_high if objective.clip_high is not None else self.clip_eps
        return LossSettings(
            clip_low=self.clip_eps,
            clip_high=high,
            is_cap=self.is_cap,
            length_norm=self.length_norm,
        )
