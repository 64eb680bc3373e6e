"""The summary of a run: metrics as mean ± 95% CI, failures, invalid-move rate, pass^k.

:func:`summarize` turns episode records into the ``summary.json`` mapping;
:func:`summary_table` renders that mapping as a rich table. Failed episodes are counted
and their reasons listed, but never enter a metric: an infrastructure failure is not a
score of 0.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from parley.arena.run.records import EpisodeRecord
from parley.arena.run.stats import mean_ci, pass_hat_k_curve

__all__ = ["SUCCESS_METRIC", "summarize", "summary_table"]

SUCCESS_METRIC = "success"
"""The 0/1 episode metric pass^k is computed from."""


def summarize(records: Sequence[EpisodeRecord], *, trials: int) -> dict[str, Any]:
    """The ``summary.json`` content for ``records`` (timings excluded; callers add them)."""
    ok = [r for r in records if not r.failed]
    failed = [r for r in records if r.failed]
    names = sorted({name for r in ok for name in r.metrics})
    metrics = {
        name: mean_ci([r.metrics[name] for r in ok if name in r.metrics]).as_dict()
        for name in names
    }
    returns: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        for trajectory in r.trajectories:
            returns[trajectory.agent].append(trajectory.reward)
    agent_steps = sum(r.agent_steps for r in records)
    invalid = sum(r.invalid_moves for r in records)
    summary: dict[str, Any] = {
        "episodes": {"total": len(records), "ok": len(ok), "failed": len(failed)},
        "metrics": metrics,
        "returns": {seat: mean_ci(v).as_dict() for seat, v in sorted(returns.items())},
        "agent_steps": agent_steps,
        "invalid_moves": invalid,
        "invalid_move_rate": invalid / agent_steps if agent_steps else None,
        "failures": [{"episode": r.episode, "reason": r.failed} for r in failed],
        "failure_kinds": dict(Counter(_kind(r.failed) for r in failed)),
    }
    if SUCCESS_METRIC in names:
        per_task: dict[int, list[float]] = defaultdict(list)
        for r in ok:
            if SUCCESS_METRIC in r.metrics:
                per_task[r.task].append(r.metrics[SUCCESS_METRIC])
        curve = pass_hat_k_curve(per_task, trials)
        summary["pass_hat_k"] = {str(k): v for k, v in curve.items()}
        summary["pass_hat_k_tasks"] = len(per_task)
    return summary


def _kind(reason: str) -> str:
    # Reasons read "seat: kind: detail" or "kind: detail"; the kind is the last short label.
    parts = [p.strip() for p in reason.split(":")]
    kinds = [p for p in parts[:2] if p in _FAILURE_KINDS]
    return kinds[0] if kinds else "other"


_FAILURE_KINDS = frozenset(
    {"timeout", "peer_dead", "agent_error", "bus_error", "protocol_error", "bad_reply",
     "scenario_error", "max_steps", "not_joined"}
)  # fmt: skip


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
