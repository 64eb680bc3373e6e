"""The training loop behind ``parley train``: stages of sampling, updating and syncing.

A run trains one or more *policies* (models, by name) that play seats of one scenario.
It goes through *stages*; each stage says who plays each seat (a trained policy or any
agent spec such as ``scripted``), which policies learn, and when to stop. Per update::

    batch    <- AsyncSampler.batches()              # no episode older than S versions
    samples  <- samples_from_record(batch)          # the learners' decisions
    metrics  <- PolicyGradientTrainer.step(samples)  # (in a worker thread: sampling goes on)
    push the learners' weights to the pool           # InProcessSync, version += 1
    sampler.publish(version)                        # samples age, more episodes may start

The configuration (:class:`~parley.arena.training.config.TrainConfig`) and the seeds
derived from its one ``seed`` (:class:`~parley.arena.training.config.RunSeeds`) live in
:mod:`parley.arena.training.config`; what a run writes, in
:mod:`parley.arena.training.outputs`.

Outputs in ``out``: ``metrics.jsonl`` (one line per update: the watched metric, per-role
rewards and advantages, the objective's ratio and clip statistics, and the staleness of
the batch: ``stale_max``, ``stale_mean``, ``stale_hist`` (episodes 0, 1, ... versions
old) and ``dropped_stale``), TensorBoard events when ``tensorboard`` is installed,
``checkpoints/<policy>/`` in Hugging Face format (``parley run --agents
llm:OUT/checkpoints/<policy>`` loads them) or, with ``lora``, as PEFT adapter directories
(``llm:BASE?adapter=OUT/checkpoints/<policy>``; ``OUT/adapters/<policy>`` holds each
adapter as it started), ``learning_curve.png``, ``config.yaml`` and ``summary.json`` (every
seed used; ``models``: LoRA or not, the trained parameters per policy, the precision and
the dtype the pool served in; per stage its curve, failed and dropped episodes and, with
``ray``, its ``ray`` figures: workers lost and replaced, episodes retried, per node; its
``target`` and whether it was ``reached``; ``short_of_target``: the stages whose last
attempt ended at ``max_updates`` below their target, which ``parley train`` reports in its
last line and exit status :data:`SHORT_OF_TARGET`). Which models the trainer and the pool
hold: :mod:`parley.arena.training.models`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from parley.arena.training.adapters import FullWeights
from parley.arena.training.config import (
    AgentConfig,
    RunSeeds,
    StageConfig,
    TrainConfig,
    load_train_config,
    plain,
)
from parley.arena.training.curriculum import Curriculum
from parley.arena.training.models import Policies, load_policies
from parley.arena.training.outputs import (
    SHORT_OF_TARGET,
    MetricsLogger,
    TrainResult,
    save_checkpoints,
    short_of_target,
    write_summary,
)
from parley.arena.training.pg import PolicyGradientTrainer
from parley.arena.training.population import POPULATION_SPEC, Population, open_population
from parley.arena.training.sampler import (
    AsyncSampler,
    Batch,
    ConstraintLog,
    SamplerError,
    samples_from_record,
)
from parley.arena.training.seats import llm_agent_config as llm_agent_config  # (re-exported)
from parley.arena.training.seats import llm_factory as _llm_factory
from parley.arena.training.seats import system_prompts as _system_prompts
from parley.arena.training.stage_plan import Done, Play, StagePlan
from parley.arena.training.sync import InProcessSync
from parley.protocols.errors import ConfigError, require

__all__ = [
    "AgentConfig",
    "TrainConfig",
    "TrainResult",
    "load_train_config",
    "train",
    "run_training",
    "SHORT_OF_TARGET",
]

# ------------------------------------------------------------------------------ models


def _prepare_run(config: TrainConfig, seeds: RunSeeds, out: Path) -> dict[str, Path]:
    """Create ``out``, save the config, return the initial weights' directory per policy
    (building tiny models from ``seeds.init`` if asked)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(plain(dataclasses.asdict(config))))
    if config.model != "tiny":
        return dict.fromkeys(config.policies, Path(config.model))
    from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

    dirs: dict[str, Path] = {}
    built: dict[int, Path] = {}
    for name in config.policies:
        seed = seeds.init[name]
        if seed not in built:
            target = out / "base" / f"seed{seed}"
            if not (target / "config.json").exists():
                build_tiny_model(target, TinyModelConfig(seed=seed))
            built[seed] = target
        dirs[name] = built[seed]
    return dirs


# ------------------------------------------------------------------------------ the loop


async def run_training(config: TrainConfig, *, progress: Any = None) -> TrainResult:
    """Run every stage of ``config``; see the module docstring for what is written.

    ``progress``: a :class:`rich.progress.Progress` to show the bar in (the trainer's Ray
    actor passes a hidden one that its driver reads); by default one on stderr."""
    if config.ray is not None and config.ray_trainer_actor is not False:
        from parley.arena.training.ray_train import train_in_actor

        result = await train_in_actor(config)  # None: the trainer stays in this process
        if isinstance(result, TrainResult):
            return result
    torch: Any = require("torch", "train")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from parley.arena.inference.pool import InferencePool, PoolConfig

    started = time.perf_counter()
    out = Path(config.out)
    if config.threads:
        torch.set_num_threads(config.threads)
    seeds = RunSeeds.from_config(config)  # every seed the run uses, from config.seed
    torch.manual_seed(seeds.torch)  # before any model is loaded
    dirs = await asyncio.to_thread(_prepare_run, config, seeds, out)
    policies = await asyncio.to_thread(load_policies, config, seeds, dirs, out)
    tokenizer = policies.tokenizer
    # One trainer over every policy; each stage sets which of them learn. Dr. GRPO's
    # constant length is the generation budget unless the config names one.
    pg = dataclasses.replace(
        config.pg,
        seed=seeds.trainer,
        length_norm=config.pg.length_norm or config.agent.max_tokens,
        replay_max_age=(
            config.sampler.staleness
            if config.pg.replay_max_age is None
            else config.pg.replay_max_age
        ),
    )
    trainer = PolicyGradientTrainer(
        policies.weights, tokenizer.hf, pg, trainable=[], precision=config.precision
    )
    pool_config = PoolConfig(max_batch_size=config.max_batch_size, max_wait=0.002)
    pool: Any  # an InferencePool, or a RayPool's front (the same calls)
    if config.ray is not None and config.ray_pool_replicas:  # N replicas behind one front
        from parley.arena.training.ray_replicas import start_replica_pool

        pool = await start_replica_pool(config, dirs, policies, pool_config)
    else:
        pool = await InferencePool(policies.served, pool_config).start()
    system = _system_prompts(config) if config.agent.system_prompt else {}
    try:
        await policies.attach(pool)  # LoRA: each policy an adapter of its base's backend
    except BaseException:
        await pool.close()
        raise
    logger = MetricsLogger(out)
    sync = InProcessSync(pool)
    run = _Run(config, seeds, started, policies, tokenizer, trainer, sync, system, logger)
    run.curriculum = Curriculum(config.curriculum) if config.curriculum else None
    run.population = await open_population(config, policies, pool, out)
    console = Console(stderr=True)
    total = sum(s.max_updates for s in config.stages)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[metric]}"),
    )
    try:
        if progress is None:
            progress = Progress(*columns, console=console, disable=not config.progress)
        with progress:
            run.progress, run.bar = progress, progress.add_task("train", total=total, metric="")
            run.bar_total = total
            await run.stages()
        checkpoints = await asyncio.to_thread(save_checkpoints, trainer.weights, tokenizer, out)
    finally:
        logger.close()
        await pool.close()
    wall = time.perf_counter() - started
    history, summaries = logger.history, run.summaries
    models = {
        "lora": config.lora is not None,
        "trained_parameters": {n: w.trainable_numel() for n, w in trainer.weights.items()},
        "precision": config.precision,  # the trainer's autocast; weights stay float32
        "served_dtype": {name: backend.dtype for name, backend in policies.served.items()},
    }
    short = [s["stage"] for s in short_of_target(summaries)]
    await asyncio.to_thread(
        write_summary, out, wall, history, summaries, seeds.as_dict(), models, short
    )
    return TrainResult(out, history, checkpoints, wall, summaries, seeds.as_dict())


@dataclass
class _Run:
    """What a run's stages share, and the steps of a stage, in the order they happen."""

    config: TrainConfig
    seeds: RunSeeds
    started: float  # perf_counter at the run's start: the rows' wall_s
    policies: Policies
    tokenizer: Any
    trainer: PolicyGradientTrainer
    sync: InProcessSync  # pushes weights to the inference pool (sync.pool)
    system: dict[str, str]  # seat -> system prompt
    logger: MetricsLogger
    progress: Any = None
    bar: Any = None
    population: Population | None = None  # with config.population: the opponents' pool
    curriculum: Curriculum | None = None  # the run's level of the curriculum's option
    log: ConstraintLog = field(default_factory=ConstraintLog)  # read back into samples
    summaries: list[dict[str, Any]] = field(default_factory=list)  # one per finished stage
    episodes_done: int = 0  # over the whole run
    # time, tokens, batches, batched requests, completed requests
    pool_mark: tuple[float, int, int, int, int] = (0.0, 0, 0, 0, 0)
    bar_done: int = 0  # the bar's updates of the stage attempts finished so far
    bar_total: int = 0  # ... and of every stage, restarts included

    @functools.cached_property
    def shaping(self) -> dict[str, Any]:
        """The per-seat :class:`ShapingConfig` of ``config.shaping`` (read once)."""
        from parley.scenarios.shaping import load_shaping

        return load_shaping(self.config.shaping)

    async def stages(self) -> None:
        """The stages in the order :class:`~parley.arena.training.stage_plan.StagePlan`
        gives, each from the weights the previous one left. A restart restores every
        policy's weights as they were when its ``back_to`` stage began (kept in memory only
        for the stages a rule names) and re-runs the stages from there with new episodes."""
        stages = self.config.stages
        plan = StagePlan(stages)
        snapshots: dict[int, dict[str, list[Any]]] = {}
        step = plan.first()
        while not isinstance(step, Done):
            if isinstance(step, Play):
                stage = stages[step.index]
                if step.snapshot:
                    snapshots[step.index] = {
                        n: w.snapshot() for n, w in self.trainer.weights.items()
                    }
                if stage.kind == "reading":
                    await self.reading_stage(stage, step.index)
                    step = plan.played(restart=False)
                    continue
                stalled = await self.rl_stage(
                    stage, step.index, step.attempt, may_restart=step.may_restart
                )
                step = plan.played(restart=stalled)
                continue
            await asyncio.to_thread(self.trainer.restore, snapshots[step.back_to])
            fresh = await asyncio.to_thread(self._reinitialise, list(step.reinit), step.count)
            self.summaries[-1]["reinit"] = fresh  # policy -> its new initialisation seed
            self.trainer.version += 1  # the restored weights are a new version everywhere
            for name in self.trainer.weights:
                tensors = self.trainer.state_tensors(name)
                await self.sync.push(name, self.trainer.version, tensors)
            self.bar_total += sum(s.max_updates for s in stages[step.back_to : step.stage + 1])
            self.progress.update(self.bar, total=self.bar_total)
            step = plan.restarted()

    def _reinitialise(self, names: list[str], restart: int) -> dict[str, int]:
        """Fresh random weights for the policies ``names`` (``RestartConfig.reinit``); the
        seeds they were drawn with."""
        seeds = {name: self.seeds.reinit(self.config.policies.index(name), restart)
                 for name in names}  # fmt: skip
        for name, seed in seeds.items():
            weights = self.trainer.weights[name]
            if not isinstance(weights, FullWeights):
                raise ConfigError(f"restart.reinit: policy {name} is not a whole model")
            weights.reinitialise(seed)
        return seeds

    async def reading_stage(self, stage: StageConfig, index: int) -> None:
        """The reading warm start of each learner, then one row per step of the mean curve."""
        from parley.arena.training.warmstart import pretrain_reading

        stage_start = time.perf_counter()
        curves = []
        for name in stage.train:
            weights = self.policies.weights[name]
            # The stage's seed (RunSeeds.episodes) draws the exercises unless it names one.
            kwargs = {"seed": self.seeds.episodes[index], **stage.reading}

            def read(weights: Any = weights, kwargs: dict[str, Any] = kwargs) -> list[float]:
                with weights.selected() as model:  # an adapter: only it learns
                    curve: list[float] = pretrain_reading(
                        model,
                        self.tokenizer,
                        steps=stage.max_updates,
                        target=stage.target,
                        params=weights.parameters(),
                        **kwargs,
                    )
                    model.train()
                return curve

            curves.append(await asyncio.to_thread(read))
            # Supervised steps change the weights too: a new version for the pool.
            self.trainer.version += 1
            await self.sync.push(name, self.trainer.version, self.trainer.state_tensors(name))
        reached = None if stage.target is None else min(c[-1] for c in curves) >= stage.target
        longest = max(len(c) for c in curves)  # one that hit the target holds its last value
        reading = [float(np.mean([c[min(i, len(c) - 1)] for c in curves])) for i in range(longest)]
        self.bar_done += stage.max_updates
        self.progress.update(self.bar, completed=self.bar_done, description=stage.name)
        for i, accuracy in enumerate(reading):
            row = {
                "update": len(self.logger.history) + 1,
                "stage": stage.name,
                "stage_update": i + 1,
                "reading_accuracy": accuracy,
                "wall_s": round(time.perf_counter() - self.started, 3),
            }
            self.logger.log(row)
        self._finish_stage(stage, reading, stage_start, 0, 0, reached=reached)

    async def rl_stage(
        self, stage: StageConfig, index: int, attempt: int = 0, *, may_restart: bool = False
    ) -> bool:
        """Sample a batch, update the learners on it, push their weights; until a stop.
        True when the stage stalled and its ``restart`` rule asks for a start over."""
        seed = self.seeds.stage_episodes(index, attempt)
        if self.population is not None:  # FSP: the learner as the stage starts joins
            await self.population.stage_started(self.trainer.weights[self.population.policy])
        runner, sampler, learners = self._start_stage(stage, seed)
        rule = stage.restart if may_restart else None
        stalled = False
        reached = None if stage.target is None else False
        curve: list[float] = []  # the watched metric per batch; its length counts updates
        stage_start = time.perf_counter()
        async with runner.open():
            async for batch in sampler.batches(limit=stage.max_updates):
                samples, value = self._read_batch(batch, learners, stage.metric, sampler)
                self._follow_curriculum(batch, runner)
                metrics = await self._update(stage, samples)
                if self.population is not None and metrics:  # the update counts; a snapshot?
                    await self.population.updated(self.trainer.weights[self.population.policy])
                curve.append(value)
                # The pool serves the new version: samples age, more episodes may start.
                sampler.publish(self.trainer.version)
                self.episodes_done += len(batch.records)
                self._log_update(stage, batch, len(samples), metrics, curve, attempt)
                recent = curve[-stage.window :]
                metric = f"{stage.metric} {np.mean(recent):.3f}"
                self.progress.update(self.bar, advance=1, description=stage.name, metric=metric)
                # Stop early once a full window of batches reaches the target.
                full = len(recent) == stage.window
                if stage.target is not None and full and float(np.mean(recent)) >= stage.target:
                    reached = True
                    break
                # Or start over, when the rule says this attempt has stalled.
                if rule and full and len(curve) >= rule.after and np.mean(recent) < rule.below:
                    stalled = True
                    break
        # A stage that stopped early still fills its share of the bar.
        self.bar_done += stage.max_updates
        self.progress.update(self.bar, completed=self.bar_done)
        episodes = len(curve) * self.config.sampler.batch_size
        failed, dropped = sampler.failed, sampler.dropped_stale
        self._finish_stage(stage, curve, stage_start, episodes, failed, dropped, reached=reached)
        self.summaries[-1].update(
            attempt=attempt, seed=seed, stalled=stalled, dropped_groups=sampler.dropped_groups
        )
        if self.curriculum is not None:
            self.summaries[-1]["curriculum"] = self.curriculum.summary()
        figures = getattr(runner, "figures", None)  # on Ray: TrainRayRunner.figures
        if callable(figures):
            self.summaries[-1]["ray"] = figures()  # workers lost/replaced, episodes retried
        return stalled

    def _start_stage(self, stage: StageConfig, seed: int) -> tuple[Any, AsyncSampler, set[str]]:
        """Set the learners; build the stage's runner, its sampler and the learning seats."""
        from parley.arena.run.config import RunConfig
        from parley.arena.run.runner import Runner

        self.trainer.set_trainable(stage.train)
        agents: dict[str, Any] = {}
        specs: dict[str, str] = {}
        learners: set[str] = set()  # seats whose decisions are trained on
        for seat, spec in stage.agents.items():
            if spec.startswith("policy:"):
                name, prompt = spec[7:], self.system.get(seat, "")
                agents[seat] = _llm_factory(
                    self.sync.pool, name, self.tokenizer, prompt, self.config.agent, self.log
                )
                specs[seat] = f"llm:{name}"
                if name in stage.train:
                    learners.add(seat)
            elif spec == POPULATION_SPEC and self.population is not None:
                prompt, pool, agent = self.system.get(seat, ""), self.sync.pool, self.config.agent
                llm = functools.partial(
                    _llm_factory,
                    pool,
                    tokenizer=self.tokenizer,
                    system_prompt=prompt,
                    config=agent,
                    log=self.log,
                )
                agents[seat] = self.population.factory(seat, self.config.scenario, llm)
                specs[seat] = spec
            else:
                specs[seat] = spec
        run_config = RunConfig(
            scenario=self.config.scenario,
            scenario_kwargs=self._scenario_kwargs(),
            agents=specs,
            concurrency=self.config.sampler.concurrency,
            progress=False,
            act_timeout=600.0,
            reward_model=self.config.reward_model,
            rm_weight=self.config.rm_weight,
            rm_scope=self.config.rm_scope,
        )
        if self.config.ray is None:
            runner = Runner(run_config, agents=agents)
        else:  # parley train --ray: episodes on Ray workers, their LLM seats on this pool
            from parley.arena.training.ray_train import ray_stage_runner

            runner = ray_stage_runner(self, stage, run_config)
        # Each stage samples its own episode seeds (RunSeeds.stage_episodes: by the stage's
        # index, and a new set for each restart).
        sampler_config = dataclasses.replace(self.config.sampler, seed=seed)
        # A sample's age counts the learners' actions, in the pool's version numbering.
        version, learning = self.trainer.version, stage.train
        sampler = AsyncSampler(
            runner, sampler_config, version=version, policies=learning, seats=learners
        )
        return runner, sampler, learners

    def _scenario_kwargs(self) -> dict[str, Any]:
        """``make``'s arguments for the episodes starting now (the curriculum's level)."""
        base = dict(self.config.scenario_kwargs)
        return self.curriculum.scenario_kwargs(base) if self.curriculum else base

    def _follow_curriculum(self, batch: Batch, runner: Any) -> None:
        """Count the batch's episodes; after a raise, the episodes the runner starts from
        now on are made at the new level (it makes one scenario per episode)."""
        if self.curriculum and self.curriculum.observe(r.metrics for r in batch.records):
            kwargs = self._scenario_kwargs()
            runner.config = dataclasses.replace(runner.config, scenario_kwargs=kwargs)

    def _read_batch(
        self, batch: Batch, learners: set[str], metric: str, sampler: AsyncSampler
    ) -> tuple[list[Any], float]:
        """The learners' decisions (frozen seats only play); the batch's mean ``metric``.

        Checks the sampler's promise: no decision is more than S versions behind the
        weights it will update (a breach is a bug, never trained on)."""
        samples = [
            s
            for record in batch.records
            for s in samples_from_record(record, log=self.log, shaping=self.shaping)
            if s.key.role in learners
        ]
        limit, start = self.config.sampler.staleness, sampler.start_version
        age = [self.trainer.version - max(s.policy_version, start) for s in samples]
        if max(age, default=0) > limit:
            raise SamplerError(
                f"{sum(a > limit for a in age)} decisions are more than S={limit} versions "
                f"behind the trainer (v{self.trainer.version}, up to {max(age)} behind)"
            )
        if self.population is not None:
            self.population.observe(batch.records, learners)
        values = [r.metrics[metric] for r in batch.records if metric in r.metrics]
        return samples, float(np.mean(values)) if values else float("nan")

    async def _update(self, stage: StageConfig, samples: list[Any]) -> dict[str, Any]:
        """One policy-gradient step, in a thread (sampling goes on), then the weight push."""
        if not samples:  # nothing to learn from: no step, no new weights
            return {}
        metrics: dict[str, Any] = await asyncio.to_thread(self.trainer.step, samples)
        for name in stage.train:
            await self.sync.push(name, self.trainer.version, self.trainer.state_tensors(name))
        return metrics

    def _log_update(
        self,
        stage: StageConfig,
        batch: Batch,
        samples: int,
        metrics: Any,
        curve: list[float],
        attempt: int,
    ) -> None:
        # Each episode's age: versions between its oldest learner action and the trainer.
        stale = batch.staleness
        row = {
            "update": len(self.logger.history) + 1,
            "stage": stage.name,
            "stage_update": len(curve),
            "attempt": attempt,  # 0, then 1, 2, ... for each restart of the stage
            stage.metric: curve[-1],
            "episodes": self.episodes_done,
            "failed": len(batch.failures),
            "samples": samples,
            "constraint_lost": self.log.lost,  # decisions left out: their mask was forgotten
            "stale_mean": float(np.mean(stale)) if stale else 0.0,
            "stale_max": max(stale, default=0),
            "stale_hist": batch.staleness_histogram(),  # [episodes 0, 1, ... versions old]
            "dropped_stale": batch.dropped_stale,
            **({} if self.curriculum is None else self.curriculum.scenario_kwargs({})),
            "wall_s": round(time.perf_counter() - self.started, 3),
            **self._pool_figures(),
            **metrics,
        }
        self.logger.log(row)

    def _pool_figures(self) -> dict[str, float]:
        """The inference pool since the last row: tokens/s, mean batch size, requests, and
        each policy's weights version (what the live dashboard plots beside the curves)."""
        pool = self.sync.pool
        stats = pool.stats
        now = time.perf_counter()
        then, tokens, batches, batched, requests = self.pool_mark
        elapsed = now - (then or self.started)
        new_batches = stats.batches - batches
        new_batched = stats.batched_requests - batched
        self.pool_mark = (
            now,
            stats.generated_tokens,
            stats.batches,
            stats.batched_requests,
            stats.completed,
        )
        rate = (stats.generated_tokens - tokens) / elapsed if elapsed > 0 else 0.0
        mean_batch = new_batched / new_batches if new_batches else 0.0
        return {
            "pool_tokens_per_s": round(rate, 1),
            "pool_batch_mean": round(mean_batch, 2),
            "pool_requests": stats.completed - requests,
            **{f"version_{name}": version for name, version in pool.policies.items()},
        }

    def _finish_stage(
        self,
        stage: StageConfig,
        curve: list[float],
        stage_start: float,
        episodes: int,
        failed: int,
        dropped: int = 0,
        *,
        reached: bool | None = None,
    ) -> None:
        # summary.json and the plot: one per stage attempt.
        summary = {
            "stage": stage.name,
            "kind": stage.kind,
            "updates": len(curve),
            "episodes": episodes,
            "wall_s": round(time.perf_counter() - stage_start, 2),
            "first": curve[0] if curve else None,
            "last": float(np.mean(curve[-stage.window :])) if curve else None,
            "failed_episodes": failed,
            "dropped_stale": dropped,
            "target": stage.target,
            "reached": reached,  # None: no target
            "curve": curve,
        }
        self.summaries.append(summary)


def train(config: TrainConfig) -> TrainResult:
    """:func:`run_training` in a fresh event loop."""
    return asyncio.run(run_training(config))
