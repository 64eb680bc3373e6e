"""A curriculum for ``parley train``: raise a scenario option as the learners succeed.

The rule (``curriculum:`` in the training config, :class:`CurriculumConfig`)::

    curriculum: {option: difficulty, start: 0, step: 1, max: 5, raise_at: 0.8, window: 32}

Episodes start with ``scenario_kwargs[option] = start``. The rolling ``metric`` (default
``success``) over the last ``window`` finished episodes played *at the current level* is
watched; once the window is full and its mean is at least ``raise_at``, the level goes up by
``step`` (never past ``max``) and the window starts empty again, so every raise is earned at
the level it leaves. Episodes still running when the level rises count for the level they
were played at (their scenario reports it in its metrics under ``option``, as the generated
tasks of calc-chain, retail-desk and code/debug do), and so never for the new one; failed
episodes (no metrics) count for nothing.

The level belongs to the run: it carries over from stage to stage and through a stage's
restarts, appears in every ``metrics.jsonl`` row (under the option's name) and in each
stage's entry of ``summary.json`` (``curriculum``: the level at the stage's end and the
episode count of each raise); to go on from a finished run, set ``start`` to the level it
ended at. Each episode's own level is in its metrics (its record and trajectories' episode).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parley.protocols.errors import ConfigError

__all__ = ["Curriculum", "CurriculumConfig"]


@dataclass
class CurriculumConfig:
    """When and how far a scenario option is raised (module docstring)."""

    option: str = "difficulty"
    """The ``make(scenario, ...)`` keyword raised (an integer option)."""
    start: int = 0
    """The level of the first episodes."""
    step: int = 1
    """How much each raise adds."""
    max: int = 5
    """The highest level."""
    raise_at: float = 0.8
    """Raise once the window's mean ``metric`` is at least this."""
    window: int = 32
    """Finished episodes at the current level the mean is taken over."""
    metric: str = "success"
    """The episode metric watched."""

    def __post_init__(self) -> None:
        if self.step < 1 or self.window < 1 or not self.start <= self.max:
            raise ConfigError(
                f"curriculum: need step >= 1, window >= 1 and start <= max, got step "
                f"{self.step}, window {self.window}, start {self.start}, max {self.max}"
            )
        if not math.isfinite(self.raise_at):
            raise ConfigError(f"curriculum: raise_at must be a finite number, got {self.raise_at}")


@dataclass
class Curriculum:
    """The run's current level and the episodes that will decide the next raise."""

    config: CurriculumConfig
    level: int = -1  # set from config.start
    episodes: int = 0  # finished episodes counted, at any level
    raises: list[dict[str, int]] = field(default_factory=list)  # {"level", "episodes"}
    _window: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.level < 0:
            self.level = self.config.start
        self._window = deque(maxlen=self.config.window)

    def scenario_kwargs(self, base: dict[str, Any]) -> dict[str, Any]:
        """``base`` with the option at the current level (a new dict)."""
        return {**base, self.config.option: self.level}

    def observe(self, metrics: Iterable[dict[str, float]]) -> bool:
        """Count finished episodes' metrics (in the order they finished); True when the
        level rose. An episode whose metrics name another level than the current one, or
        lack the watched metric, is not counted."""
        option, name = self.config.option, self.config.metric
        raised = False
        for figures in metrics:
            if name not in figures:
                continue
            self.episodes += 1
            if option in figures and figures[option] != self.level:
                continue  # played at an earlier level: it neither earns nor blocks a raise
            self._window.append(float(figures[name]))
            full = len(self._window) == self.config.window
            room = self.level < self.config.max
            if full and room and np.mean(self._window) >= self.config.raise_at:
                self.level = min(self.level + self.config.step, self.config.max)
                self.raises.append({"level": self.level, "episodes": self.episodes})
                self._window.clear()
                raised = True
        return raised

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` records: the level now and each raise."""
        return {"option": self.config.option, "level": self.level, "raises": list(self.raises)}
