"""The eval page of ``parley view``: a ``parley eval`` report folder (``report.json``).

It shows the suite (name, digest, agents), one row per entry (scenario, linked to its run
page when the run folder is in view; episodes ok / failed (the agent's forfeits); success
counting forfeits as failures, as mean ± 95% CI (the run's own, over finished episodes, in
reports from before forfeits);
pass^k for k = 1..; invalid-move rate), every metric of every entry with its interval and
count, and, for each other report in view of the same suite digest, ``parley eval --compare
THIS OTHER``'s table: B - A per metric with its 95% Welch interval
(:func:`~parley.arena.run.suites.compare_reports`).

Every value read from ``report.json`` is escaped or checked to be a number: agent names and
scenario ids are whatever the file says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parley.arena.run.suites import REPORT_SCHEMA, WITH_FORFEITS, compare_reports
from parley.arena.view.data import Source, read_json
from parley.arena.view.html import Links, esc, num, page, pm
from parley.protocols.errors import ConfigError

__all__ = ["eval_page"]

EVAL_FILE = "report.json"
"""The file a ``parley eval --out`` folder holds (beside ``report.md`` and its runs)."""


def is_eval_report(report: Mapping[str, Any]) -> bool:
    """True when ``report`` reads as a ``parley eval`` report of the known schema."""
    return report.get("schema") == REPORT_SCHEMA and isinstance(report.get("entries"), list)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _agents(agents: Any) -> str:
    if isinstance(agents, Mapping):
        return ", ".join(f"{seat}={spec}" for seat, spec in agents.items())
    return str(agents)


def _entries(src: Source, entries: Sequence[Any], runs: Mapping[Path, Source], links: Links) -> str:
    out = [
        "<table id=eval-entries><tr><th>scenario</th><th>episodes ok / failed (forfeits)</th>"
        "<th>success, forfeits as 0 (mean ± 95% CI)</th><th>pass^k (k = 1..)</th>"
        "<th>invalid-move rate</th>"
        "</tr>"
    ]
    for entry in entries:
        row = _map(entry)
        scenario = esc(row.get("scenario", "?"))
        run = row.get("run")
        found = runs.get((src.path / run).resolve()) if isinstance(run, str) else None
        if found is not None:
            scenario = f'<a class=eval-run href="{esc(links.run(found.id))}">{scenario}</a>'
        episodes = _map(row.get("episodes"))
        metrics = _map(row.get("metrics"))
        success = _map(metrics.get(WITH_FORFEITS, metrics.get("success")))
        passes = " / ".join(num(v) for v in _map(row.get("pass_hat_k")).values()) or "-"
        forfeits = f" ({num(row['forfeits'])})" if "forfeits" in row else ""
        out.append(
            f"<tr><td>{scenario}</td><td>{num(episodes.get('ok'))} / "
            f"{num(episodes.get('failed'))}{forfeits}</td>"
            f"<td>{pm(success.get('mean'), success.get('ci95'))}"
            f"</td><td>{passes}</td><td>{num(row.get('invalid_move_rate'))}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _metrics(entries: Sequence[Any]) -> str:
    out = [
        "<table id=eval-metrics><tr><th>scenario</th><th>metric</th><th>mean ± 95% CI</th>"
        "<th>n</th></tr>"
    ]
    for entry in entries:
        row = _map(entry)
        for name, stat in _map(row.get("metrics")).items():
            stat = _map(stat)
            out.append(
                f"<tr><td>{esc(row.get('scenario', '?'))}</td><td>{esc(name)}</td>"
                f"<td>{pm(stat.get('mean'), stat.get('ci95'))}</td><td>{num(stat.get('n'))}</td>"
                "</tr>"
            )
    out.append("</table>")
    return "".join(out)


def _comparison(src: Source, report: Mapping[str, Any], other: Source, links: Links) -> str:
    """``parley eval --compare THIS OTHER`` as a table (B = the other report)."""
    theirs = read_json(other.file(EVAL_FILE))
    title = (
        f'<h3>B = <a class=eval-link href="{esc(links.eval(other.id))}">{esc(other.id)}</a> '
        f"(agents {esc(_agents(theirs.get('agents')))})</h3>"
    )
    try:
        rows = compare_reports(report, theirs)
    except (ConfigError, KeyError, TypeError, ValueError) as exc:  # a hand-edited file
        return f"{title}<p class=invalid>cannot compare: {esc(exc)}</p>"
    out = [
        title,
        "<table class=eval-compare><tr><th>scenario</th><th>metric</th><th>A</th><th>B</th>"
        "<th>B - A</th><th>95% Welch interval</th></tr>",
    ]
    for row in rows:
        ci = row["ci"]
        interval = "-" if ci is None else f"[{num(ci[0])}, {num(ci[1])}]"
        out.append(
            f"<tr><td>{esc(row['scenario'])}</td><td>{esc(row['metric'])}</td>"
            f"<td>{num(row['a'])}</td><td>{num(row['b'])}</td><td>{num(row['diff'])}</td>"
            f"<td>{interval}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def eval_page(src: Source, sources: Mapping[str, Source], links: Links) -> str:
    """The page of eval folder ``src``: its report, and its comparison with each other
    report in ``sources`` of the same suite digest (see the module docstring)."""
    report = read_json(src.file(EVAL_FILE))
    if not is_eval_report(report):
        refusal = f"<p class=invalid>not a parley eval report (schema {REPORT_SCHEMA})</p>"
        return page(f"eval {src.id}", refusal, links)
    runs = {s.path.resolve(): s for s in sources.values() if s.kind == "run"}
    entries = report["entries"]
    digest = report.get("suite_digest")
    body = [
        f"<p id=eval-suite>suite <b>{esc(report.get('suite', '?'))}</b>, digest "
        f"<code>{esc(digest)}</code>; agents <b>{esc(_agents(report.get('agents')))}</b>; "
        "mean ± 95% CI over episodes.</p>",
        _entries(src, entries, runs, links),
        "<h2>Metrics</h2>",
        _metrics(entries),
    ]
    others = [
        s
        for s in sources.values()
        if s.kind == "eval"
        and s.id != src.id
        and read_json(s.file(EVAL_FILE)).get("suite_digest") == digest
    ]
    if others:
        body.append(
            "<h2>Compared (A = this report)</h2><p>B - A per metric with its 95% Welch "
            "interval, as <code>parley eval --compare</code> prints it.</p>"
        )
        body += [_comparison(src, report, other, links) for other in others]
    return page(f"eval {src.id}", "".join(body), links)
