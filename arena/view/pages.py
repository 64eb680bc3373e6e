"""The viewer's pages, as HTML strings: runs, one run, its episodes, compare, training.

Each function takes what it shows and a :class:`~parley.arena.view.html.Links` (served or
exported URLs) and returns a whole document; all run text is escaped (see
:mod:`parley.arena.view.html`). The one-episode timeline is in
:mod:`parley.arena.view.episode`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from parley.arena.view.data import (
    Source,
    compare_metrics,
    failure_groups,
    failure_kind,
    finite,
    invalid_rates,
    load_jsonl,
    metric_table,
    pass_k,
    read_json,
)
from parley.arena.view.html import Links, esc, num, page, pm, text_html
from parley.arena.view.index import episode_rows

__all__ = ["compare_page", "episodes_page", "index_page", "run_page", "train_page"]

HEADLINE = ("success", "score", "reward", "agreed")
"""Metrics shown first on the runs page when a run has them."""


def run_info(src: Source) -> dict[str, Any]:
    """What the runs page says about one folder (from summary.json when there is one)."""
    if src.kind == "train":
        summary = read_json(src.file("summary.json"))
        rows = load_jsonl(src.file("metrics.jsonl"))
        config = src.file("config.yaml")
        scenario = ""
        if config is not None:
            for line in config.read_text(errors="replace").splitlines():
                if line.startswith("scenario:"):
                    scenario = line.partition(":")[2].strip()
        stamp = src.file("metrics.jsonl")
        return {
            "scenario": scenario,
            "agents": "",
            "date": _date(stamp),
            "episodes": rows[-1].get("episodes", "") if rows else 0,
            "headline": f"{len(rows)} updates" + ("" if summary else " (running)"),
        }
    summary = read_json(src.file("summary.json"))
    episodes = _map(summary.get("episodes"))
    if not summary:
        eps = episode_rows(src.file("transcripts.jsonl"))
        first = eps[0] if eps else {}
        summary = {"scenario": first.get("scenario", ""), "agents": first.get("agents", {})}
        failed = sum(1 for e in eps if e.get("status") == "failed")
        episodes = {"total": len(eps), "ok": len(eps) - failed, "failed": failed}
    metrics = {k: v for k, v in _map(summary.get("metrics")).items() if isinstance(v, Mapping)}
    names = [m for m in HEADLINE if m in metrics] or sorted(metrics)[:2]
    headline = ", ".join(
        f"{name} {pm(metrics[name].get('mean'), metrics[name].get('ci95'))}" for name in names[:3]
    )
    agents = summary.get("agents") or {}
    return {
        "scenario": summary.get("scenario", ""),
        "agents": ", ".join(f"{k}={v}" for k, v in agents.items())
        if isinstance(agents, Mapping)
        else str(agents),
        "date": _date(src.file("summary.json") or src.file("transcripts.jsonl")),
        "episodes": f"{episodes.get('total', '?')} ({episodes.get('failed', 0)} failed)",
        "headline": headline,
    }


def _map(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else empty (summary.json may hold anything)."""
    return value if isinstance(value, Mapping) else {}


def _date(path: Any) -> str:
    if path is None:
        return ""
    stamp = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def index_page(sources: Mapping[str, Source], links: Links) -> str:
    runs = [s for s in sources.values() if s.kind == "run"]
    trains = [s for s in sources.values() if s.kind == "train"]
    parts = []
    head = "<tr><th>run</th><th>scenario</th><th>agents</th><th>date</th><th>episodes</th>"
    parts.append(f"<h2>Runs ({len(runs)})</h2>")
    if runs:
        rows = []
        for src in runs:
            info = run_info(src)
            rows.append(
                f'<tr><td><a class=run-link href="{esc(links.run(src.id))}">{esc(src.id)}</a>'
                f"</td><td>{esc(info['scenario'])}</td><td>{esc(info['agents'])}</td>"
                f"<td>{esc(info['date'])}</td><td>{esc(info['episodes'])}</td>"
                f"<td>{esc(info['headline'])}</td></tr>"
            )
        parts.append(f"<table id=runs>{head}<th>headline metrics</th></tr>{''.join(rows)}</table>")
        if len(runs) >= 2 and not links.static:
            options = "".join(f'<option value="{esc(s.id)}">{esc(s.id)}</option>' for s in runs)
            parts.append(
                "<form id=compare-form action=/compare method=get class=inline>"
                f"<label>compare <select name=a>{options}</select></label> "
                f"<label>with <select name=b>{options}</select></label> "
                "<button type=submit>compare</button></form>"
            )
        elif len(runs) >= 2:
            pairs = [(a.id, b.id) for a in runs for b in runs if a.id < b.id][:50]
            items = "".join(
                f'<li><a href="{esc(links.compare(a, b))}">{esc(a)} vs {esc(b)}</a></li>'
                for a, b in pairs
            )
            parts.append(f"<h3>Compare</h3><ul>{items}</ul>")
    else:
        parts.append("<p>No run folders (transcripts.jsonl or summary.json) found.</p>")
    parts.append(f"<h2>Training runs ({len(trains)})</h2>")
    if trains:
        rows = []
        for src in trains:
            info = run_info(src)
            rows.append(
                f'<tr><td><a class=train-link href="{esc(links.train(src.id))}">'
                f"{esc(src.id)}</a></td><td>{esc(info['scenario'])}</td>"
                f"<td>{esc(info['date'])}</td><td>{esc(info['episodes'])}</td>"
                f"<td>{esc(info['headline'])}</td></tr>"
            )
        parts.append(
            "<table id=trains><tr><th>run</th><th>scenario</th><th>updated</th>"
            f"<th>episodes</th><th>progress</th></tr>{''.join(rows)}</table>"
        )
    # Folders of runs: tournaments and eval reports, each a list of links to its page.
    kinds = (("league", "Tournaments", links.league), ("eval", "Evaluations", links.eval))
    for kind, title, link in kinds:
        found = [s for s in sources.values() if s.kind == kind]
        if found:
            items = "".join(
                f'<li><a class={kind}-link href="{esc(link(s.id))}">{esc(s.id)}</a></li>'
                for s in found
            )
            parts.append(f"<h2>{title} ({len(found)})</h2><ul id={kind}s>{items}</ul>")
    return page("runs", "".join(parts), links)


def _metrics_html(episodes: Sequence[Mapping[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{esc(r.name)}</td><td class=num>{esc(pm(r.mean, r.ci95))}</td>"
        f"<td class=num>{r.n}</td></tr>"
        for r in metric_table(episodes)
    )
    return (
        f"<table id=metrics><tr><th>metric</th><th>mean ± 95% CI</th><th>n</th></tr>{rows}</table>"
    )


def run_page(src: Source, links: Links) -> str:
    eps = episode_rows(src.file("transcripts.jsonl"))
    summary = read_json(src.file("summary.json"))
    info = run_info(src)
    ok = sum(1 for e in eps if e.get("status") == "ok")
    parts = [
        f"<p class=meta>scenario <b>{esc(info['scenario'])}</b> · agents {esc(info['agents'])}"
        f" · {esc(info['date'])} · {len(eps)} episodes ({ok} ok, {len(eps) - ok} failed)</p>",
        f'<p><a id=episodes-link href="{esc(links.episodes(src.id))}">all episodes</a>',
    ]
    if not links.static:
        parts.append(
            f' · <a href="{esc(links.episodes(src.id, status="failed"))}">failed episodes</a>'
        )
    parts.append("</p><h2>Metrics</h2>" + _metrics_html(eps))
    ks = pass_k(eps)
    if ks:
        cells = "".join(
            f"<tr><td>pass^{k}</td><td class=num>{num(v)}</td></tr>" for k, v in ks.items()
        )
        parts.append(
            f"<h2>pass^k</h2><table id=passk><tr><th>k</th><th>value</th></tr>{cells}</table>"
        )
    rates = invalid_rates(eps)
    if rates:
        cells = "".join(
            f"<tr><td>{esc(seat)}</td><td class=num>{a}</td><td class=num>{b}</td>"
            f"<td class=num>{num(b / a if a else float('nan'))}</td></tr>"
            for seat, (a, b) in rates.items()
        )
        parts.append(
            "<h2>Invalid moves per seat</h2><table id=invalid><tr><th>seat</th>"
            f"<th>actions</th><th>invalid</th><th>rate</th></tr>{cells}</table>"
        )
    groups = failure_groups(eps)
    parts.append("<h2>Failures</h2>")
    if not groups:
        parts.append("<p>No failed episode.</p>")
    for kind, items in groups.items():
        shown = "".join(
            f'<li><a href="{esc(links.episode(src.id, ep))}">{esc(ep)}</a>: '
            f"{text_html(str(reason))}</li>"
            for ep, reason in items[:20]
        )
        more = f"<li>… {len(items) - 20} more</li>" if len(items) > 20 else ""
        parts.append(
            f"<details class=failure-group open><summary><b>{esc(kind)}</b> — {len(items)} "
            f"episode(s)</summary><ul>{shown}{more}</ul></details>"
        )
    timing = summary.get("timing")
    if isinstance(timing, Mapping):
        items_html = " · ".join(f"{esc(k)} {esc(num(v))}" for k, v in timing.items())
        parts.append(f"<h2>Timing</h2><p>{items_html}</p>")
    return page(f"run {src.id}", "".join(parts), links)


def episodes_page(
    src: Source, links: Links, query: Mapping[str, str], shown: Sequence[Mapping[str, Any]]
) -> str:
    eps = episode_rows(src.file("transcripts.jsonl"))
    seats = sorted({s for e in eps for s in (e.get("agents") or {})})
    metrics = sorted({m for e in eps for m in (e.get("metrics") or {})})
    kinds = sorted({failure_kind(str(e.get("failed", ""))) for e in eps if e.get("failed")})
    parts = [f'<p><a href="{esc(links.run(src.id))}">← run {esc(src.id)}</a></p>']
    if not links.static:
        parts.append(_filter_form(src, query, seats, metrics, kinds))
    head = "".join(f"<th>{esc(m)}</th>" for m in metrics)
    rhead = "".join(f"<th>return {esc(s)}</th>" for s in seats)
    rows = []
    for ep in shown[:2000]:
        eid = str(ep.get("episode", ""))
        m = ep.get("metrics") or {}
        r = ep.get("returns") or {}
        cls = "failed" if ep.get("status") == "failed" else "ok"
        rows.append(
            f"<tr class={cls}><td><a class=episode-link "
            f'href="{esc(links.episode(src.id, eid))}">{esc(eid)}</a></td>'
            f"<td>{esc(ep.get('status', ''))}</td><td>{text_html(str(ep.get('failed', '')))}</td>"
            + "".join(f"<td class=num>{num(m.get(k))}</td>" for k in metrics)
            + "".join(f"<td class=num>{num(r.get(s))}</td>" for s in seats)
            + f"<td class=num>{ep['_steps']}</td></tr>"
        )
    more = f"<p>showing 2000 of {len(shown)}</p>" if len(shown) > 2000 else ""
    parts.append(
        f"<p id=count>{len(shown)} of {len(eps)} episodes</p>{more}<table id=episodes>"
        f"<tr><th>episode</th><th>status</th><th>reason</th>{head}{rhead}<th>steps</th></tr>"
        f"{''.join(rows)}</table>"
    )
    return page(f"episodes of {src.id}", "".join(parts), links)


def _select(name: str, value: str, options: Sequence[str], blank: str) -> str:
    opts = [f'<option value="">{esc(blank)}</option>'] + [
        f'<option value="{esc(o)}"{" selected" if o == value else ""}>{esc(o)}</option>'
        for o in options
    ]
    return f"<select name={name}>{''.join(opts)}</select>"


def _input(name: str, query: Mapping[str, str], size: int = 6) -> str:
    return f'<input name={name} size={size} value="{esc(query.get(name, ""))}">'


def _filter_form(
    src: Source,
    query: Mapping[str, str],
    seats: Sequence[str],
    metrics: Sequence[str],
    kinds: Sequence[str],
) -> str:
    checked = " checked" if query.get("invalid") in ("1", "on", "true") else ""
    return (
        f'<form id=filters method=get action="{esc(links_path(src))}" class=filters>'
        f"<label>status {_select('status', query.get('status', ''), ['ok', 'failed'], 'any')}"
        f"</label> <label>reason {_select('reason', query.get('reason', ''), kinds, 'any')}"
        f"</label> <label>seat {_select('seat', query.get('seat', ''), seats, 'any')}</label>"
        f" <label><input type=checkbox name=invalid value=1{checked}> with invalid moves"
        f"</label> <label>metric {_select('metric', query.get('metric', ''), metrics, '—')}"
        f" from {_input('min', query)} to {_input('max', query)}</label> "
        f"<label>return of {_select('return_seat', query.get('return_seat', ''), seats, '—')}"
        f" from {_input('return_min', query)} to {_input('return_max', query)}</label> "
        "<button type=submit>filter</button></form>"
    )


def links_path(src: Source) -> str:
    return Links().episodes(src.id)


def compare_page(a: Source, b: Source, links: Links) -> str:
    ea = episode_rows(a.file("transcripts.jsonl"))
    eb = episode_rows(b.file("transcripts.jsonl"))
    rows = []
    for row in compare_metrics(ea, eb):
        cell_a = pm(row.a.mean, row.a.ci95) if row.a else "-"
        cell_b = pm(row.b.mean, row.b.ci95) if row.b else "-"
        diff = pm(row.diff, row.ci95)
        sig = ""
        if row.a and row.b and row.ci95 == row.ci95 and abs(row.diff) > row.ci95:
            sig = " class=significant"
        rows.append(
            f"<tr{sig}><td>{esc(row.name)}</td><td class=num>{esc(cell_a)}</td>"
            f"<td class=num>{esc(cell_b)}</td><td class=num>{esc(diff)}</td></tr>"
        )
    body = (
        f'<p>A: <a href="{esc(links.run(a.id))}">{esc(a.id)}</a> ({esc(run_info(a)["scenario"])}'
        f') · B: <a href="{esc(links.run(b.id))}">{esc(b.id)}</a> '
        f"({esc(run_info(b)['scenario'])})</p>"
        "<table id=compare><tr><th>metric</th><th>A mean ± 95% CI</th><th>B mean ± 95% CI</th>"
        f"<th>B - A ± 95% CI (Welch)</th></tr>{''.join(rows)}</table>"
        "<p class=note>Bold rows: the difference's 95% interval excludes 0. Means are over ok "
        "episodes; failed episodes are never scored.</p>"
    )
    return page(f"compare {a.id} vs {b.id}", body, links)


def train_page(
    src: Source, links: Links, *, rows: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """The training dashboard. Served, it follows ``/train/ID/events`` (server push);
    exported, the rows are embedded as JSON data (not script) for the same script."""
    data = ""
    if rows is not None:
        summary = read_json(src.file("summary.json"))
        payload = json.dumps(finite({"rows": list(rows), "summary": summary}))
        payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        data = f"<script type=application/json id=train-data>{payload}</script>"
    events = "" if links.static else f"/train/{esc(src.id)}/events"
    body = (
        f'<div id=dashboard data-events="{events}"><p id=status>waiting for metrics…</p>'
        "<div id=stages></div><div id=charts></div></div>" + data
    )
    return page(f"training {src.id}", body, links, scripts=("train.js",))
