"""Training: asynchronous sampling, multi-agent policy-gradient trainers, weight sync, export.

Owns :mod:`~parley.arena.training.sampler` (``AsyncSampler``: rollouts through the runner,
a staleness bound on every sample, per-agent samples), :mod:`~parley.arena.training.advantages`
(GRPO-family estimators and groupings), :mod:`~parley.arena.training.objectives` (the
published losses: GRPO, DAPO, Dr. GRPO, RLOO, REINFORCE), :mod:`~parley.arena.training.pg`
(the policy-gradient update), :mod:`~parley.arena.training.scoring` (the legal-token masks
it scores under), :mod:`~parley.arena.training.adapters` (what is trained of a policy: a
whole model or a LoRA adapter on a shared base), :mod:`~parley.arena.training.precision`
(fp32/bf16/fp16 autocast), :mod:`~parley.arena.training.models` (which models the trainer
and the pool load), :mod:`~parley.arena.training.sync` (weights back to the pool,
in-process or over the bus), :mod:`~parley.arena.training.warmstart`,
:mod:`~parley.arena.training.config` (``TrainConfig``, ``RunSeeds``),
:mod:`~parley.arena.training.loop` (``run_training``), :mod:`~parley.arena.training.stage_plan`
(the order of stages and restarts, as a state machine), :mod:`~parley.arena.training.seats`
(the LLM agents of its seats), :mod:`~parley.arena.training.population` (opponents drawn
from snapshots and fixed members), :mod:`~parley.arena.training.outputs`
(metrics, checkpoints, summary), :mod:`~parley.arena.training.evaluate` (checkpoints in the
arena with the prompts they were trained on) and :mod:`~parley.arena.training.export`
(trajectories for outside trainers).

May import: ``parley.protocols``, ``parley.scenarios``, ``parley.agents``,
:mod:`parley.arena.run` and :mod:`parley.arena.inference`.
"""
