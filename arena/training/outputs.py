"""What a training run writes: ``metrics.jsonl`` (+ TensorBoard), checkpoints, the summary
and the learning-curve plot (see :mod:`parley.arena.training.loop`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parley.arena.training.adapters import PolicyWeights

__all__ = [
    "MetricsLogger",
    "save_checkpoints",
    "write_summary",
    "TrainResult",
    "short_of_target",
    "SHORT_OF_TARGET",
]


class MetricsLogger:
    """metrics.jsonl (+ TensorBoard if installed), and every row logged (the history)."""

    def __init__(self, out: Path) -> None:
        self.history: list[dict[str, Any]] = []
        self.file = (out / "metrics.jsonl").open("w", encoding="utf-8")  # a new run: a new file
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


def write_summary(
    out: Path,
    wall: float,
    history: list[dict[str, Any]],
    summaries: list[dict[str, Any]],
    seeds: Mapping[str, Any],
    models: Mapping[str, Any] | None = None,
    short_of_target: Sequence[str] = (),
) -> None:
    """``summary.json`` (wall time, every seed the run used, ``models``: what was trained
    and in which dtypes, one entry per stage, ``short_of_target``: the stages that ended
    below their target) and the learning-curve plot."""
    summary: dict[str, Any] = {"wall_s": wall, "seeds": dict(seeds), "stages": summaries}
    summary["short_of_target"] = list(short_of_target)
    if models is not None:
        summary["models"] = dict(models)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    _plot(history, summaries, out / "learning_curve.png")


def save_checkpoints(
    weights: Mapping[str, PolicyWeights], tokenizer: Any, out: Path
) -> dict[str, Path]:
    """Each policy under ``out/checkpoints/<policy>``: a whole model with the tokenizer in
    Hugging Face format, or a PEFT adapter directory
    (:meth:`~parley.arena.training.adapters.PolicyWeights.save`)."""
    paths = {name: out / "checkpoints" / name for name in weights}
    for name, policy in weights.items():
        policy.save(paths[name], tokenizer)
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
        name = summary["stage"] + (f" #{summary['attempt'] + 1}" if summary.get("attempt") else "")
        stalled = ", stalled" if summary.get("stalled") else ""
        ax.plot(xs, curve, label=f"{name} ({summary['wall_s']:.0f} s{stalled})")
        offset += len(curve)
    ax.set_xlabel("update")
    ax.set_ylabel("success (training batch)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


SHORT_OF_TARGET = 3
"""``parley train``'s exit status when the run finished but a stage ended short of its
target (1: an error, 2: a bad command line, 130: interrupted)."""


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    out: Path
    history: list[dict[str, Any]]
    checkpoints: dict[str, Path]
    wall_s: float
    stage_summaries: list[dict[str, Any]]
    seeds: dict[str, Any] = field(default_factory=dict)
    """Every seed the run used (:meth:`RunSeeds.as_dict`, also in ``summary.json``)."""

    @property
    def short_of_target(self) -> list[dict[str, Any]]:
        """The summaries of the stages whose last attempt ended short of its target (a
        restarted stage counts by its last attempt), in stage order; empty when every
        stage with a target reached it."""
        return short_of_target(self.stage_summaries)


def short_of_target(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:attr:`TrainResult.short_of_target` over ``summaries`` (one per stage attempt)."""
    last = {s["stage"]: s for s in summaries}  # later attempts replace earlier ones
    return [s for s in last.values() if s.get("reached") is False]
