"""Asynchronous sampling: many episodes running against the pool, trajectories to a trainer.

The sampler plays episodes through the runner (:meth:`parley.arena.run.runner.Runner.play`,
the same episode loop ``parley run`` uses) and hands finished ones to the trainer in
batches of ``batch_size`` episodes, as they complete, while other episodes keep running.

Staleness bound (AReaL, SkyRL): with ``version`` the number of weight updates the trainer
has published, episodes are started only while::

    accepted + running <= (staleness + version + 1) * batch_size

where ``accepted`` counts episodes that finished (handed out or waiting in the buffer)
and ``running`` those still being played. ``staleness = 0`` is on-policy (the issue's
``(S + policy_version) * batch_size`` with versions counted from 1): batch ``k`` is
sampled entirely by the weights of update ``k``. ``staleness = S`` lets sampling run up
to S updates ahead, overlapping generation with training; the trainer corrects such
samples with truncated importance weights.

Failed episodes (an agent timed out or died, a scenario raised) are recorded with their
reason in :attr:`AsyncSampler.failures` and never reach the trainer: an infrastructure
failure is not a reward of 0. They do not count as accepted, so a replacement starts.

:func:`samples_from_record` turns a finished episode into per-decision
:class:`~parley.arena.training.pg.Sample` objects with returns-to-go (or shaped episode
returns), and :class:`ConstraintLog` remembers which constraint each generation was made
under, so the trainer can rebuild the exact legal-token masks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.arena.run.records import EpisodeRecord
from parley.arena.run.runner import EpisodePlan, Runner, derive_seed
from parley.arena.training.advantages import SampleKey
from parley.arena.training.pg import Sample
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Constraint, GenerateRequest, GenerateResult

__all__ = [
    "AsyncSampler",
    "Batch",
    "ConstraintLog",
    "RecordingClient",
    "SamplerConfig",
    "samples_from_record",
]

_TRAIN_KEY = 7  # purpose tag for derive_seed: training episode seeds


@dataclass
class SamplerConfig:
    """How episodes are sampled for training. Validated at construction."""

    batch_size: int = 64
    """Episodes per training batch."""
    staleness: int = 0
    """S: how many updates sampling may run ahead of training (0 = on-policy)."""
    concurrency: int = 64
    """Most episodes played at once."""
    group_size: int = 1
    """Episodes per scenario seed; > 1 makes GRPO groups 'by prompt' meaningful."""
    seed: int = 0
    """Seeds the scenario and agent seeds of every episode."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.concurrency < 1 or self.group_size < 1:
            raise ConfigError("batch_size, concurrency and group_size must be >= 1")
        if self.staleness < 0:
            raise ConfigError("staleness must be >= 0")


@dataclass
class Batch:
    """Finished episodes for one update, and the failures seen while sampling them."""

    records: list[EpisodeRecord]
    failures: list[EpisodeRecord] = field(default_factory=list)
    started_versions: list[int] = field(default_factory=list)
    """Published version at the start of each episode (same order as ``records``)."""


class AsyncSampler:
    """Keeps episodes of ``runner`` running and yields them in batches.

    Use inside ``async with runner.open():``. The training loop calls :meth:`publish`
    after each weight sync; that raises the staleness budget and lets more episodes start.
    """

    def __init__(self, runner: Runner, config: SamplerConfig | None = None) -> None:
        self.runner = runner
        self.config = config or SamplerConfig()
        self.version = 0
        self.accepted = 0
        self.failures: list[EpisodeRecord] = []
        self.peak_outstanding = 0
        """Largest ``accepted + running`` seen (never above the budget of its time)."""
        self._running: dict[asyncio.Task[EpisodeRecord], int] = {}
        self._ready: list[tuple[EpisodeRecord, int]] = []
        self._new_failures: list[EpisodeRecord] = []
        self._wake = asyncio.Event()
        self._next_index = 0

    @property
    def budget(self) -> int:
        """Most episodes that may be accepted or running under the staleness bound."""
        return (self.config.staleness + self.version + 1) * self.config.batch_size

    def publish(self, version: int) -> None:
        """The trainer published weights ``version``: more episodes may start."""
        self.version = version
        self._wake.set()

    def _plan(self) -> EpisodePlan:
        cfg, i = self.config, self._next_index
        self._next_index += 1
        task, trial = divmod(i, cfg.group_size)
        seats = self.runner.seats
        return EpisodePlan(
            index=i,
            task=task,
            trial=trial,
            seed=derive_seed(cfg.seed, _TRAIN_KEY, task),
            agent_seeds={
                seat: derive_seed(cfg.seed, _TRAIN_KEY + 1, task, trial, n)
                for n, seat in enumerate(seats)
            },
        )

    def _top_up(self) -> None:
        while (
            len(self._running) < self.config.concurrency
            and self.accepted + len(self._running) < self.budget
        ):
            task = asyncio.create_task(self.runner.play(self._plan()))
            self._running[task] = self.version
        self.peak_outstanding = max(self.peak_outstanding, self.accepted + len(self._running))

    async def batches(self, limit: int | None = None) -> AsyncIterator[Batch]:
        """Yield batches of ``batch_size`` finished episodes (``limit`` batches, or forever).

        Episodes keep running while the consumer trains on a batch. On exit the episodes
        still running are cancelled.
        """
        cfg = self.config
        produced = 0
        try:
            while limit is None or produced < limit:
                self._top_up()
                if len(self._ready) >= cfg.batch_size:
                    take, self._ready = (
                        self._ready[: cfg.batch_size],
                        self._ready[cfg.batch_size :],
                    )
                    failures, self._new_failures = self._new_failures, []
                    produced += 1
                    yield Batch([r for r, _ in take], failures, [v for _, v in take])
                    continue
                if not self._running:
                    raise RuntimeError(
                        "sampler stalled: no episode running and the batch is not full; "
                        "call publish(version) after each update"
                    )
                self._wake.clear()
                waiter = asyncio.create_task(self._wake.wait())
                done, _ = await asyncio.wait(
                    [*self._running, waiter], return_when=asyncio.FIRST_COMPLETED
                )
                waiter.cancel()
                for task in done:
                    if task is waiter:
                        continue
                    version = self._running.pop(task)  # type: ignore[arg-type]
                    record: EpisodeRecord = task.result()  # type: ignore[assignment]
                    if record.failed:
                        self.failures.append(record)
                        self._new_failures.append(record)
                    else:
                        self.accepted += 1
                        self._ready.append((record, version))
        finally:
            for task in self._running:
                task.cancel()
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)
            self._running.clear()


# ---------------------------------------------------------------------------- samples


class ConstraintLog:
    """Remembers the constraint of each generate request, keyed by (policy, prompt ids).

    The trainer needs it to rebuild the legal-token masks the backend decoded under;
    trajectories carry the tokens but not the constraint. The same prompt always comes
    with the same constraint (the scenario derives both from one observation), and many
    episodes share prompts, so entries are kept (not consumed); the oldest are dropped
    beyond ``capacity``.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._by_prompt: OrderedDict[tuple[str, tuple[int, ...]], Constraint | None] = OrderedDict()

    def note(self, request: GenerateRequest) -> None:
        key = (request.policy, tuple(request.prompt_token_ids))
        self._by_prompt[key] = request.constraint
        self._by_prompt.move_to_end(key)
        while len(self._by_prompt) > self.capacity:
            self._by_prompt.popitem(last=False)

    def get(self, policy: str, prompt_ids: Sequence[int]) -> Constraint | None:
        return self._by_prompt.get((policy, tuple(prompt_ids)))

    def __len__(self) -> int:
        return len(self._by_prompt)


class RecordingClient:
    """A pool client that notes each request's constraint in a :class:`ConstraintLog`."""

    def __init__(self, pool: Any, log: ConstraintLog) -> None:
        self.pool = pool
        self.log = log

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.log.note(request)
        result: GenerateResult = await self.pool.generate(request)
        return result


def samples_from_record(
    record: EpisodeRecord,
    *,
    seats: Sequence[str] | None = None,
    log: ConstraintLog | None = None,
    shaping: Mapping[str, Any] | None = None,
) -> list[Sample]:
    """The trainable decisions of one finished episode, one :class:`Sample` per turn.

    ``seats``: only these seats' decisions (default: every seat that has model tokens).
    Each decision's reward is its return-to-go (its turn's reward plus later ones); with
    ``shaping`` (seat or ``"*"`` -> :class:`~parley.scenarios.shaping.ShapingConfig`) it
    is the shaped episode return ``alpha * team + individual`` over the reward components.
    """
    if record.failed:
        raise ValueError(f"episode {record.episode} failed ({record.failed}): never train on it")
    shaped: dict[str, float] | None = None
    if shaping:
        from parley.scenarios.shaping import ShapingConfig, shape

        fallback = shaping.get("*", ShapingConfig())
        per_seat = {t.agent: shaping.get(t.agent, fallback) for t in record.trajectories}
        shaped = shape({t.agent: t.components for t in record.trajectories}, per_seat)
    out: list[Sample] = []
    for trajectory in record.trajectories:
        if seats is not None and trajectory.agent not in seats:
            continue
        to_go = [0.0] * (len(trajectory.turns) + 1)
        for i in range(len(trajectory.turns) - 1, -1, -1):
            to_go[i] = to_go[i + 1] + trajectory.turns[i].reward
        for i, turn in enumerate(trajectory.turns):
            reward = shaped[trajectory.agent] if shaped is not None else to_go[i]
            for tokens in turn.tokens:
                constraint = log.get(tokens.policy, tokens.prompt_token_ids) if log else None
                out.append(
                    Sample(
                        policy=tokens.policy,
                        prompt_ids=list(tokens.prompt_token_ids),
                        token_ids=list(tokens.token_ids),
                        logprobs=list(tokens.logprobs),
                        policy_version=tokens.policy_version,
                        reward=float(reward),
                        key=SampleKey(
                            role=trajectory.agent,
                            turn=turn.turn,
                            prompt=f"{record.seed}:{trajectory.agent}:{turn.turn}",
                        ),
                        constraint=constraint,
                    )
                )
    return out


@contextlib.asynccontextmanager
async def opened(runner: Runner) -> AsyncIterator[str]:
    """``runner.open()`` (re-exported so training code needs one import)."""
    async with runner.open() as address:
        yield address
