"""What one episode is: its plan (task, trial, seeds) and the log it fills as it is played.

:func:`derive_seed` and :func:`plan_episodes` decide every seed of a run (see
:mod:`parley.arena.run.runner`); :class:`EpisodeLog` accumulates one episode's transcript and
per-seat trajectories and turns them into an :class:`~parley.arena.run.records.EpisodeRecord`.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, overload

import numpy as np

from parley.arena.run.config import RunConfig
from parley.arena.run.records import EpisodeRecord, frozen_json
from parley.arena.run.seeds import WORD, derive_rows
from parley.protocols.messages import Action, Observation, TokenRecord, TurnRecord
from parley.protocols.messages import Trajectory as TrajectoryMsg

__all__ = ["EpisodePlan", "EpisodePlans", "EpisodeLog", "derive_seed", "plan_episodes"]


_SCENARIO, _AGENT = 0, 1  # purpose tags of derive_seed keys
_EMPTY: Mapping[str, Any] = {}


def derive_seed(*keys: int) -> int:
    """A 31-bit seed from integer keys, stable across platforms and numpy versions.

    Callers use keys of fixed length per purpose (``SeedSequence`` ignores trailing zeros,
    so ``(s, t)`` and ``(s, t, 0)`` would collide) and a leading purpose tag.
    """
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0] >> 1)


@dataclass(frozen=True)
class EpisodePlan:
    """One episode to play: which task, which trial, with which seeds."""

    index: int
    task: int
    trial: int
    seed: int
    agent_seeds: dict[str, int]

    @functools.cached_property  # read several times a step
    def episode_id(self) -> str:
        """Unique within a run and the same for the same plan (no clock, no randomness)."""
        return f"t{self.task:05d}-r{self.trial:02d}"


def plan_episodes(config: RunConfig, seats: Sequence[str]) -> EpisodePlans:
    """Every episode of the run, task-major (all trials of task 0, then task 1, ...), as a
    lazy :class:`EpisodePlans`: nothing is built before play."""
    return EpisodePlans(config, seats)


class EpisodePlans(Sequence[EpisodePlan]):
    """The episode plan of a run, built as it is read: a sequence of :class:`EpisodePlan`.

    Iterating derives seeds a table of :data:`_CHUNK` tasks at a time and keeps nothing, so
    memory is flat whatever ``episodes x trials`` (a list of plans took ~460 B an episode:
    2 GB and 100 s before the arena listened at 4M episodes). Indexing and slicing compute
    just the plans asked for; every plan equals the one iteration yields at its index.
    """

    def __init__(self, config: RunConfig, seats: Sequence[str]) -> None:
        self._config = config
        self._seats = tuple(seats)

    def __len__(self) -> int:
        return self._config.episodes * self._config.trials

    def __iter__(self) -> Iterator[EpisodePlan]:
        return self._plans(0, len(self))

    def slices(self, size: int) -> Iterator[list[EpisodePlan]]:
        """Consecutive lists of ``size`` plans (the last one shorter), built one at a time."""
        plans = iter(self)
        while piece := list(itertools.islice(plans, size)):
            yield piece

    @overload
    def __getitem__(self, index: int) -> EpisodePlan: ...
    @overload
    def __getitem__(self, index: slice) -> list[EpisodePlan]: ...
    def __getitem__(self, index: int | slice) -> EpisodePlan | list[EpisodePlan]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return list(self._plans(start, max(start, stop)))
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"plan index {index} out of range for {len(self)} episodes")
        return next(self._plans(position, position + 1))

    def _plans(self, start: int, stop: int) -> Iterator[EpisodePlan]:
        """Plans ``start`` to ``stop`` (exclusive), deriving the seeds of their tasks only."""
        trials, seats = self._config.trials, self._seats
        first, last = start // trials, -(-stop // trials)
        index = first * trials
        for task, trial, seed, seat_seeds in _seeds(self._config, len(seats), first, last):
            if start <= index < stop:
                yield EpisodePlan(
                    index=index,
                    task=task,
                    trial=trial,
                    seed=seed,
                    agent_seeds=dict(zip(seats, seat_seeds, strict=True)),
                )
            index += 1


_CHUNK = 1 << 12  # tasks whose seeds are derived together (bounds the key tables' memory)


def _seeds(
    config: RunConfig, n_seats: int, first_task: int = 0, stop_task: int | None = None
) -> Iterator[tuple[int, int, int, list[int]]]:
    """``(task, trial, scenario seed, seat seeds)`` of every episode of tasks ``first_task``
    to ``stop_task`` (default: the last), in plan order: what :func:`derive_seed` gives, a
    table at a time (:func:`derive_rows`) when every key is one 32-bit word (always, unless
    the run seed is 2**32 or more)."""
    run, trials = int(config.seed), config.trials
    tasks = config.episodes if stop_task is None else min(stop_task, config.episodes)
    if not 0 <= run < WORD:
        for task in range(first_task, tasks):
            seed = derive_seed(run, _SCENARIO, task)
            for trial in range(trials):
                yield (
                    task,
                    trial,
                    seed,
                    [derive_seed(run, _AGENT, task, trial, i) for i in range(n_seats)],
                )
        return
    for first in range(first_task, tasks, _CHUNK):
        block = np.arange(first, min(first + _CHUNK, tasks), dtype=np.uint64)
        head = np.broadcast_to(np.array([run, _SCENARIO], dtype=np.uint64), (len(block), 2))
        scenario = derive_rows(np.column_stack([head, block])).tolist()
        grid = np.indices((len(block), trials, n_seats)).astype(np.uint64).reshape(3, -1).T
        grid[:, 0] += np.uint64(first)
        head = np.broadcast_to(np.array([run, _AGENT], dtype=np.uint64), (len(grid), 2))
        agents = derive_rows(np.column_stack([head, grid])).reshape(len(block), trials, n_seats)
        for offset, (seed, per_trial) in enumerate(zip(scenario, agents.tolist(), strict=True)):
            for trial, seat_seeds in enumerate(per_trial):
                yield first + offset, trial, seed, seat_seeds


_Played = tuple[
    int,
    dict[str, str],
    dict[str, str],
    "dict[str, list[TokenRecord]] | None",
    "dict[str, str] | None",
    "dict[str, float] | None",
    Any,
    Any,
    Any,
    Any,
]
"""One step as :meth:`EpisodeLog.add_step` keeps it: turn, the texts each acting seat was
shown and said, their tokens (``None``: no action had any), the acting seats' invalid-move
reasons and the step's rewards that are not 0.0 (``None``: none), then rewards,
terminations, truncations, infos: the env's own mappings, copied where it may reuse them,
or, with ``EpisodeLog.frozen_steps``, as their JSON
(:func:`~parley.arena.run.records.frozen_json`)."""

_BUILDING = threading.Lock()
"""Held while a record's steps are built: a record read on the event loop while the writer
thread builds it (or the other way round) waits for that one build."""


FROZEN_AFTER = 16
"""Steps an episode keeps as objects, by default, before :attr:`EpisodeLog.frozen_steps`
keeps them as their JSON (those first steps included): a short episode's steps are written
soon, and encoding them costs more than keeping them (simple-trade-v1's 10 steps); a long
one's stay alive for longer, which costs more than encoding them (the bench's 50-step
broadcast). The runner freezes from the first step once its episodes are long."""

_EnvDicts = tuple[Any, Any, Any, Any]
"""A step's rewards, terminations, truncations and infos as kept (see :data:`_Played`)."""


def _kept(env_dicts: _EnvDicts, *, copy: bool, frozen: bool) -> _EnvDicts:
    """A step's rewards, terminations, truncations and infos to keep: with ``frozen``, each
    as its JSON (:func:`~parley.arena.run.records.frozen_json`); otherwise, and for a value
    JSON cannot hold (whose write then fails as it would have), copied with ``copy`` (an env
    that may change them in place later), else as they are."""
    kept = frozen_json(env_dicts) if frozen else [None] * 4
    if None in kept:
        rewards, terminations, truncations, infos = env_dicts
        if copy:
            rewards, terminations = dict(rewards), dict(terminations)
            truncations = dict(truncations)
            infos = {seat: dict(info) for seat, info in infos.items()}
        as_is = (rewards, terminations, truncations, infos)
        kept = [value if json is None else json for json, value in zip(kept, as_is, strict=True)]
    gains, ends, cuts, info = kept
    return gains, ends, cuts, info


class EpisodeLog:
    """Accumulates one episode's transcript and per-seat trajectories as it is played.

    The event loop pays for what a summary reads (returns, reward components, invalid
    moves) and keeps each step as it came; the transcript's steps and the trajectories'
    turns are built from those when its record is first read (:class:`_PlayedRecord`): by
    the records' writer thread as it encodes them, or by whoever reads ``record.transcript``
    or ``record.trajectories`` first (a judge, ``keep_records``, the training sampler), who
    gets exactly what a log building every step at once would give.
    """

    def __init__(
        self, plan: EpisodePlan, scenario: str, seats: Sequence[str], specs: Mapping[str, str]
    ) -> None:
        self.plan = plan
        self.scenario = scenario
        self.seats = list(seats)
        self.specs = dict(specs)
        self.steps: list[dict[str, Any]] = []
        """The transcript's steps (filled when the record is first read)."""
        self._played: list[_Played] = []
        self.keep_steps = True
        """Build the transcript's steps and the trajectories' turns (``False``: count only
        what the summary reads: agent steps, invalid moves, returns)."""
        self.copy_steps = True
        """Copy the mappings ``add_step`` is given (``False``: each step's are new objects
        that nobody changes later, as parley's ``Scenario.step`` returns)."""
        self.frozen_steps = False
        """Keep each step's rewards, terminations, truncations and infos as the JSON they
        will be written as (:func:`~parley.arena.run.records.frozen_json`), not as the
        env's objects, once the episode has kept :attr:`frozen_after` steps: only for
        records that nothing but the records' writer reads (the transcript's steps then
        hold ``msgspec.Raw`` values, which encode as the same bytes). A long episode's step
        dicts alive until written cost the loop more than encoding them: the memory, and
        the collector walking it (issue 33 §5)."""
        self.frozen_after = FROZEN_AFTER
        """Steps kept as objects before ``frozen_steps`` applies (0: from the first)."""
        self.steps_played = 0
        self.trajectories = {
            seat: TrajectoryMsg(
                episode=plan.episode_id, scenario=scenario, agent=seat, seed=plan.seed
            )
            for seat in seats
        }
        """Each seat's trajectory: its reward and components as play goes, its turns once
        the record is read."""
        self.metrics: dict[str, float] = {}
        self.failed = ""
        self.agent_steps = 0
        self.invalid_moves = 0
        self.agents_s = 0.0

    def add_step(
        self,
        turn: int,
        shown: Mapping[str, Observation],
        actions: Mapping[str, Action],
        observations: Mapping[str, str],
        rewards: Mapping[str, float],
        terminations: Mapping[str, bool],
        truncations: Mapping[str, bool],
        infos: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """Record one step: ``shown`` is what each asked seat was shown (the requests, built
        before the step: an env may change its last dicts in place), ``actions`` what the
        asked seats did, and the rest what ``env.step`` returned. The transcript's step
        and the seats' turns are built from what is kept here when the record is read."""
        keep = self.keep_steps
        self.agent_steps += len(actions)
        self.steps_played += 1
        if keep:
            # Hot path (every step): what the step's records will need and nothing more
            # (texts and tokens, not the messages: what is kept until the record is written
            # weighs on the loop's memory and its garbage collector), the env's mappings
            # copied only when the env may reuse them (Scenario.step builds new ones).
            kept: _EnvDicts = (rewards, terminations, truncations, infos)
            frozen = self.frozen_steps and len(self._played) >= self.frozen_after
            if frozen and len(self._played) == self.frozen_after:
                self._freeze_kept()
            if self.copy_steps or frozen:
                kept = _kept(kept, copy=self.copy_steps, frozen=frozen)
            observed: dict[str, str] = {}
            acted: dict[str, str] = {}
            tokens: dict[str, list[TokenRecord]] | None = None
            invalid: dict[str, str] | None = None
            for seat, action in actions.items():
                observed[seat] = shown[seat].text
                acted[seat] = action.text
                if action.tokens:
                    if tokens is None:
                        tokens = {}
                    tokens[seat] = list(action.tokens)
                reason = infos.get(seat, _EMPTY).get("invalid", "")
                if reason != "" and (reason := str(reason)):  # (the usual "": no str() call)
                    self.invalid_moves += 1
                    if invalid is None:
                        invalid = {}
                    invalid[seat] = reason
        else:
            for seat in actions:
                reason = infos.get(seat, _EMPTY).get("invalid", "")
                if reason != "" and str(reason):  # (the usual "" without a str() call)
                    self.invalid_moves += 1
        trajectories = self.trajectories
        credited: dict[str, float] | None = None  # the step's rewards that are not 0.0
        for seat, reward in rewards.items():
            value = float(reward)
            if value:  # adding 0.0 changes no sum (and NaN is truthy: it is added)
                trajectories[seat].reward += value
                if keep:
                    if credited is None:
                        credited = {}
                    credited[seat] = value
        if keep:  # (a run that keeps no step reads no component)
            self._played.append((turn, observed, acted, tokens, invalid, credited, *kept))
            for seat in rewards:
                components = infos.get(seat, _EMPTY).get("components")
                if components:
                    totals = trajectories[seat].components
                    for name, part in components.items():
                        totals[name] = totals.get(name, 0.0) + float(part)

    def _freeze_kept(self) -> None:
        """Keep the steps kept so far as their JSON (see :attr:`frozen_steps`)."""
        self._played = [
            (*step[:6], *_kept(step[6:], copy=False, frozen=True))  # (copied when kept)
            for step in self._played
        ]

    def _build(self) -> None:
        """Build the steps played so far into the transcript's steps and the trajectories'
        turns (once: the steps are then forgotten). Hold :data:`_BUILDING`."""
        played, self._played = self._played, []
        steps, trajectories = self.steps, self.trajectories
        for turn, observed, acted, tokens, invalid, credited, *env_dicts in played:
            rewards, terminations, truncations, infos = env_dicts
            steps.append(
                {
                    "turn": turn,
                    "observations": observed,
                    "actions": acted,
                    "rewards": rewards,
                    "terminations": terminations,
                    "truncations": truncations,
                    "infos": infos,
                }
            )
            for seat, text in acted.items():
                trajectories[seat].turns.append(
                    TurnRecord(
                        turn=turn,
                        observation=observed[seat],
                        action=text,
                        tokens=tokens.get(seat, []) if tokens else [],
                        invalid=invalid.get(seat, "") if invalid else "",
                    )
                )
            for seat, value in credited.items() if credited else ():
                turns = trajectories[seat].turns
                # A reward earned on a step the seat sat out belongs to its latest decision.
                if turns:
                    turns[-1].reward += value

    def non_finite(self) -> str:
        """Which seat's reward (or reward component) summed to NaN or an infinity, or "".

        One such reward in a training batch makes every advantage NaN, and every weight
        after one optimizer step (clipping the gradient's norm does not stop a NaN)."""
        for seat, trajectory in self.trajectories.items():
            if not math.isfinite(trajectory.reward):
                return f"{seat}'s reward is {trajectory.reward}"
            for name, total in trajectory.components.items():
                if not math.isfinite(total):
                    return f"{seat}'s reward component {name!r} is {total}"
        return ""

    def record(self) -> EpisodeRecord:
        plan = self.plan
        if not self.failed:
            bad = self.non_finite()
            if bad:  # failed, so never scored nor trained on
                self.failed = f"scenario_error: {bad} (rewards must be finite numbers)"
        if self.failed:
            self.metrics = {}
            for trajectory in self.trajectories.values():
                trajectory.failed = self.failed
        transcript = {
            "episode": plan.episode_id,
            "index": plan.index,
            "task": plan.task,
            "trial": plan.trial,
            "seed": plan.seed,
            "agent_seeds": plan.agent_seeds,
            "scenario": self.scenario,
            "agents": self.specs,
            "steps": self.steps,
            "metrics": self.metrics,
            "returns": {seat: t.reward for seat, t in self.trajectories.items()},
            "status": "failed" if self.failed else "ok",
            "failed": self.failed,
        }
        # Steps still to build: the record builds them when first read (off the loop).
        kind = _PlayedRecord if self._played else EpisodeRecord
        record = kind(
            index=plan.index,
            episode=plan.episode_id,
            task=plan.task,
            trial=plan.trial,
            seed=plan.seed,
            transcript=transcript,
            trajectories=[self.trajectories[seat] for seat in self.seats],
            metrics=self.metrics,
            failed=self.failed,
            agent_steps=self.agent_steps,
            invalid_moves=self.invalid_moves,
            agents_s=self.agents_s,
        )
        if isinstance(record, _PlayedRecord):
            record.log = self
        return record


class _PlayedRecord(EpisodeRecord):
    """An :class:`EpisodeRecord` whose transcript steps and trajectory turns its
    :class:`EpisodeLog` builds when ``transcript`` or ``trajectories`` is first read, on
    the thread that reads it (the records' writer thread, as it encodes): the event loop
    that played the episode does not pay for them. Read, it is what a record built at once
    would be: the same values, encoded to the same bytes (msgspec, which reads a
    dataclass's ``__dict__``, finds no ``transcript`` there and reads the property)."""

    log: EpisodeLog | None = None
    """The log whose steps are yet to build (``None`` once built)."""

    def _built(self) -> None:
        with _BUILDING:
            log = self.log
            if log is not None:
                log._build()
                self.log = None

    @property
    def transcript(self) -> dict[str, Any]:
        if self.log is not None:
            self._built()
        return self._transcript

    @transcript.setter
    def transcript(self, value: dict[str, Any]) -> None:
        self._transcript = value

    @property
    def trajectories(self) -> list[TrajectoryMsg]:
        if self.log is not None:
            self._built()
        return self._trajectories

    @trajectories.setter
    def trajectories(self, value: list[TrajectoryMsg]) -> None:
        self._trajectories = value

    def returns(self) -> list[tuple[str, float]]:
        # The rewards are summed as the episode is played: nothing to build for them.
        return [(t.agent, t.reward) for t in self._trajectories]

    def __eq__(self, other: object) -> bool:
        # Equal to the record built at once (an EpisodeRecord: the dataclass's own __eq__
        # wants the same class) when every field is.
        if not isinstance(other, EpisodeRecord):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(EpisodeRecord))
