"""Population self-play: opponents drawn from frozen snapshots of the learner and fixed agents.

With ``population:`` in a training config (:class:`PopulationConfig`), a stage seat given
the spec ``population`` is played, episode by episode, by one *member* of the population:

- **snapshots** of the learner (``population.policy``) taken when the stage starts and then
  every ``every`` updates (fictitious self-play, as SPIRAL's FSP). With ``lora`` a snapshot
  is a PEFT adapter on the learner's base in the same pool (one more adapter, batched with
  the others); without it, a whole-model checkpoint served by a backend of its own. A
  snapshot is frozen: weight sync pushes the learner's name only, never a snapshot's.
- **fixed members** (``population.members``): any agent spec (``scripted``, ``llm:DIR``,
  ``module:Class``) or ``policy:NAME`` (a trained policy as it is now: the latest self).

The member of an episode is drawn when the seat's agent is reset, from the episode's agent
seed, by the rule ``population.rule`` (:func:`member_weights`):

- ``uniform``: every member alike;
- ``latest``: member ``i`` of ``n`` (fixed members first, then snapshots oldest to newest)
  weighs ``latest_decay ** (n - 1 - i)``;
- ``pfsp``: prioritised fictitious self-play (AlphaStar's ``f_hard``): ``(1 - p) **
  pfsp_power`` with ``p`` the learner's estimated win rate against the member,
  ``(score + 1) / (games + 2)`` (a win scores 1, a tie 0.5; an unplayed member 0.5). Only
  finished episodes count: an infrastructure failure is no loss.

Everything is written to ``OUT/population/``: one folder per snapshot and
``population.json`` (members, their paths, games and scores, the updates counted). A run
started again in the same ``out`` takes the population back from there (its snapshots
served again, their records kept), and counts updates on from where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parley.agents.base import Agent
from parley.protocols.errors import ConfigError

__all__ = [
    "POPULATION_SPEC",
    "Member",
    "Population",
    "PopulationConfig",
    "open_population",
]

POPULATION_SPEC = "population"
"""The stage seat spec of a seat played by the population."""
RULES = ("uniform", "latest", "pfsp")
"""The sampling rules (:func:`member_weights`)."""
_DRAW = 0x504F50  # mixed into the agent seed: the member draw is its own stream
FILE = "population.json"
_REMEMBERED = 100_000  # draws awaiting their episode's record, at most


@dataclass
class PopulationConfig:
    """Opponents sampled from a population (``population:`` in a training config)."""

    every: int = 10
    """Snapshot the learner when each stage starts and then every this many updates; 0:
    no snapshots (fixed members only)."""
    policy: str | None = None
    """The policy snapshotted; None: the first of ``policies``."""
    rule: str = "uniform"
    """How a member is drawn: ``uniform``, ``latest`` or ``pfsp`` (module docstring)."""
    latest_decay: float = 0.5
    """``latest``: each step back from the newest member multiplies its weight by this."""
    pfsp_power: float = 2.0
    """``pfsp``: the exponent of ``(1 - win rate)``; larger leans harder on the members
    the learner loses to."""
    members: list[str] = field(default_factory=list)
    """Fixed members: agent specs or ``policy:NAME`` (that policy as it is now)."""
    max_snapshots: int = 0
    """Draw among the latest this many snapshots only (0: all of them)."""

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ConfigError(f"population.rule {self.rule!r}: choose one of {list(RULES)}")
        if self.every < 0 or self.max_snapshots < 0:
            raise ConfigError("population.every and population.max_snapshots must be >= 0")
        if not 0 < self.latest_decay <= 1:
            raise ConfigError(f"population.latest_decay must be in (0, 1], got {self.latest_decay}")
        if not (math.isfinite(self.pfsp_power) and self.pfsp_power >= 0):
            raise ConfigError(f"population.pfsp_power must be >= 0, got {self.pfsp_power}")
        if self.every == 0 and not self.members:
            raise ConfigError(
                "population: with every: 0 (no snapshots) list some members, or snapshot "
                "the learner with every: K"
            )

    def check(self, policies: Sequence[str], uses: bool, ray: str | None) -> None:
        """The config's checks against the run's: ``policies``, whether a stage seat says
        ``population`` (``uses``) and ``ray``."""
        if self.policy is not None and self.policy not in policies:
            raise ConfigError(f"population.policy {self.policy!r} is not in {list(policies)}")
        named = [m[7:] for m in self.members if m.startswith("policy:")]
        if set(named) - set(policies):
            raise ConfigError(f"population.members name unknown policies {named}")
        if not uses:
            raise ConfigError(
                "population is set but no stage seat plays it: give a seat the spec "
                f"{POPULATION_SPEC!r}"
            )
        if ray is not None:
            raise ConfigError("population opponents play in this process: drop ray (--ray)")


def check_population(config: Any) -> None:
    """:class:`~parley.arena.training.config.TrainConfig`'s population checks."""
    uses = any(POPULATION_SPEC in stage.agents.values() for stage in config.stages)
    if config.population is None:
        if uses:
            raise ConfigError(
                f"a stage seat plays {POPULATION_SPEC!r} but the config has no population: "
                "add population: {every: K}"
            )
        return
    config.population.check(config.policies, uses, config.ray)


@dataclass
class Member:
    """One member of the population and the learner's record against it."""

    name: str
    """The pool's policy name of a snapshot, else the member's agent spec."""
    kind: str
    """``snapshot`` or ``agent``."""
    update: int | None = None
    """Snapshots: the learner's update count when it was taken."""
    path: str | None = None
    """Snapshots: the saved adapter or checkpoint directory."""
    games: int = 0
    """Finished episodes against it."""
    score: float = 0.0
    """The learner's wins plus half its ties in them."""

    @property
    def win_rate(self) -> float:
        """The learner's estimated win rate against it (Laplace: 0.5 before any game)."""
        return (self.score + 1.0) / (self.games + 2.0)


def member_weights(config: PopulationConfig, members: Sequence[Member]) -> np.ndarray:
    """Unnormalised draw weights of ``members`` (fixed ones first, then snapshots oldest to
    newest) under ``config.rule``; snapshots beyond the latest ``max_snapshots`` weigh 0."""
    n = len(members)
    if config.rule == "uniform":
        weights = np.ones(n)
    elif config.rule == "latest":
        weights = config.latest_decay ** np.arange(n - 1, -1, -1, dtype=float)
    else:  # pfsp
        rates = np.array([m.win_rate for m in members], dtype=float)
        weights = (1.0 - rates) ** config.pfsp_power
    if config.max_snapshots:
        snaps = [i for i, m in enumerate(members) if m.kind == "snapshot"]
        weights[snaps[: -config.max_snapshots]] = 0.0
    return weights


MemberFactory = Callable[[Member], Callable[[], Any]]
"""A member -> a factory of fresh agents playing it (supplied by the training loop)."""


class Population:
    """The members, their draws and records, and the snapshots' folder (``OUT/population``).

    Used from one event loop: :meth:`snapshot` awaits the saves, the rest is synchronous.
    """

    def __init__(self, config: PopulationConfig, folder: Path, policy: str) -> None:
        self.config = config
        self.folder = folder
        self.policy = policy
        self.serve: Callable[[str, Path], Awaitable[None]] | None = None
        """Serves a saved snapshot under a name in the pool (set by :func:`open_population`)."""
        self.tokenizer: Any = None
        self.members: list[Member] = [Member(spec, "agent") for spec in config.members]
        self.updates = 0
        """The learner's updates counted so far (over the run, and runs resumed)."""
        self._drawn: dict[tuple[str, int | None], Member] = {}  # (seat, agent seed) -> its member

    # ----------------------------------------------------------------- state on disk

    @classmethod
    def load(cls, config: PopulationConfig, folder: Path, policy: str) -> Population:
        """The population saved in ``folder`` (snapshots and records; fixed members as
        ``config`` lists them now), or a new one if there is none."""
        population = cls(config, folder, policy)
        path = folder / FILE
        if not path.exists():
            return population
        saved = json.loads(path.read_text())
        old = {m["name"]: Member(**m) for m in saved["members"]}
        fixed = [old.get(m.name, m) for m in population.members]
        snaps = [m for m in old.values() if m.kind == "snapshot"]
        population.members = fixed + snaps
        population.updates = int(saved["updates"])
        return population

    def save(self) -> None:
        """Write ``population.json`` (atomically: a crash leaves the previous one)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {"policy": self.policy, "updates": self.updates,
                "members": [asdict(m) for m in self.members]}  # fmt: skip
        tmp = self.folder / (FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.folder / FILE)

    @property
    def snapshots(self) -> list[Member]:
        return [m for m in self.members if m.kind == "snapshot"]

    # ----------------------------------------------------------------- growing

    def due(self, *, stage_start: bool = False) -> bool:
        """Whether a snapshot is due now: at a stage's start when none was taken at this
        update count, and after every ``every``-th update."""
        every = self.config.every
        if not every:
            return False
        if any(m.update == self.updates for m in self.snapshots):
            return False
        return stage_start or self.updates % every == 0

    def snapshot_name(self) -> str:
        return f"{self.policy}@{self.updates}"

    def add_snapshot(self, path: Path) -> Member:
        """Record the snapshot saved at ``path`` now; :meth:`save` is called."""
        member = Member(self.snapshot_name(), "snapshot", self.updates, str(path))
        self.members.append(member)
        self.save()
        return member

    async def stage_started(self, weights: Any) -> None:
        """A stage begins: snapshot ``weights`` (the learner's) unless one exists of them."""
        if self.due(stage_start=True):
            await self.take_snapshot(weights)

    async def updated(self, weights: Any) -> None:
        """The learner made one more update (``weights`` now): count it, snapshot if due."""
        self.updates += 1
        if self.due():
            await self.take_snapshot(weights)
        else:
            self.save()

    async def take_snapshot(self, weights: Any) -> Member:
        """Save the learner's ``weights`` into the population's folder and serve them
        under the snapshot's name; the member recorded."""
        if self.serve is None:
            raise RuntimeError("Population.serve is unset: open it with open_population")
        name = self.snapshot_name()
        path = self.folder / name
        await asyncio.to_thread(weights.save, path, self.tokenizer)
        await self.serve(name, path)
        return self.add_snapshot(path)

    # ----------------------------------------------------------------- drawing

    def probabilities(self) -> np.ndarray:
        """The draw probability of each member now."""
        if not self.members:
            raise ConfigError("the population has no members yet (no snapshot, no members)")
        weights = member_weights(self.config, self.members)
        total = float(weights.sum())
        if not total > 0:  # (pfsp_power > 0 and a learner that beats everyone: uniform)
            weights, total = np.ones(len(self.members)), float(len(self.members))
        return np.asarray(weights / total)

    def draw(self, seat: str, seed: int | None) -> Member:
        """The member that plays ``seat`` in the episode of agent seed ``seed`` (drawn from
        that seed; remembered for :meth:`observe`)."""
        rng = np.random.default_rng(None if seed is None else [seed, _DRAW])
        member = self.members[int(rng.choice(len(self.members), p=self.probabilities()))]
        if seed is not None:
            self._drawn[(seat, seed)] = member
            if len(self._drawn) > _REMEMBERED:  # episodes dropped unread (stale, failed)
                del self._drawn[next(iter(self._drawn))]
        return member

    def observe(self, records: Iterable[Any], learners: set[str]) -> None:
        """Score the learner seats against the member each finished episode drew."""
        changed = False
        for record in records:
            returns = {t.agent: t.reward for t in record.trajectories}
            seeds = record.transcript.get("agent_seeds", {})  # the seeds agents reset with
            for seat, reward in returns.items():
                member = self._drawn.pop((seat, seeds.get(seat)), None)
                mine = [returns[s] for s in learners if s in returns]
                if member is None or record.failed or not mine:
                    continue
                own = float(np.mean(mine))
                member.games += 1
                member.score += 1.0 if own > reward else 0.5 if own == reward else 0.0
                changed = True
        if changed:
            self.save()

    def factory(
        self, seat: str, scenario: str, llm: Callable[[str], Callable[[], Any]]
    ) -> Callable[[], Any]:
        """The agent factory of a ``population`` seat of ``scenario``: each agent plays the
        member drawn at its reset (snapshots and ``policy:NAME`` through ``llm(pool policy
        name)``; :func:`member_agents`)."""
        make = member_agents(scenario, seat, llm)
        made: dict[str, Callable[[], Any]] = {}

        def member_factory(member: Member) -> Callable[[], Any]:
            if member.name not in made:
                made[member.name] = make(member)
            return made[member.name]

        def new_agent() -> Any:
            return PopulationAgent(self, seat, member_factory)

        return new_agent


class PopulationAgent(Agent):
    """Plays one seat as the member drawn at :meth:`reset` (delegates everything to it)."""

    def __init__(
        self, population: Population, seat: str, make: Callable[[Member], Callable[[], Any]]
    ) -> None:
        self.population, self.seat, self.make = population, seat, make
        self.inner: Any = None
        self.member: Member | None = None

    def reset(self, seed: int | None = None) -> None:
        self.member = self.population.draw(self.seat, seed)
        self.inner = self.make(self.member)()
        self.inner.reset(seed)

    async def act(self, observation: Any) -> Any:
        if self.inner is None:
            self.reset(None)
        return await self.inner.act(observation)

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


async def open_population(config: Any, policies: Any, pool: Any, out: Path) -> Population | None:
    """The run's population (None without ``config.population``), taken back from
    ``out/population`` when a run left one there, its snapshots served by ``pool`` again:
    with LoRA each an adapter of the learner's base, else a whole model of its own."""
    if config.population is None:
        return None
    from parley.arena.training.models import load_backend

    pc: PopulationConfig = config.population
    policy = pc.policy or config.policies[0]
    population = Population.load(pc, out / "population", policy)
    bases = {name: base for name, base, _ in policies.adapters}

    async def serve(name: str, path: Path) -> None:
        if policy in bases:  # an adapter of the learner's base, in the same backend
            await pool.add_adapter(name, bases[policy], str(path))
        else:
            pool.add_policy(name, await asyncio.to_thread(load_backend, config, path))

    population.serve, population.tokenizer = serve, policies.tokenizer
    for member in population.snapshots:  # a resumed run serves them again
        await serve(member.name, Path(str(member.path)))
    return population


def member_agents(
    scenario: str, seat: str, llm: Callable[[str], Callable[[], Any]]
) -> MemberFactory:
    """Agent factories for the members of ``seat``: snapshots and ``policy:NAME`` through
    ``llm(pool policy name)``, any other spec resolved as ``parley run`` would."""
    from parley.arena.run.agent_specs import RemoteSeat, SeatContext, resolve_agent_spec
    from parley.scenarios import spec as scenario_spec

    baselines = scenario_spec(scenario).baselines
    baseline = str(baselines.get(seat, baselines.get("*", "")))

    def make(member: Member) -> Callable[[], Any]:
        if member.kind == "snapshot":
            return llm(member.name)
        if member.name.startswith("policy:"):
            return llm(member.name[7:])
        source = resolve_agent_spec(member.name, SeatContext(scenario, seat, baseline))
        if isinstance(source, RemoteSeat):
            raise ConfigError(f"population member {member.name!r}: remote agents cannot be members")
        return source

    return make
