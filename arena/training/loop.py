"""The training loop behind ``parley train``: stages of sampling, updating and syncing.

A run trains one or more *policies* (models, by name) that play seats of one scenario.
It goes through *stages*; each stage says who plays each seat (a trained policy or any
agent spec such as ``scripted``), which policies learn, and when to stop. Per update::

    batch    <- AsyncSampler.batches()              # episodes through the runner + pool
    samples  <- samples_from_record(batch)          # the learners' decisions
    metrics  <- PolicyGradientTrainer.step(samples)  # (in a worker thread: sampling goes on)
    push the learners' weights to the pool           # InProcessSync, version += 1
    sampler.publish(version)                        # staleness budget grows

Outputs in ``out``: ``metrics.jsonl`` (one line per update, per-role keys), TensorBoard
events when ``tensorboard`` is installed, ``checkpoints/<policy>/`` in Hugging Face format
(``parley run --agents llm:OUT/checkpoints/<policy>`` loads them), ``learning_curve.png``
and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import yaml

from parley.arena.training.pg import PGConfig, PolicyGradientTrainer
from parley.arena.training.sampler import (
    AsyncSampler,
    ConstraintLog,
    RecordingClient,
    SamplerConfig,
    samples_from_record,
)
from parley.arena.training.sync import InProcessSync
from parley.protocols.errors import ConfigError, require

__all__ = [
    "AgentConfig",
    "StageConfig",
    "TrainConfig",
    "TrainResult",
    "load_train_config",
    "train",
    "run_training",
]


@dataclass
class AgentConfig:
    """How trained policies act (fields of :class:`~parley.agents.llm.LLMAgentConfig`)."""

    temperature: float = 1.0
    """Sampling temperature while training (the trainer divides logits by the same)."""
    max_tokens: int = 8
    """Most tokens per action."""
    max_prompt_tokens: int = 512
    """Prompt budget (oldest turns folded away)."""
    system_prompt: bool = True
    """Tell the model the scenario's ``system_prompt(seat)``; False sends the observation
    alone (shorter prompts for tiny models)."""


@dataclass
class StageConfig:
    """One stage of a run: who plays, who learns, when it ends."""

    name: str
    """Shown in logs and plots."""
    train: list[str]
    """Policies that learn in this stage (the others play frozen)."""
    agents: dict[str, str] = field(default_factory=dict)
    """Seat -> ``policy:NAME`` (a trained policy) or any agent spec (``scripted``, ...)."""
    kind: str = "rl"
    """``rl`` (policy gradient on the scenario) or ``reading`` (the generic reading warm
    start of :mod:`parley.arena.training.warmstart`: ``max_updates`` supervised steps on
    numbered-list lookups, no scenario, no reward)."""
    max_updates: int = 100
    """Stop after this many updates."""
    target: float | None = None
    """Stop early once the mean ``metric`` over the last ``window`` batches reaches it."""
    reading: dict[str, Any] = field(default_factory=dict)
    """``reading`` stages: keyword arguments of
    :func:`~parley.arena.training.warmstart.pretrain_reading` (``words``, ``min_items``,
    ``max_items``, ``max_words``, ``lr``, ``batch_size``)."""
    metric: str = "success"
    """Episode metric the stage watches (and the learning curve shows)."""
    window: int = 5
    """Batches averaged for the stopping rule."""


@dataclass
class TrainConfig:
    """A whole training run (``parley train --config train.yaml``)."""

    scenario: str
    """Registered scenario id."""
    stages: list[StageConfig]
    """Run in order; each starts from the weights the previous one left."""
    scenario_kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments of ``make(scenario, ...)``."""
    model: str = "tiny"
    """Initial weights of every policy: a Hugging Face model directory, or ``tiny`` to
    build parley's tiny random model (``parley model tiny``) into ``OUT/base``."""
    policies: list[str] = field(default_factory=lambda: ["default"])
    """Names of the trained policies (one per seat, or one shared)."""
    policy_seeds: dict[str, int] = field(default_factory=dict)
    """With ``model: tiny``: a different initialisation seed per policy (default: 0)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pg: PGConfig = field(default_factory=PGConfig)
    shaping: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-seat reward shaping (:class:`~parley.scenarios.shaping.ShapingConfig` fields;
    ``"*"`` for every seat). Empty: each decision gets its raw return-to-go."""
    max_batch_size: int = 256
    """Pool: most requests decoded in one batch."""
    out: str = "runs/train"
    """Output directory."""
    seed: int = 0
    """Seeds torch (initialisations) and, through the sampler, every episode."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        for stage in self.stages:
            if stage.kind not in ("rl", "reading"):
                raise ConfigError(f"stage {stage.name!r}: kind must be 'rl' or 'reading'")
            if stage.kind == "rl" and not stage.agents:
                raise ConfigError(f"stage {stage.name!r}: an rl stage needs agents (seat: spec)")
        if not self.stages:
            raise ConfigError("a training run needs at least one stage")
        for stage in self.stages:
            unknown = set(stage.train) - set(self.policies)
            if unknown:
                raise ConfigError(
                    f"stage {stage.name!r} trains {sorted(unknown)}, which are not in "
                    f"policies {self.policies}"
                )
            for seat, spec in stage.agents.items():
                if spec.startswith("policy:") and spec[7:] not in self.policies:
                    raise ConfigError(f"stage {stage.name!r}: seat {seat} plays unknown {spec}")


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    out: Path
    history: list[dict[str, Any]]
    checkpoints: dict[str, Path]
    wall_s: float
    stage_summaries: list[dict[str, Any]]


# ------------------------------------------------------------------------------ config


def load_train_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    data: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """A :class:`TrainConfig` from YAML (or ``data``) plus ``key.sub=value`` overrides.

    Override values are parsed as YAML (``pg.lr=3e-3``, ``sampler.staleness=1``,
    ``stages.0.max_updates=20``, ``out=runs/x``).
    """
    raw: dict[str, Any] = dict(copy.deepcopy(data)) if data is not None else {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text())
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: a training config is a YAML mapping")
        raw.update(loaded)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        _set_path(raw, key.split("."), yaml.safe_load(value))
    try:
        return msgspec.convert(raw, TrainConfig, strict=False)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:  # or a __post_init__ check
        raise ConfigError(f"bad training config: {exc}") from exc


def _set_path(node: Any, keys: list[str], value: Any) -> None:
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"override path {'.'.join(keys)}: no list item {key}")
            if last:
                node[int(key)] = value
            else:
                node = node[int(key)]
        else:
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})


# ------------------------------------------------------------------------------ models


@dataclass
class _Policy:
    name: str
    model: Any  # trained copy
    backend: Any  # the pool's copy, updated by weight sync


def _prepare_run(config: TrainConfig, out: Path) -> dict[str, Path]:
    """Create ``out``, save the config, return the initial weights' directory per policy
    (building tiny models if asked)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(_plain(dataclasses.asdict(config))))
    if config.model != "tiny":
        return dict.fromkeys(config.policies, Path(config.model))
    from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

    dirs: dict[str, Path] = {}
    built: dict[int, Path] = {}
    for name in config.policies:
        seed = config.policy_seeds.get(name, 0)
        if seed not in built:
            target = out / "base" / f"seed{seed}"
            if not (target / "config.json").exists():
                build_tiny_model(target, TinyModelConfig(seed=seed))
            built[seed] = target
        dirs[name] = built[seed]
    return dirs


async def _load_policies(config: TrainConfig, dirs: Mapping[str, Path]) -> dict[str, _Policy]:
    transformers: Any = require("transformers", "train")
    from parley.arena.inference.backends.tokenizer import load_tokenizer
    from parley.arena.inference.backends.transformers import TransformersBackend

    policies: dict[str, _Policy] = {}
    for name, path in dirs.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
        model.train()
        served = copy.deepcopy(model).eval()
        tokenizer = load_tokenizer(str(path))
        backend = TransformersBackend(served, tokenizer, max_batch_rows=config.max_batch_size)
        policies[name] = _Policy(name, model, backend)
    return policies


# ------------------------------------------------------------------------------ the loop


def _llm_factory(
    pool: Any, policy: str, tokenizer: Any, system_prompt: str, config: AgentConfig, log: Any
) -> Callable[[], Any]:
    from parley.agents.llm import LLMAgent, LLMAgentConfig

    agent_config = LLMAgentConfig(
        policy=policy,
        temperature=config.temperature,
        max_tokens=config.max_tokens,
        max_prompt_tokens=config.max_prompt_tokens,
        request_timeout=0.0,
    )
    client = RecordingClient(pool, log)

    def factory() -> Any:
        return LLMAgent(client, tokenizer, system_prompt=system_prompt, config=agent_config)

    return factory


def _system_prompts(config: TrainConfig) -> dict[str, str]:
    from parley.scenarios import make

    env = make(config.scenario, **config.scenario_kwargs)
    try:
        env.reset(seed=0)
        get = getattr(env, "system_prompt", None)
        return {seat: (str(get(seat)) if callable(get) else "") for seat in env.possible_agents}
    finally:
        env.close()


class _Logger:
    """metrics.jsonl (+ TensorBoard if installed), and every row logged (the history)."""

    def __init__(self, out: Path) -> None:
        self.history: list[dict[str, Any]] = []
        self.file = (out / "metrics.jsonl").open("a", encoding="utf-8")
        self.tb: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out / "tensorboard"))
        except ImportError:  # tensorboard is optional
            self.tb = None

    def log(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        self.file.write(json.dumps(row, sort_keys=True) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "update":
                    self.tb.add_scalar(key, value, row["update"])

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


async def run_training(config: TrainConfig) -> TrainResult:
    """Run every stage of ``config``; see the module docstring for what is written."""
    torch: Any = require("torch", "train")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from parley.arena.inference.pool import InferencePool, PoolConfig

    started = time.perf_counter()
    out = Path(config.out)
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)  # before any model is built: initialisations follow it
    dirs = await asyncio.to_thread(_prepare_run, config, out)
    policies = await _load_policies(config, dirs)
    tokenizer = next(iter(policies.values())).backend.tokenizer
    # One trainer over every policy; each stage sets which of them learn.
    trainer = PolicyGradientTrainer(
        {n: p.model for n, p in policies.items()}, tokenizer.hf, config.pg, trainable=[]
    )
    pool_config = PoolConfig(max_batch_size=config.max_batch_size, max_wait=0.002)
    pool = await InferencePool({n: p.backend for n, p in policies.items()}, pool_config).start()
    system = _system_prompts(config) if config.agent.system_prompt else {}
    logger = _Logger(out)
    run = _Run(config, started, policies, tokenizer, trainer, InProcessSync(pool), system, logger)
    console = Console(stderr=True)
    total = sum(s.max_updates for s in config.stages)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[metric]}"),
    )
    try:
        with Progress(*columns, console=console, disable=not config.progress) as progress:
            run.progress, run.bar = progress, progress.add_task("train", total=total, metric="")
            # Stages run in order, each from the weights the previous one left.
            for stage in config.stages:
                await (run.reading_stage if stage.kind == "reading" else run.rl_stage)(stage)
        checkpoints = await asyncio.to_thread(_save_checkpoints, policies, tokenizer, out)
    finally:
        logger.close()
        await pool.close()
    wall = time.perf_counter() - started
    await asyncio.to_thread(_write_summary, out, wall, logger.history, run.summaries)
    return TrainResult(out, logger.history, checkpoints, wall, run.summaries)


@dataclass
class _Run:
    """What a run's stages share, and the steps of a stage, in the order they happen."""

    config: TrainConfig
    started: float  # perf_counter at the run's start: the rows' wall_s
    policies: dict[str, _Policy]
    tokenizer: Any
    trainer: PolicyGradientTrainer
    sync: InProcessSync  # pushes weights to the inference pool (sync.pool)
    system: dict[str, str]  # seat -> system prompt
    logger: _Logger
    progress: Any = None
    bar: Any = None
    log: ConstraintLog = field(default_factory=ConstraintLog)  # read back into samples
    summaries: list[dict[str, Any]] = field(default_factory=list)  # one per finished stage
    episodes_done: int = 0  # over the whole run

    async def reading_stage(self, stage: StageConfig) -> None:
        """The reading warm start of each learner, then one row per step of the mean curve."""
        from parley.arena.training.warmstart import pretrain_reading

        stage_start = time.perf_counter()
        curves = []
        for name in stage.train:
            policy = self.policies[name]
            model, tok, kwargs = policy.model, policy.backend.tokenizer, stage.reading
            curve = await asyncio.to_thread(
                pretrain_reading, model, tok, steps=stage.max_updates, target=stage.target, **kwargs
            )
            policy.model.train()
            curves.append(curve)
            # Supervised steps change the weights too: a new version for the pool.
            self.trainer.version += 1
            await self.sync.push(name, self.trainer.version, self.trainer.state_tensors(name))
        longest = max(len(c) for c in curves)  # one that hit the target holds its last value
        reading = [float(np.mean([c[min(i, len(c) - 1)] for c in curves])) for i in range(longest)]
        self.progress.update(self.bar, advance=stage.max_updates, description=stage.name)
        for i, accuracy in enumerate(reading):
            row = {
                "update": len(self.logger.history) + 1,
                "stage": stage.name,
                "stage_update": i + 1,
                "reading_accuracy": accuracy,
                "wall_s": round(time.perf_counter() - self.started, 3),
            }
            self.logger.log(row)
        self._finish_stage(stage, reading, stage_start, 0, 0)

    async def rl_stage(self, stage: StageConfig) -> None:
        """Sample a batch, update the learners on it, push their weights; until a stop."""
        runner, sampler, learners = self._start_stage(stage)
        curve: list[float] = []  # the watched metric per batch; its length counts updates
        stage_start = time.perf_counter()
        async with runner.open():
            async for batch in sampler.batches(limit=stage.max_updates):
                samples, value = self._read_batch(batch, learners, stage.metric)
                metrics = await self._update(stage, samples)
                curve.append(value)
                # Publishing the stage's update count lets the sampler start more episodes.
                sampler.publish(len(curve))
                self.episodes_done += len(batch.records)
                self._log_update(stage, batch, len(samples), metrics, curve)
                recent = curve[-stage.window :]
                metric = f"{stage.metric} {np.mean(recent):.3f}"
                self.progress.update(self.bar, advance=1, description=stage.name, metric=metric)
                # Stop early once a full window of batches reaches the target.
                full = len(recent) == stage.window
                if stage.target is not None and full and float(np.mean(recent)) >= stage.target:
                    break
        # A stage that stopped early still fills its share of the bar.
        done = sum(s.max_updates for s in self.config.stages[: len(self.summaries) + 1])
        self.progress.update(self.bar, completed=done)
        episodes = len(curve) * self.config.sampler.batch_size
        self._finish_stage(stage, curve, stage_start, episodes, len(sampler.failures))

    def _start_stage(self, stage: StageConfig) -> tuple[Any, AsyncSampler, set[str]]:
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
            else:
                specs[seat] = spec
        run_config = RunConfig(
            scenario=self.config.scenario,
            scenario_kwargs=dict(self.config.scenario_kwargs),
            agents=specs,
            concurrency=self.config.sampler.concurrency,
            progress=False,
            act_timeout=600.0,
        )
        runner = Runner(run_config, agents=agents)
        # Each stage samples its own episode seeds (offset by the stage's index).
        sampler_config = dataclasses.replace(
            self.config.sampler, seed=self.config.sampler.seed + 1000 * len(self.summaries)
        )
        # Its staleness budget (S + version + 1) * batch_size counts from the stage's start.
        sampler = AsyncSampler(runner, sampler_config)
        return runner, sampler, learners

    def _read_batch(self, batch: Any, learners: set[str], metric: str) -> tuple[list[Any], float]:
        """The learners' decisions (frozen seats only play); the batch's mean ``metric``."""
        samples = [
            s
            for record in batch.records
            for s in samples_from_record(record, log=self.log, shaping=self.config.shaping)
            if s.key.role in learners
        ]
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
        self, stage: StageConfig, batch: Any, samples: int, metrics: Any, curve: list[float]
    ) -> None:
        # How many updates old the weights each episode started on were.
        stale = [len(curve) - 1 - v for v in batch.started_versions]
        row = {
            "update": len(self.logger.history) + 1,
            "stage": stage.name,
            "stage_update": len(curve),
            stage.metric: curve[-1],
            "episodes": self.episodes_done,
            "failed": len(batch.failures),
            "samples": samples,
            "stale_mean": float(np.mean(stale)) if batch.started_versions else 0.0,
            "wall_s": round(time.perf_counter() - self.started, 3),
            **metrics,
        }
        self.logger.log(row)

    def _finish_stage(
        self, stage: StageConfig, curve: list[float], stage_start: float, episodes: int, failed: int
    ) -> None:
        # summary.json and the plot; len(summaries) is also the next stage's index.
        summary = {
            "stage": stage.name,
            "kind": stage.kind,
            "updates": len(curve),
            "episodes": episodes,
            "wall_s": round(time.perf_counter() - stage_start, 2),
            "first": curve[0] if curve else None,
            "last": float(np.mean(curve[-stage.window :])) if curve else None,
            "failed_episodes": failed,
            "curve": curve,
        }
        self.summaries.append(summary)


def _write_summary(
    out: Path, wall: float, history: list[dict[str, Any]], summaries: list[dict[str, Any]]
) -> None:
    (out / "summary.json").write_text(
        json.dumps({"wall_s": wall, "stages": summaries}, indent=2, default=str)
    )
    _plot(history, summaries, out / "learning_curve.png")


def train(config: TrainConfig) -> TrainResult:
    """:func:`run_training` in a fresh event loop."""
    return asyncio.run(run_training(config))


def _save_checkpoints(
    policies: Mapping[str, _Policy], tokenizer: Any, out: Path
) -> dict[str, Path]:
    paths = {name: out / "checkpoints" / name for name in policies}
    for name, policy in policies.items():
        policy.model.save_pretrained(paths[name])
        tokenizer.hf.save_pretrained(paths[name])
    return paths


def _plot(
    history: Sequence[Mapping[str, Any]], summaries: Sequence[Mapping[str, Any]], path: Path
) -> None:
    """Learning curve: the watched metric per update, one colour per stage."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # matplotlib is in the train extra; without it, no plot
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    offset = 0
    for summary in summaries:
        curve = summary["curve"]
        xs = np.arange(offset + 1, offset + len(curve) + 1)
        ax.plot(xs, curve, label=f"{summary['stage']} ({summary['wall_s']:.0f} s)")
        offset += len(curve)
    ax.set_xlabel("update")
    ax.set_ylabel("success (training batch)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
