"""The configuration of one arena run, as a typed dataclass loadable from YAML.

``parley run --config run.yaml`` reads a YAML mapping whose keys are the fields of
:class:`RunConfig`; options given on the command line override the file::

    scenario: negotiation/deal-or-no-deal-v0
    scenario_kwargs: {max_turns: 10}
    agents: [scripted, my_pkg.bots:Greedy]     # or {alice: scripted, bob: remote}
    episodes: 100
    trials: 1
    seed: 0
    concurrency: 16
    out: runs/dond
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from parley.protocols.bus.config import BusConfig
from parley.protocols.errors import ConfigError

__all__ = ["RunConfig", "load_run_config"]

MIN_PEER_TIMEOUT: float = BusConfig.heartbeat_interval
"""The bus's default heartbeat interval (``BusConfig.heartbeat_interval``): a ``peer_timeout`` must
exceed it, or a peer would be given up between two of its heartbeats."""


@dataclass
class RunConfig:
    """Everything that decides what a run plays; validated at construction."""

    scenario: str
    """Registered scenario id, ``family/name-vN``."""
    scenario_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to ``parley.scenarios.make``."""
    agents: list[str] | dict[str, str] | None = None
    """Agent spec per seat: a list in seat order, or a mapping seat -> spec; seats left out
    play their scripted baseline. Specs: ``scripted``, ``module:Class``, ``remote``,
    ``llm:PATH`` (see :mod:`parley.arena.run.agent_specs`)."""
    episodes: int = 10
    """Number of tasks (distinct episode seeds) to play."""
    trials: int = 1
    """Times each task is played; with more than one, pass^k is reported for k = 1..trials."""
    seed: int = 0
    """Run seed: every episode and agent seed is derived from it, so a run is reproducible."""
    concurrency: int = 8
    """Episodes played at the same time. The run's bus bounds follow from it: up to
    ``concurrency x seats`` requests may be pending and suspended in agents at once
    (:func:`parley.arena.run.runner.bus_config_for`); a peer that still refuses a request
    as ``overloaded`` gets it again after a backoff, within ``act_timeout``."""
    out: str | None = None
    """Directory for ``transcripts.jsonl``, ``trajectories.jsonl``, ``timings.jsonl`` and
    ``summary.json``; nothing is written when unset."""
    listen: str = ""
    """Address the arena binds (``tcp://127.0.0.1:5555``, ``ipc:///tmp/arena``); remote
    agents connect there. Empty: a private ``inproc://`` address."""
    act_timeout: float = 60.0
    """Seconds an agent has to answer one observation before its episode fails (retries
    of a request refused as ``overloaded`` included)."""
    join_timeout: float = 120.0
    """Seconds to wait for a remote agent to join its seat before an episode fails."""
    peer_timeout: float = 60.0
    """Seconds a bus peer whose connection is still open (a remote agent, an inference pool,
    a replica) may stay silent, busy or paused, before the arena counts it as gone
    (``BusConfig.peer_timeout`` of the arena's endpoint; ``--peer-timeout`` of ``parley
    serve`` and ``parley agent`` is the same grace on their side). A peer whose connection
    closed is gone within seconds whatever this is. More than :data:`MIN_PEER_TIMEOUT`."""
    max_steps: int = 10_000
    """Steps after which an episode that has not ended fails (a guard against a scenario
    that never terminates)."""
    local_agents_over_bus: bool = False
    """Serve in-process agents through the bus (an ``inproc://`` endpoint, like a remote
    agent) instead of calling them directly through the wire codec. Same transcripts,
    slower; for measuring or testing the bus path."""
    pipeline: bool = True
    """Send every acting agent's observation of a step before gathering the actions.
    False asks one agent at a time (only useful to measure what pipelining buys)."""
    batch_frames: bool = False
    """Ask remote agents in batched frames: one ``observations`` message carries what the
    arena has ready, across the episodes in flight, for the seats one agent process hosts,
    and one ``actions`` message comes back (``parley agent`` answers both kinds). The same
    actions, transcripts and failure reasons as one ``observation`` per request (the default,
    its frames unchanged), in fewer messages. In-process seats are not affected."""
    agent_options: dict[str, Any] = field(default_factory=dict)
    """Free-form options handed to agent-spec resolvers (e.g. the inference pool address
    for ``llm:`` agents)."""
    progress: bool = True
    """Show a progress bar while playing."""
    curve_key: str = ""
    """The arena's CURVE secret key file (``parley keys new arena``): its ``tcp://`` bind
    then encrypts and admits only the keys in ``seat_keys``."""
    seat_keys: dict[str, str] = field(default_factory=dict)
    """Remote seat -> its agent's public key file (or 40-character Z85 key); with
    ``curve_key`` every remote seat needs one, and its agent can act only for that seat."""
    insecure: bool = False
    """Allow ``listen`` on a non-loopback ``tcp://`` address without CURVE keys (plain text:
    anyone who reaches the port can take a free seat). Only on a network you trust."""
    ray: str | None = None
    """Play the episodes on Ray worker actors (:mod:`parley.arena.run.ray_runner`): a Ray
    address (``auto``, ``HOST:6379``, ``ray://HOST:10001``) or ``local`` (a local Ray started
    on demand); ``None`` plays on this host. Needs ``pip install 'parley[ray]'``."""
    ray_workers: int = 0
    """Ray worker actors (with ``ray``); 0 starts one per CPU of the cluster. Each plays
    about ``concurrency`` episodes at once."""
    max_failed_fraction: float = 0.0
    """Fraction of episodes (0..1) that may fail before ``parley run`` exits with status 1;
    the default 0 means any failed episode makes the run fail."""
    judge: str = ""
    """An ``llm:`` spec of a judge model (LLM-as-judge, :mod:`parley.arena.run.judge`): each
    finished episode gets the reward component ``judge`` from its verdict under
    ``judge_rubric``, asked through the same pool as the ``llm:`` seats. "" = no judge."""
    judge_rubric: str = ""
    """The judge's rubric: a YAML/JSON file ``{rubric: TEXT, verdicts: {good: 1, bad: 0}}``
    (or ``json_schema:`` with a number ``score``), a text file, or the rubric text itself."""
    judge_scope: str = "seat"
    """``seat``: a verdict per seat on its own messages; ``episode``: one verdict on every
    message, given to every seat."""
    judge_max_tokens: int = 1024
    """Judged text (quoted, in tokens) over this gets the rubric's lowest score."""
    reward_model: str = ""
    """A reward model directory (``parley train-rm``; TRL RewardTrainer's format): each
    finished episode gets the reward component ``rm``, its score of each seat's text
    (:mod:`parley.arena.run.model_rewards`), scored through the pool at
    ``agent_options["pool"]`` (served there under the directory's name: ``parley serve
    --reward-model DIR``) or loaded in this process. "" = none."""
    rm_weight: float = 1.0
    """The ``rm`` component is the reward model's score times this."""
    rm_scope: str = "seat"
    """``seat``: each seat's own text scored; ``episode``: every seat's moves scored once,
    given to every seat."""
    similarity: str = ""
    """The ``similarity`` reward component (:mod:`parley.scenarios.similarity`): ``chrf``,
    or a local model directory for embedding cosine; credited where a seat's ``infos`` carry
    a ``reference`` or, with ``similarity_key``, the scenario's oracle does. "" = none."""
    similarity_key: str = ""
    """Compare this key of a JSON action (e.g. ``answer``) with ``oracle(seat)[key]``."""

    def __post_init__(self) -> None:
        if not self.scenario:
            raise ConfigError("scenario is required: give an id such as family/name-v0")
        from parley.scenarios.registry import resolve_id

        # An id without -vN plays (and is recorded as) the game's latest version.
        self.scenario = resolve_id(self.scenario)
        for name in ("episodes", "trials", "concurrency", "max_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.max_failed_fraction <= 1.0:
            raise ConfigError(
                f"max_failed_fraction must be within 0..1, got {self.max_failed_fraction}"
            )
        for name in ("judge_scope", "rm_scope"):
            if getattr(self, name) not in ("seat", "episode"):
                raise ConfigError(f"{name} must be seat or episode, got {getattr(self, name)!r}")
        if not math.isfinite(self.rm_weight):
            raise ConfigError(f"rm_weight must be a finite number, got {self.rm_weight}")
        if self.judge and not self.judge_rubric:
            raise ConfigError(
                "a judge needs a rubric: give --judge-rubric FILE_OR_TEXT (or `judge_rubric:`)"
            )
        if self.judge_max_tokens < 1:
            raise ConfigError(f"judge_max_tokens must be at least 1, got {self.judge_max_tokens}")
        if self.ray_workers < 0:
            raise ConfigError(
                f"ray_workers must be 0 (one per CPU) or more, got {self.ray_workers}"
            )
        for name in ("act_timeout", "join_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive seconds, got {getattr(self, name)}")
        if not self.peer_timeout > MIN_PEER_TIMEOUT:  # `not >`: NaN is refused too
            raise ConfigError(
                f"peer_timeout must exceed the bus's heartbeat interval ({MIN_PEER_TIMEOUT:g} s), "
                f"got {self.peer_timeout}: give --peer-timeout (or `peer_timeout:`) at least "
                f"{2.5 * MIN_PEER_TIMEOUT:g} seconds"
            )

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def load_run_config(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> RunConfig:
    """A :class:`RunConfig` from a YAML file (optional) with ``overrides`` applied on top.

    ``None`` values in ``overrides`` mean "not given" and keep the file's value. Unknown
    keys and ill-typed values raise :class:`ConfigError` naming the key.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read run config {path}: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a YAML mapping of RunConfig fields")
        data.update(loaded or {})
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ConfigError(f"unknown run config keys {unknown}; known keys: {sorted(_FIELDS)}")
    if "scenario" not in data:
        raise ConfigError("no scenario given: pass SCENARIO or set `scenario:` in the config")
    try:
        return msgspec.convert(data, RunConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad run config: {exc}") from exc
