"""The order a training run goes through its stages: an explicit state machine.

A run plays its stages in order. An RL stage whose ``restart`` rule fires
(:class:`~parley.arena.training.config.RestartConfig`) sends the run back to the rule's
``back_to`` stage (or to itself), every policy restored to the weights it had when that stage
began, each re-run stage one attempt further (new episode seeds). A rule fires at most
``max`` times; then its stage runs on to its end.

:class:`StagePlan` holds only this bookkeeping, no model and no I/O, so every path through it
is tested on its own (``tests/arena/training/test_stage_plan.py``). The training loop asks it
what comes next and does it::

    step = plan.first()
    while not isinstance(step, Done):
        if isinstance(step, Play):     # snapshot if step.snapshot; run the stage
            step = plan.played(restart=<the stage stopped to start over>)
        else:                          # Restart: restore step.back_to's snapshot, reinit
            step = plan.restarted()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parley.arena.training.config import StageConfig

__all__ = ["Done", "Play", "Restart", "StagePlan", "Step"]


@dataclass(frozen=True)
class Play:
    """Play stage ``index`` (its ``attempt``-th try, 0 first)."""

    index: int
    attempt: int
    snapshot: bool
    """Keep every policy's weights before it starts: a restart rule goes back to this stage."""
    may_restart: bool
    """Its rule has restarts left: the stage may stop early to start over."""


@dataclass(frozen=True)
class Restart:
    """Stage ``stage`` stalled: go back to stage ``back_to``'s snapshot (the ``count``-th
    restart of the run) and give the policies in ``reinit`` fresh weights."""

    stage: int
    back_to: int
    count: int
    reinit: tuple[str, ...]


@dataclass(frozen=True)
class Done:
    """Every stage has been played."""


Step = Play | Restart | Done


class StagePlan:
    """Which stage to play next, given how the last one ended."""

    def __init__(self, stages: Sequence[StageConfig]) -> None:
        self._stages = list(stages)
        names = [stage.name for stage in self._stages]
        self._back: dict[int, int] = {}
        for i, stage in enumerate(self._stages):
            if stage.restart is not None:
                back = stage.restart.back_to if stage.restart.back_to is not None else names[i]
                # the latest stage of that name at or before this one (config validates it)
                self._back[i] = max(j for j in range(i + 1) if names[j] == back)
        self._left = {i: self._stages[i].restart.max for i in self._back}  # type: ignore[union-attr]
        self._attempts = [0] * len(self._stages)
        self._restarts = 0
        self._at = 0
        self._pending: Restart | None = None

    @property
    def restarts(self) -> int:
        """Restarts so far over the run."""
        return self._restarts

    def first(self) -> Step:
        """The first step of the run."""
        return self._play(0)

    def played(self, *, restart: bool) -> Step:
        """The stage of the last :class:`Play` ended; ``restart``: it stopped to start over
        (only possible when that ``Play`` had ``may_restart``)."""
        i = self._at
        if not restart:
            return self._play(i + 1)
        if self._left.get(i, 0) <= 0:
            raise ValueError(f"stage {self._stages[i].name!r} has no restart left")
        self._left[i] -= 1
        self._restarts += 1
        rule = self._stages[i].restart
        reinit = tuple(rule.reinit) if rule is not None else ()
        self._pending = Restart(i, self._back[i], self._restarts, reinit)
        return self._pending

    def restarted(self) -> Step:
        """The last :class:`Restart` has been carried out: the stages from ``back_to`` to the
        stalled one each get one attempt more, and the run goes on from ``back_to``."""
        if self._pending is None:
            raise ValueError("restarted() without a pending Restart")
        step, self._pending = self._pending, None
        for j in range(step.back_to, step.stage + 1):
            self._attempts[j] += 1
        return self._play(step.back_to)

    def _play(self, i: int) -> Step:
        self._at = i
        if i >= len(self._stages):
            return Done()
        return Play(
            index=i,
            attempt=self._attempts[i],
            snapshot=i in self._back.values(),
            may_restart=self._left.get(i, 0) > 0,
        )
