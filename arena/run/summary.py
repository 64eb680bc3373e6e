"""The summary of a run: metrics as mean ± 95% CI, failures, invalid-move rate, pass^k.

:class:`SummaryBuilder` folds episode records into the ``summary.json`` mapping one at a
time (the runner's path: memory stays flat however long the run); :func:`summarize` does
the same for a list of records;
:func:`summary_table` renders that mapping as a rich table. Failed episodes are counted
and their reasons listed, but never enter a metric: an infrastructure failure is not a
score of 0.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from typing import Any

from rich.markup import escape
from rich.table import Table

from parley.arena.run.records import EpisodeRecord
from parley.arena.run.stats import Moments, PassHatK

__all__ = [
    "SummaryBuilder",
    "failure_kind",
    "plain_json",
    "summary_table",
]

SUCCESS_METRIC = "success"
"""The 0/1 episode metric pass^k is computed from."""


MAX_LISTED_FAILURES = 1_000
"""Failed episodes listed one by one in ``summary["failures"]``; the rest are counted in
``failures_not_listed`` (their reasons stay in ``transcripts.jsonl``)."""


class SummaryBuilder:
    """The summary of a run built one record at a time, in any order, in bounded memory.

    Holds exact sums per metric and seat (:class:`Moments`), counters, at most
    :data:`MAX_LISTED_FAILURES` failures, and the pass^k state of tasks with trials still
    playing, never the records: a run of a million episodes summarises in the memory of a
    few. :meth:`summary` equals :func:`summarize` over the same records.
    """

    def __init__(self, *, trials: int) -> None:
        self.trials = trials
        self.total = 0
        self.failed = 0
        self.agent_steps = 0
        self.invalid_moves = 0
        self._metrics: dict[str, Moments] = {}
        self._returns: dict[str, Moments] = {}
        # The earliest failures in plan order: a heap of (-index, episode, reason).
        self._failures: list[tuple[int, str, str]] = []
        self._failure_kinds: Counter[str] = Counter()
        self._pass = PassHatK(trials)

    def add(self, record: EpisodeRecord) -> None:
        """Count ``record`` (ok or failed); keeps nothing that refers to it."""
        self.total += 1
        self.agent_steps += record.agent_steps
        self.invalid_moves += record.invalid_moves
        if record.failed:
            self.failed += 1
            self._failure_kinds[failure_kind(record.failed)] += 1
            entry = (-record.index, record.episode, record.failed)
            if len(self._failures) < MAX_LISTED_FAILURES:
                heapq.heappush(self._failures, entry)
            else:  # keep the earliest in plan order, as a sorted list of all would
                heapq.heappushpop(self._failures, entry)
            self._pass.add(record.task, None)
            return
        _fold_into(self._metrics, record.metrics.items())
        _fold_into(self._returns, record.returns())  # (builds no turn: this runs on the loop)
        self._pass.add(record.task, record.metrics.get(SUCCESS_METRIC))

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` content so far (timings excluded; callers add them)."""
        steps = self.agent_steps
        listed = sorted(self._failures, reverse=True)
        summary: dict[str, Any] = {
            "episodes": {
                "total": self.total,
                "ok": self.total - self.failed,
                "failed": self.failed,
            },
            "metrics": {
                name: self._metrics[name].mean_ci().as_dict() for name in sorted(self._metrics)
            },
            "returns": {
                seat: self._returns[seat].mean_ci().as_dict() for seat in sorted(self._returns)
            },
            "agent_steps": steps,
            "invalid_moves": self.invalid_moves,
            "invalid_move_rate": self.invalid_moves / steps if steps else None,
            "failures": [{"episode": episode, "reason": reason} for _, episode, reason in listed],
            "failure_kinds": dict(self._failure_kinds),
        }
        if self.failed > len(listed):
            summary["failures_not_listed"] = self.failed - len(listed)
        if SUCCESS_METRIC in self._metrics:
            curve = self._pass.curve()
            summary["pass_hat_k"] = {str(k): v for k, v in curve.items()}
            summary["pass_hat_k_tasks"] = self._pass.tasks
        return summary


def _fold_into(moments: dict[str, Moments], values: Iterable[tuple[str, float]]) -> None:
    """Add each named value to its :class:`Moments` (made on a name's first value)."""
    for name, value in values:
        held = moments.get(name)
        if held is None:
            held = moments[name] = Moments()
        held.add(value)


def summarize(records: Iterable[EpisodeRecord], *, trials: int) -> dict[str, Any]:
    """The ``summary.json`` content for ``records`` (timings excluded; callers add them)."""
    builder = SummaryBuilder(trials=trials)
    for record in records:
        builder.add(record)
    return builder.summary()


def failure_kind(reason: str) -> str:
    """The kind of a failure reason (``SEAT: KIND: detail`` or ``KIND: detail``), one of
    :data:`FAILURE_KINDS` or ``other``."""
    parts = [p.strip() for p in reason.split(":")]
    kinds = [p for p in parts[:2] if p in FAILURE_KINDS]
    return kinds[0] if kinds else "other"


FAILURE_KINDS = frozenset(
    {"timeout", "peer_dead", "agent_error", "bus_error", "protocol_error", "bad_reply",
     "scenario_error", "max_steps", "not_joined", "worker_lost"}
)  # fmt: skip
"""The kinds SCHEMA.md lists for a failed episode's reason."""


def _fmt(value: float | None, ci: float | None = None) -> str:
    if value is None:
        return "—"
    text = f"{value:.3f}"
    return text if ci is None else f"{text} ± {ci:.3f}"


def summary_table(summary: dict[str, Any], *, title: str = "") -> Table:
    """A rich table of ``summary``: one row per metric, then the run's health rows."""
    table = Table(title=title or None, show_lines=False)
    table.add_column("metric")
    table.add_column("mean ± 95% CI", justify="right")
    table.add_column("n", justify="right")
    for name, stat in summary["metrics"].items():
        table.add_row(escape(name), _fmt(stat["mean"], stat["ci95"]), str(stat["n"]))
    for seat, stat in summary["returns"].items():
        table.add_row(escape(f"return[{seat}]"), _fmt(stat["mean"], stat["ci95"]), str(stat["n"]))
    for k, value in summary.get("pass_hat_k", {}).items():
        table.add_row(f"pass^{k}", _fmt(value), str(summary["pass_hat_k_tasks"]))
    table.add_section()
    episodes = summary["episodes"]
    table.add_row("episodes ok", str(episodes["ok"]), str(episodes["total"]))
    table.add_row("episodes failed", str(episodes["failed"]), str(episodes["total"]))
    table.add_row(
        "invalid-move rate", _fmt(summary["invalid_move_rate"]), str(summary["agent_steps"])
    )
    for kind, count in sorted(summary["failure_kinds"].items()):
        table.add_row(escape(f"failed: {kind}"), str(count), "")
    return table


def plain_json(value: Any) -> Any:
    """``value`` with anything JSON cannot hold (a pool object in agent_options) as repr."""
    if isinstance(value, dict):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)
