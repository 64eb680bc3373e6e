"""Benchmark suites: named, versioned sets of scenario runs, their report, and comparisons.

A suite is data: frozen :class:`SuiteEntry` rows (a pinned scenario version, its arguments,
run seed, episodes and trials) under a versioned name in :data:`SUITES`. **A suite is never
changed in place**: any change to an entry (a scenario version, a seed, a count) is a new
suite version (``negotiation-v2``), and the old one stays as it is, so a report's
``suite_digest`` (sha256 of the suite's canonical JSON, :func:`suite_digest`) names exactly
what was played.

:func:`run_suite` plays each entry as one :class:`~parley.arena.run.config.RunConfig` run
into ``OUT/NN-family_name-vN/`` and writes ``OUT/report.json`` and ``OUT/report.md``
(every metric as mean ± 95% CI, pass^k where the scenario reports ``success``). An episode
that failed because of the evaluated agent's seats alone (it raised, did not answer in time,
died: :func:`~parley.arena.run.backpressure.failed_seats`) is a **forfeit**: the report's
``success_with_forfeits`` metric and ``pass_hat_k`` count it as a failed trial, so an agent
cannot leave the tasks it would fail out of its score by crashing or stalling on them (the
run's own metrics leave every failed episode out; a failure of the scenario or of a
baseline seat stays out of both). A run
folder whose ``summary.json`` is complete and records the same digest and agents is read
back, not played again (resume after a crash or Ctrl-C). :func:`compare_reports` gives,
for two reports of the same suite, the difference of every metric (B - A) with a 95% Welch
interval.

Agents: one spec plays every seat of every entry (``scripted``, ``llm:PATH``, ...); or
``seat=spec`` items name seats (in whichever entries have them) and the other seats play
the scenario's scripted baseline, as in ``parley run``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from parley.arena.run.backpressure import failed_seats
from parley.arena.run.stats import PassHatK, mean_ci, t975
from parley.protocols.errors import ConfigError

__all__ = [
    "SUITES",
    "Suite",
    "SuiteEntry",
    "compare_reports",
    "get_suite",
    "load_report",
    "report_markdown",
    "run_suite",
    "suite_digest",
]

REPORT_SCHEMA = 1
"""Version of the ``report.json`` layout."""
WITH_FORFEITS = "success_with_forfeits"
"""The report's success metric counting the evaluated agent's failed episodes as 0."""


@dataclass(frozen=True)
class SuiteEntry:
    """One scenario run of a suite."""

    scenario: str
    """A pinned scenario id, ``family/name-vN`` (never an id without a version)."""
    episodes: int
    """Tasks (distinct episode seeds) played."""
    trials: int = 1
    """Plays per task (pass^k for k = 1..trials)."""
    seed: int = 0
    """Run seed: every episode seed derives from it."""
    scenario_kwargs: tuple[tuple[str, Any], ...] = ()
    """Arguments of ``make``, as sorted (key, value) pairs (hashable, canonical)."""

    @property
    def folder(self) -> str:
        """The entry's run-folder name without its index (``negotiation_deal-or-no-deal-v3``)."""
        return self.scenario.replace("/", "_")


@dataclass(frozen=True)
class Suite:
    """A named, versioned list of entries."""

    name: str
    """``topic-vN``; a change to any entry is a new N."""
    description: str
    entries: tuple[SuiteEntry, ...] = field(default_factory=tuple)

    def canonical(self) -> dict[str, Any]:
        """What the digest is taken over: the name and every entry field (JSON values)."""
        entries = [dataclasses.asdict(e) for e in self.entries]
        plain: dict[str, Any] = json.loads(json.dumps({"name": self.name, "entries": entries}))
        return plain


def suite_digest(suite: Suite) -> str:
    """sha256 (hex) of the suite's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(suite.canonical(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


_EPISODES, _TRIALS = 50, 3
_NEGOTIATION = (
    SuiteEntry("negotiation/deal-or-no-deal-v3", _EPISODES, _TRIALS),
    SuiteEntry("negotiation/simple-trade-v2", _EPISODES, _TRIALS),
)
_COLLABORATION = (
    SuiteEntry("collaboration/hidden-profile-v2", _EPISODES, _TRIALS),
    SuiteEntry("collaboration/referential-v1", _EPISODES, _TRIALS),
)
_TOOL_USE = (
    SuiteEntry("tool_use/retail-desk-v3", _EPISODES, _TRIALS),
    SuiteEntry("tool_use/calc-chain-v1", _EPISODES, _TRIALS),
    SuiteEntry("tool_use/research-team-v0", _EPISODES, _TRIALS),
)
_CODE = (SuiteEntry("code/debug-v3", 30, _TRIALS),)

SUITES: Mapping[str, Suite] = {
    suite.name: suite
    for suite in (
        Suite("negotiation-v1", "bargaining over items and trades", _NEGOTIATION),
        Suite("collaboration-v1", "sharing private facts; grounding a code", _COLLABORATION),
        Suite("tool-use-v1", "tools, a database and search on behalf of a user", _TOOL_USE),
        Suite("code-v1", "fixing a bug against hidden tests in a sandbox", _CODE),
        Suite(
            "all-v1",
            "every suite above",
            _NEGOTIATION + _COLLABORATION + _TOOL_USE + _CODE,
        ),
    )
}
"""Every suite by name. Add new versions; never edit one (its digest is in reports)."""


def get_suite(name: str) -> Suite:
    """The suite called ``name``; :class:`ConfigError` listing the known ones otherwise."""
    if name not in SUITES:
        known = ", ".join(SUITES)
        raise ConfigError(f"no suite {name!r}; known suites: {known} (parley eval --list)")
    return SUITES[name]


def entry_agents(
    suite: Suite, agents: str | Mapping[str, str], seats: Mapping[str, list[str]]
) -> list[dict[str, str]]:
    """Each entry's ``RunConfig.agents`` mapping: one spec in every seat, or the named seats
    the entry has (others scripted). A named seat no entry has is a :class:`ConfigError`."""
    if isinstance(agents, str):
        return [dict.fromkeys(seats[e.scenario], agents) for e in suite.entries]
    known = {seat for entry in suite.entries for seat in seats[entry.scenario]}
    unknown = sorted(set(agents) - known)
    if unknown:
        raise ConfigError(
            f"--agents names seats {unknown} that no scenario of {suite.name} has; "
            f"its seats are {sorted(known)}"
        )
    return [
        {seat: agents.get(seat, "scripted") for seat in seats[e.scenario]} for e in suite.entries
    ]


def _seats(scenario: str) -> list[str]:
    from parley.scenarios import make

    env = make(scenario)
    try:
        return list(env.possible_agents)
    finally:
        env.close()


def _finished(summary_path: Path, digest: str, agents: Mapping[str, str]) -> dict[str, Any] | None:
    """The run's summary when it is complete and of this digest and agents; ``None`` when
    there is none or it is unfinished (it is played again). A finished run of another suite
    or other agents is a :class:`ConfigError`: its folder is not overwritten."""
    if not summary_path.exists():
        return None
    summary: dict[str, Any] = json.loads(summary_path.read_text(encoding="utf-8"))
    mark = summary.get("suite")
    if summary.get("partial") or not mark:
        return None
    if mark.get("digest") != digest or mark.get("agents") != agents:
        raise ConfigError(
            f"{summary_path.parent} holds a run of suite {mark.get('name')} "
            f"({str(mark.get('digest'))[:12]}) with agents {mark.get('agents')}, not this "
            "suite and agents: give another --out (or delete that folder)"
        )
    return summary


def run_suite(
    suite: Suite,
    agents: str | Mapping[str, str],
    out: str | Path,
    *,
    concurrency: int = 8,
    agent_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Play (or resume) every entry of ``suite``; writes and returns ``report.json``'s content.

    ``agents`` is one spec for every seat or a mapping seat -> spec (:func:`entry_agents`);
    ``log`` gets a line as each entry starts and ends; ``progress`` shows each run's bar.
    """
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run

    digest = suite_digest(suite)
    seats = {entry.scenario: _seats(entry.scenario) for entry in suite.entries}
    per_entry = entry_agents(suite, agents, seats)
    root = Path(out)
    rows = []
    for index, (entry, specs) in enumerate(zip(suite.entries, per_entry, strict=True)):
        folder = root / f"{index:02d}-{entry.folder}"
        where = f"[{index + 1}/{len(suite.entries)}] {entry.scenario}"
        summary = _finished(folder / "summary.json", digest, specs)
        if summary is not None:
            log(f"{where}: resumed from {folder}")
        else:
            log(f"{where}: {entry.episodes} episodes x {entry.trials} trials ...")
            config = RunConfig(
                scenario=entry.scenario,
                scenario_kwargs=dict(entry.scenario_kwargs),
                agents=dict(specs),
                episodes=entry.episodes,
                trials=entry.trials,
                seed=entry.seed,
                concurrency=concurrency,
                out=str(folder),
                agent_options=dict(agent_options or {}),
                progress=progress,
                max_failed_fraction=1.0,  # failures are reported per entry, never scored
            )
            summary = run(config).summary
            summary["suite"] = {"name": suite.name, "digest": digest, "agents": specs}
            _write_json(folder / "summary.json", summary)  # marks the run complete
            ok = summary["episodes"]
            log(f"{where}: {ok['ok']} ok, {ok['failed']} failed")
        evaluated = set(specs) if isinstance(agents, str) else set(agents) & set(specs)
        row = report_row(entry, specs, summary, folder.name)
        rows.append(with_forfeits(row, folder / "transcripts.jsonl", evaluated, entry.trials))
    report = {
        "schema": REPORT_SCHEMA,
        "suite": suite.name,
        "suite_digest": digest,
        "definition": suite.canonical(),
        "agents": agents if isinstance(agents, str) else dict(agents),
        "entries": rows,
    }
    _write_json(root / "report.json", report)
    (root / "report.md").write_text(report_markdown(report), encoding="utf-8")
    return report


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)  # a reader sees the old file or the whole new one


def report_row(
    entry: SuiteEntry, specs: Mapping[str, str], summary: Mapping[str, Any], run: str
) -> dict[str, Any]:
    metrics = {}
    for name, stat in summary["metrics"].items():
        n, ci = stat["n"], stat["ci95"]
        # The standard deviation travels with the report: --compare needs it for Welch.
        sd = ci / t975(n - 1) * math.sqrt(n) if ci is not None and n > 1 else None
        metrics[name] = {**stat, "sd": sd}
    return {
        "scenario": entry.scenario,
        "run": run,
        "agents": dict(specs),
        "episodes": summary["episodes"],
        "metrics": metrics,
        "pass_hat_k": summary.get("pass_hat_k"),
        "invalid_move_rate": summary.get("invalid_move_rate"),
    }


class _Ended(msgspec.Struct):
    """What :func:`with_forfeits` reads of a ``transcripts.jsonl`` line."""

    task: int
    status: str
    failed: str = ""
    metrics: dict[str, float] = {}


def with_forfeits(
    row: dict[str, Any], transcripts: Path, evaluated: set[str], trials: int
) -> dict[str, Any]:
    """``row`` with the evaluated agent's forfeits counted (the module docstring): the
    ``forfeits`` count, ``pass_hat_k`` over the trials played or forfeited, and the metric
    :data:`WITH_FORFEITS` where the scenario reports ``success``."""
    decode = msgspec.json.Decoder(_Ended).decode
    seats = row["agents"]
    values: list[float] = []
    passes = PassHatK(trials)
    forfeits = 0
    with open(transcripts, "rb") as lines:
        for line in lines:
            ended = decode(line)
            if ended.status == "ok":
                success = ended.metrics.get("success")
            else:
                culprits = failed_seats(ended.failed, seats)
                forfeit = culprits is not None and set(culprits) <= evaluated
                forfeits += forfeit
                # (the scenario's or a baseline's failure: left out, as in the run's)
                success = 0.0 if forfeit else None
            passes.add(ended.task, success)
            if success is not None:
                values.append(success)
    row = {**row, "forfeits": forfeits}
    if "success" in row["metrics"]:
        stat = mean_ci(values)
        sd = stat.ci95 / t975(stat.n - 1) * math.sqrt(stat.n) if stat.n > 1 else None
        row["metrics"] = {**row["metrics"], WITH_FORFEITS: {**stat.as_dict(), "sd": sd}}
        row["pass_hat_k"] = {str(k): v for k, v in passes.curve().items()}
    return row


def _cell(mean: float | None, ci: float | None) -> str:
    if mean is None:
        return "—"
    return f"{mean:.3f}" if ci is None else f"{mean:.3f} ± {ci:.3f}"


def report_markdown(report: Mapping[str, Any]) -> str:
    """The report as a markdown page: one table row per entry and metric."""
    lines = [
        f"# {report['suite']} — agents: {json.dumps(report['agents'])}",
        "",
        f"suite digest `{report['suite_digest']}`; mean ± 95% CI over episodes.",
        "",
        "| scenario | episodes ok / failed (forfeits) | success, forfeits as 0 | "
        "pass^k (k = 1..) | invalid-move rate |",
        "|---|---|---|---|---|",
    ]
    for row in report["entries"]:
        success = row["metrics"].get(WITH_FORFEITS) or {}
        passes = " / ".join(_cell(v, None) for v in (row.get("pass_hat_k") or {}).values())
        episodes = row["episodes"]
        lines.append(
            f"| {row['scenario']} | {episodes['ok']} / {episodes['failed']} "
            f"({row.get('forfeits', 0)}) | "
            f"{_cell(success.get('mean'), success.get('ci95'))} | {passes or '—'} | "
            f"{_cell(row['invalid_move_rate'], None)} |"
        )
    lines += ["", "| scenario | metric | mean ± 95% CI | n |", "|---|---|---|---|"]
    for row in report["entries"]:
        for name, stat in row["metrics"].items():
            cell = _cell(stat["mean"], stat["ci95"])
            lines.append(f"| {row['scenario']} | {name} | {cell} | {stat['n']} |")
        for k, value in (row.get("pass_hat_k") or {}).items():
            lines.append(f"| {row['scenario']} | pass^{k} | {_cell(value, None)} | |")
    return "\n".join(lines) + "\n"


def load_report(path: str | Path) -> dict[str, Any]:
    """A ``report.json`` (or the folder holding one); :class:`ConfigError` if it is not one."""
    found = Path(path)
    if found.is_dir():
        found = found / "report.json"
    try:
        report = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read report {str(path)!r}: {exc}; give a report.json of parley eval"
        ) from None
    if not isinstance(report, dict) or report.get("schema") != REPORT_SCHEMA:
        raise ConfigError(f"{str(path)!r} is not a parley eval report (schema {REPORT_SCHEMA})")
    return report


def welch_interval(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """``(difference b - a, low, high)``: the 95% Welch interval of the difference of two
    means given as ``{"mean", "sd", "n"}``; ``None`` when either side lacks a spread."""
    if a.get("sd") is None or b.get("sd") is None or a["n"] < 2 or b["n"] < 2:
        return None
    va, vb = a["sd"] ** 2 / a["n"], b["sd"] ** 2 / b["n"]
    diff = b["mean"] - a["mean"]
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff  # both constant: the difference is exact
    df = (va + vb) ** 2 / (va**2 / (a["n"] - 1) + vb**2 / (b["n"] - 1))
    half = t975(df) * se
    return diff, diff - half, diff + half


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per entry and metric both reports hold: A's and B's means and B - A with its 95%
    Welch interval. Reports of different suite digests are a :class:`ConfigError`."""
    if a["suite_digest"] != b["suite_digest"]:
        raise ConfigError(
            f"the reports are of different suites ({a['suite']} {a['suite_digest'][:12]} vs "
            f"{b['suite']} {b['suite_digest'][:12]}): compare reports of the same suite version"
        )
    rows = []
    for row_a, row_b in zip(a["entries"], b["entries"], strict=True):
        for name, stat_a in row_a["metrics"].items():
            stat_b = row_b["metrics"].get(name)
            if stat_b is None or stat_a["mean"] is None or stat_b["mean"] is None:
                continue
            welch = welch_interval(stat_a, stat_b)
            rows.append(
                {
                    "scenario": row_a["scenario"],
                    "metric": name,
                    "a": stat_a["mean"],
                    "b": stat_b["mean"],
                    "diff": stat_b["mean"] - stat_a["mean"],
                    "ci": None if welch is None else [welch[1], welch[2]],
                }
            )
    return rows
