"""The league page of ``parley view``: a tournament folder (``parley tournament --out``).

It shows the rating ladder with each rating's interval drawn to scale, the cross-play matrix
as a heat map (each cell the row agent's win rate against the column agent, red below 0.5,
green above; the interval in the cell's text), the per-scenario table, and every match with
links down to its run page and each of its episodes (the match folders are ordinary runs).

Charts are inline SVG whose colours and sizes are attributes (the viewer's CSP allows no
inline style); every value read from ``league.json`` is escaped or checked to be a number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parley.arena.view.data import Source, read_json
from parley.arena.view.html import Links, esc, num, page

__all__ = ["league_page"]

_CELL = 64  # heat-map cell size (px)
_LABEL = 120  # room for agent names left of the rows (px)
_TOP = 28  # room for agent names above the columns (px)
_BAR_W = 360  # ladder bar width (px)
EPISODES_SHOWN = 10
"""Games linked per match; the match's run page lists them all (a league of 8 agents x 4
games x 100 games a pair has 22,400: linking each made a 3 MB page that took seconds)."""


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _colour(rate: float) -> str:
    """Red (0) through white (0.5) to green (1)."""
    rate = min(1.0, max(0.0, rate))
    if rate < 0.5:
        fade = int(255 * rate * 2)
        return f"rgb(230,{fade},{fade})"
    fade = int(255 * (1 - rate) * 2)
    return f"rgb({fade},200,{fade})"


def _heat_map(names: list[str], matrix: Mapping[str, Any]) -> str:
    width, height = _LABEL + _CELL * len(names), _TOP + _CELL * len(names)
    parts = [f'<svg id=league-matrix width="{width}" height="{height}" role=img>']
    for k, name in enumerate(names):
        x = _LABEL + _CELL * k + _CELL // 2
        parts.append(f'<text x="{x}" y="{_TOP - 8}" text-anchor=middle>{esc(name[:14])}</text>')
        y = _TOP + _CELL * k + _CELL // 2 + 4
        parts.append(f'<text x="{_LABEL - 6}" y="{y}" text-anchor=end>{esc(name[:14])}</text>')
    for i, a in enumerate(names):
        row = matrix.get(a) if isinstance(matrix.get(a), Mapping) else {}
        for j, b in enumerate(names):
            found = row.get(b) if isinstance(row, Mapping) else None
            cell: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
            rate: Any = cell.get("win_rate")
            ci = cell.get("ci")
            x, y = _LABEL + _CELL * j, _TOP + _CELL * i
            fill = _colour(float(rate)) if _real(rate) else "rgb(235,235,235)"
            tip = f"{a} vs {b}"
            if _real(rate) and isinstance(ci, list) and len(ci) == 2 and all(map(_real, ci)):
                tip += f": {rate:.2f} [{ci[0]:.2f}, {ci[1]:.2f}], {cell.get('games')} games"
            parts.append(
                f'<rect x="{x}" y="{y}" width="{_CELL - 2}" height="{_CELL - 2}" fill="{fill}">'
                f"<title>{esc(tip)}</title></rect>"
            )
            if _real(rate):
                parts.append(
                    f'<text x="{x + _CELL // 2}" y="{y + _CELL // 2 + 4}" '
                    f"text-anchor=middle>{rate:.2f}</text>"
                )
    parts.append("</svg>")
    return "".join(parts)


def _ladder(ratings: list[Any], skill: list[Any]) -> str:
    rows = [r for r in ratings if isinstance(r, Mapping) and _real(r.get("rating"))]
    bounds = [v for r in rows for v in (r.get("ci") or []) if _real(v)]
    low, high = (min(bounds), max(bounds)) if bounds else (0.0, 1.0)
    span = (high - low) or 1.0

    def at(value: float) -> float:
        return 8 + (_BAR_W - 16) * (value - low) / span

    by_agent = {r.get("agent"): r for r in skill if isinstance(r, Mapping)}
    out = ["<table id=league-ladder><tr><th>rank</th><th>agent</th><th>rating</th>"
           "<th>95% interval</th><th>games</th><th></th><th>openskill mu &pm; 2&sigma;</th>"
           "</tr>"]  # fmt: skip
    for rank, row in enumerate(rows, 1):
        ci = row.get("ci")
        bar = ""
        if isinstance(ci, list) and len(ci) == 2 and all(map(_real, ci)):
            x0, x1, mid = at(ci[0]), at(ci[1]), at(row["rating"])
            bar = (
                f'<svg width="{_BAR_W}" height=16 role=img><line x1="{x0:.1f}" x2="{x1:.1f}" '
                f'y1=8 y2=8 stroke="rgb(60,90,160)" stroke-width=4></line>'
                f'<circle cx="{mid:.1f}" cy=8 r=5 fill="rgb(20,40,90)"></circle></svg>'
            )
            shown = f"{ci[0]:.0f} .. {ci[1]:.0f}"
        else:
            shown = "-"
        found = by_agent.get(row.get("agent")) or {}
        mu: Any = found.get("mu")
        sigma: Any = found.get("sigma")
        weng_lin = f"{mu:.1f} &pm; {2 * sigma:.1f}" if _real(mu) and _real(sigma) else "-"
        out.append(
            f"<tr><td>{rank}</td><td>{esc(row.get('agent'))}</td><td>{row['rating']:.0f}</td>"
            f"<td>{esc(shown)}</td><td>{esc(row.get('games'))}</td><td>{bar}</td>"
            f"<td>{weng_lin}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _scenarios(per_scenario: Mapping[str, Any]) -> str:
    out = ["<table id=league-scenarios><tr><th>scenario</th><th>agent</th><th>games</th>"
           "<th>mean score</th><th>95% +-</th><th>win rate</th><th>forfeits</th></tr>"]  # fmt: skip
    for scenario, rows in per_scenario.items():
        for name, row in rows.items() if isinstance(rows, Mapping) else []:
            if not isinstance(row, Mapping):
                continue
            out.append(
                f"<tr><td>{esc(scenario)}</td><td>{esc(name)}</td><td>{esc(row.get('games'))}"
                f"</td><td>{num(row.get('mean_score'))}</td><td>{num(row.get('ci'))}</td>"
                f"<td>{num(row.get('win_rate'), 2)}</td><td>{esc(row.get('forfeits', 0))}</td></tr>"
            )
    out.append("</table>")
    return "".join(out)


def _matches(src: Source, games: list[Any], sources: Mapping[str, Source], links: Links) -> str:
    """Every match with its first :data:`EPISODES_SHOWN` games, linked to the match's run page
    (which lists them all) and to those episodes' pages."""
    by_path = {s.path.resolve(): s for s in sources.values() if s.kind == "run"}
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for game in games:
        if isinstance(game, Mapping) and isinstance(game.get("run"), str):
            grouped.setdefault(game["run"], []).append(game)
    out = ["<h2>Matches</h2><table id=league-matches><tr><th>match</th><th>agents</th>"
           "<th>scenario</th><th>games (score of each agent)</th></tr>"]  # fmt: skip
    for run, rows in grouped.items():
        found = by_path.get((src.path / run).resolve())
        agents = rows[0].get("agents") or []
        name = esc(Path(run).name)
        title = f'<a href="{esc(links.run(found.id))}">{name}</a>' if found else name
        cells = []
        for game in rows[:EPISODES_SHOWN]:
            scores = game.get("scores") or []
            forfeit = game.get("forfeit")
            label = (
                f"forfeited by {esc(forfeit)}"
                if forfeit
                else " : ".join(num(s, 2) for s in scores) or "-"
            )
            episode = str(game.get("episode", ""))
            if found is not None:
                href = esc(links.episode(found.id, episode))
                cells.append(f'<a class=league-episode href="{href}">{esc(episode)} {label}</a>')
            else:
                cells.append(f"{esc(episode)} {label}")
        if len(rows) > EPISODES_SHOWN:
            more = f"{len(rows) - EPISODES_SHOWN} more"
            cells.append(f'<a href="{esc(links.run(found.id))}">{more}</a>' if found else more)
        out.append(
            f"<tr><td>{title}</td><td>{esc(' vs '.join(map(str, agents)))}</td>"
            f"<td>{esc(rows[0].get('scenario'))}</td><td>{', '.join(cells)}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _of(league: Mapping[str, Any], key: str, kind: type) -> Any:
    """``league[key]`` when it is a ``kind``, else an empty one (a hand-edited file)."""
    value = league.get(key)
    return value if isinstance(value, kind) else kind()


def league_page(src: Source, sources: Mapping[str, Source], links: Links) -> str:
    """The page of league folder ``src`` (``league.json``); match runs are found in
    ``sources`` by their folder."""
    league = read_json(src.file("league.json"))
    names = [str(n) for n in league.get("agents") or []][:50]
    matrix = _of(league, "matrix", dict)
    ratings = _of(league, "ratings", list)
    scenarios = _of(league, "scenarios", dict)
    games = _of(league, "games", list)
    body = [
        "<h2>Ratings</h2><p>Bradley-Terry on the Elo scale; bars: 95% bootstrap interval; "
        "openskill: Weng-Lin ratings updated game by game.</p>",
        _ladder(ratings, _of(league, "openskill", list)),
        "<h2>Cross-play</h2><p>Row agent's win rate against the column agent (draws count "
        "half); hover a cell for its interval and games.</p>",
        _heat_map(names, matrix),
        "<h2>Per scenario</h2>",
        _scenarios(scenarios),
        _matches(src, games, sources, links),
    ]
    return page(f"league {src.id}", "".join(body), links)
