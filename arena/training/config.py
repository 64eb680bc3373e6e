"""The configuration of a training run (``parley train --config train.yaml``) and its seeds.

:class:`TrainConfig` is what a YAML file maps onto (:func:`load_train_config`, with
``key.sub=value`` overrides); :class:`RunSeeds` derives every seed a run uses from its one
``seed`` (see :meth:`RunSeeds.from_config`), and the run records them in ``summary.json``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from parley.arena.run.episode import derive_seed
from parley.arena.run.model_rewards import SCOPES
from parley.arena.training.adapters import LoraConfig
from parley.arena.training.curriculum import CurriculumConfig
from parley.arena.training.pg import PGConfig
from parley.arena.training.population import PopulationConfig, check_population
from parley.arena.training.precision import PRECISIONS
from parley.arena.training.sampler import SamplerConfig
from parley.protocols.errors import ConfigError

__all__ = [
    "AgentConfig",
    "RestartConfig",
    "RunSeeds",
    "StageConfig",
    "TrainConfig",
    "load_train_config",
]

_STAGE_EPISODES = 11  # derive_seed purpose tag: a stage's sampler seed
_STAGE_RESTART = 12  # ... and a restarted attempt's, from it
_REINIT = 13  # a policy's fresh initialisation at a restart


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
class RestartConfig:
    """When an RL stage that has stalled starts over (a local optimum it does not leave)."""

    after: int
    """Check from this many updates of an attempt on (each attempt counts its own)."""
    below: float
    """Start over when the mean ``metric`` of the last ``window`` batches is under this."""
    back_to: str | None = None
    """The stage to start over from: an earlier stage's name, or None for this one. Every
    policy goes back to the weights it had when that stage began (a copy kept in memory:
    every policy's trained tensors, only the adapters with LoRA), with fresh optimizer
    state, role baselines and episode seeds (``summary.json`` records each attempt's)."""
    max: int = 2
    """At most this many restarts by this rule over the run; then the stage runs on."""
    reinit: list[str] = field(default_factory=list)
    """Policies that start over from fresh random weights (a new seed per restart, in
    ``summary.json``) instead of those they had: the model class's own initialisation, for
    models trained from scratch (``model: tiny``); whole models only (no ``lora``). A
    policy restored to the same initial weights tends to fall into the same optimum. With
    ``pg.kl_coef`` > 0, its KL reference becomes the fresh weights (fixed when it next
    learns), not the policy that stalled."""


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
    restart: RestartConfig | None = None
    """Start over when the stage stalls (:class:`RestartConfig`); None: never."""


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
    """With ``model: tiny``: an initialisation seed per policy (default: the run's ``seed``,
    the same for every policy)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pg: PGConfig = field(default_factory=PGConfig)
    lora: LoraConfig | None = None
    """LoRA adapters (:class:`~parley.arena.training.adapters.LoraConfig`: ``r``, ``alpha``,
    ``dropout``, ``target_modules``, ``init_seed``): the policies that start from the same
    weights share one frozen base, in the trainer and in the pool, each with its own
    adapter and optimizer; weight sync ships only adapters; checkpoints are PEFT adapter
    directories. None (the default): every policy is a whole model, fully fine-tuned."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` or ``fp16``: the trainer's forward passes run under autocast in
    that dtype (weights and optimizer in float32) and the pool serves the policies in it
    (:mod:`~parley.arena.training.precision`; a ConfigError where the device cannot)."""
    device: str = "cpu"
    """Where the trainer and the pool put the models: ``cpu``, ``cuda``, ``cuda:1``, ... or
    ``auto`` (``cuda`` when torch sees a GPU, else ``cpu``)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (less memory,
    about one more forward pass of time per update)."""
    shaping: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-seat reward shaping (:class:`~parley.scenarios.shaping.ShapingConfig` fields;
    ``"*"`` for every seat). Empty: each decision gets its raw return-to-go."""
    reward_model: str = ""
    """A reward model directory (``parley train-rm``; TRL RewardTrainer's format): every
    episode gets the reward component ``rm`` as with ``parley run --reward-model``
    (:attr:`~parley.arena.run.config.RunConfig.reward_model`; loaded once in this process),
    credited at the episode's last step and weighed like any component by ``shaping``.
    "" = none."""
    rm_weight: float = 1.0
    """The ``rm`` component is the reward model's score times this."""
    rm_scope: str = "seat"
    """``seat``: each seat's own text scored; ``episode``: every seat's moves scored once,
    given to every seat."""
    max_batch_size: int = 256
    """Pool: most requests decoded in one batch."""
    out: str = "runs/train"
    """Output directory."""
    seed: int = 0
    """The run's seed: drives every other one (:class:`RunSeeds`): the tiny models'
    initialisation, every stage's episodes, torch and the trainer's generator. A seed set
    explicitly (``policy_seeds``, ``sampler.seed``, ``pg.seed``) takes precedence."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    progress: bool = True
    """Show a progress bar."""
    curriculum: CurriculumConfig | None = None
    """Raise a scenario option (``difficulty``) as the rolling success rises
    (:mod:`~parley.arena.training.curriculum`: ``option``, ``start``, ``step``, ``max``,
    ``raise_at``, ``window``, ``metric``); None: ``scenario_kwargs`` as given."""
    population: PopulationConfig | None = None
    """Opponents drawn from a population for the stage seats whose spec is ``population``
    (:class:`~parley.arena.training.population.PopulationConfig`: snapshots of the learner
    every ``every`` updates, fixed ``members``, a sampling ``rule``); None: no such seat."""
    ray: str | None = None
    """Play each RL stage's episodes on Ray worker actors
    (:mod:`~parley.arena.training.ray_train`; their LLM seats ask this process's pool over
    an authenticated tcp listener): a Ray address (``auto``, ``HOST:6379``) or ``local`` (a
    local Ray, started once when this process has none); ``None`` plays them here."""
    ray_workers: int = 0
    """Ray worker actors (with ``ray``); 0 starts one per CPU of the cluster."""
    ray_trainer_actor: bool | None = None
    """With ``ray``: run the trainer and its pool in a Ray actor of their own
    (:func:`~parley.arena.training.ray_train.train_in_actor`), given a GPU when ``device``
    asks for one (``auto``, ``cuda``) and the cluster has one; this process shows the
    progress bar and gets the outputs back. ``None`` (the default): an actor exactly when
    ``device`` asks for a GPU and the cluster has one (the driver is often a CPU head node);
    otherwise the trainer stays here, as an actor would only add its start-up."""

    ray_pool_replicas: int = 0
    """With ``ray``: serve the workers' LLM seats from this many inference pool replicas,
    Ray actors behind one front in the trainer's process
    (:mod:`~parley.arena.training.ray_replicas`; one GPU each when ``device`` asks for a
    GPU and the cluster has enough, else CPU actors claiming no CPU). Every weight push
    reaches every replica and bumps the version everywhere together; a replica that dies
    or misses an update is dropped and its requests go to the others. 0: the trainer's
    own pool serves them."""

    ray_pool_routing: str = "cache_aware"
    """With ``ray_pool_replicas``: how the front picks a replica
    (:mod:`~parley.arena.inference.routing`): ``cache_aware`` (an episode's later turns go
    to the replica holding its earlier ones unless that one is overloaded) or
    ``least_busy``."""

    def __post_init__(self) -> None:
        from parley.scenarios.registry import resolve_id

        # An id without -vN trains on (and records) the game's latest version.
        self.scenario = resolve_id(self.scenario)
        if self.rm_scope not in SCOPES:
            raise ConfigError(f"rm_scope must be one of {SCOPES}, got {self.rm_scope!r}")
        if not math.isfinite(self.rm_weight):
            raise ConfigError(f"rm_weight must be a finite number, got {self.rm_weight}")
        if self.reward_model and not Path(self.reward_model).is_dir():
            raise ConfigError(
                f"reward_model {self.reward_model!r} is not a directory: train one with "
                "`parley train-rm` and give its output directory"
            )
        pg = self.pg
        age = self.sampler.staleness if pg.replay_max_age is None else pg.replay_max_age
        if pg.replay and pg.replay_fraction and age == 0:
            raise ConfigError(
                "pg.replay with sampler.staleness 0 replays nothing: a replayed sample is at "
                "least one version old, and no sample older than pg.replay_max_age (default: "
                "the staleness S) is trained on. Set pg.replay_max_age (importance-weighted "
                "older samples) or sampler.staleness"
            )
        if self.curriculum is not None and self.ray is not None:
            raise ConfigError(
                "curriculum runs its episodes in this process: drop ray (or the curriculum "
                "and set scenario_kwargs per stage run)"
            )
        if self.ray_trainer_actor and self.ray is None:
            raise ConfigError("ray_trainer_actor needs ray (parley train --ray [ADDRESS])")
        if self.ray_pool_replicas < 0 or (self.ray_pool_replicas and self.ray is None):
            raise ConfigError(
                f"ray_pool_replicas must be 0 or more and needs ray (parley train --ray "
                f"--pool-replicas N), got {self.ray_pool_replicas} with ray={self.ray!r}"
            )
        from parley.arena.inference.routing import RoutingConfig

        RoutingConfig(policy=self.ray_pool_routing)  # (raises, naming the choices)
        if self.ray_workers < 0:
            raise ConfigError(
                f"ray_workers must be 0 (one per CPU) or more, got {self.ray_workers}"
            )
        for stage in self.stages:
            if stage.kind not in ("rl", "reading"):
                raise ConfigError(f"stage {stage.name!r}: kind must be 'rl' or 'reading'")
            if stage.kind == "rl" and not stage.agents:
                raise ConfigError(f"stage {stage.name!r}: an rl stage needs agents (seat: spec)")
        if not self.stages:
            raise ConfigError("a training run needs at least one stage")
        check_population(self)
        names = [stage.name for stage in self.stages]
        for i, stage in enumerate(self.stages):
            rule = stage.restart
            if rule is None:
                continue
            back = rule.back_to if rule.back_to is not None else stage.name
            if stage.kind != "rl" or back not in names[: i + 1]:
                raise ConfigError(
                    f"stage {stage.name!r}: restart needs an rl stage and back_to naming it "
                    f"or an earlier stage (one of {names[: i + 1]}), got {back!r}"
                )
            if rule.after < 1 or rule.max < 0:
                raise ConfigError(f"stage {stage.name!r}: restart needs after >= 1, max >= 0")
            unknown = set(rule.reinit) - set(self.policies)
            if unknown or (rule.reinit and self.lora is not None):
                raise ConfigError(
                    f"stage {stage.name!r}: restart.reinit names whole-model policies "
                    f"(of {self.policies}, without lora), got {rule.reinit}"
                )
        scored = self.agent.temperature if self.agent.temperature > 0 else 1.0
        if self.pg.temperature != scored:  # (greedy rows' logprobs are temperature 1's)
            raise ConfigError(
                f"pg.temperature is {self.pg.temperature} but the agents sample at "
                f"agent.temperature {self.agent.temperature}: set pg.temperature to {scored} "
                "(the trainer scores tokens at the temperature they were sampled at; a "
                "mismatch makes every importance ratio wrong, silently)"
            )
        try:
            from parley.scenarios.shaping import load_shaping

            load_shaping(self.shaping)  # (a bad key named now, not at the first batch)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"shaping: {exc}") from None
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}: choose one of {sorted(PRECISIONS)}")
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


@dataclass(frozen=True)
class RunSeeds:
    """Every seed a run uses, all derived from ``TrainConfig.seed`` unless set explicitly.

    - ``init``: per policy, the weight initialisation of ``model: tiny`` (``policy_seeds``
      or the run's seed; every policy starts from the same weights unless told otherwise,
      as they would from one checkpoint). Empty when ``model`` is a checkpoint.
    - ``episodes``: per stage, the sampler's seed (scenario and agent seeds of every
      episode, hence the agents' sampling seeds; a ``reading`` stage draws its exercises
      with it unless ``reading.seed`` is set): ``derive_seed(base, 11, stage)`` with
      ``base`` = ``sampler.seed`` if set, else the run's seed.
    - ``torch``: the global torch generator, seeded before any model is loaded.
    - ``backend``: the inference backend's draws for requests without a seed of their
      own (LLM agents seed each request from their episode's agent seed).
    - ``trainer``: the trainer's numpy generator (minibatch order, replay draws):
      ``pg.seed`` if set, else the run's seed.
    - ``lora``: per policy, its adapter's initialisation (``lora.init_seed`` or the run's
      seed, plus the policy's index in ``policies``). Empty without ``lora``.
    """

    run: int
    init: dict[str, int]
    episodes: list[int]
    torch: int
    backend: int
    trainer: int
    lora: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: TrainConfig) -> RunSeeds:
        base = config.sampler.seed if config.sampler.seed is not None else config.seed
        init = (
            {name: config.policy_seeds.get(name, config.seed) for name in config.policies}
            if config.model == "tiny"
            else {}
        )
        return cls(
            run=config.seed,
            init=init,
            episodes=[derive_seed(base, _STAGE_EPISODES, i) for i in range(len(config.stages))],
            torch=config.seed,
            backend=config.seed,
            trainer=config.pg.seed if config.pg.seed is not None else config.seed,
            lora=_lora_seeds(config),
        )

    def reinit(self, policy: int, restart: int) -> int:
        """The initialisation seed of policy number ``policy`` (its index in ``policies``)
        at the run's ``restart``-th restart (1, 2, ...; ``RestartConfig.reinit``)."""
        return derive_seed(self.run, _REINIT, policy, restart)

    def stage_episodes(self, index: int, attempt: int) -> int:
        """The sampler's seed of stage ``index``'s ``attempt`` (0: the first; a restart
        draws new episodes)."""
        first = self.episodes[index]
        return first if attempt == 0 else derive_seed(first, _STAGE_RESTART, attempt)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "init": dict(self.init),
            "episodes": list(self.episodes),
            "torch": self.torch,
            "backend": self.backend,
            "trainer": self.trainer,
            "lora": dict(self.lora),
        }


def _lora_seeds(config: TrainConfig) -> dict[str, int]:
    if config.lora is None:
        return {}
    first = config.lora.init_seed if config.lora.init_seed is not None else config.seed
    return {name: first + i for i, name in enumerate(config.policies)}


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


def plain(value: Any) -> Any:
    """``value`` with tuples as lists and keys as strings (for ``yaml.safe_dump``)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
