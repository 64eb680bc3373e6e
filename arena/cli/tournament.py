"""``parley tournament``: agents play each other over scenarios; cross-play matrix and ratings.

The schedule, resume and statistics live in :mod:`parley.arena.run.league`; this module
parses the command line and prints the tables.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from parley.protocols.errors import ConfigError

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tournament",
        help="play agents against each other over scenarios; cross-play matrix and ratings",
        description="Every pairing of --agents plays every scenario in every seat arrangement "
        "(both sides of asymmetric games), --games-per-pair episodes each, the same deals "
        "for every pairing (one run seed). Writes OUT/league.json and one run folder per "
        "match; started again with the same settings it resumes, skipping finished matches "
        "(and playing again those of an agent changed in place since: a model folder "
        "retrained, an agent's source file edited). "
        "`parley view OUT` shows the league page.",
    )
    p.add_argument(
        "--agents",
        required=True,
        help="comma-separated agents, each SPEC or NAME=SPEC (specs as in parley run: "
        "scripted, module:Class, llm:PATH, ...)",
    )
    p.add_argument(
        "--scenarios",
        required=True,
        help="comma-separated scenario ids (registered ones, openspiel:GAME, textarena:ID)",
    )
    p.add_argument("--games-per-pair", type=int, default=10, help="episodes per match")
    p.add_argument("--seed", type=int, default=0, help="run seed of every match")
    p.add_argument(
        "--schedule",
        choices=["round-robin", "swiss"],
        default="round-robin",
        help="round-robin: every pair; swiss: --rounds rounds of close-standing pairs",
    )
    p.add_argument("--rounds", type=int, default=0, help="swiss rounds (0: log2(agents) + 1)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes at once in a match")
    p.add_argument("--ray", default=None, help="play matches on Ray: local, auto or an address")
    p.add_argument(
        "--act-timeout",
        type=float,
        default=60.0,
        help="seconds an agent has to answer; past it, it forfeits the game (default 60)",
    )
    p.add_argument("--out", required=True, help="league folder (resumed when it exists)")
    p.add_argument("--json", action="store_true", help="print league.json instead of tables")
    p.set_defaults(func=run)


def parse_agent_list(text: str) -> dict[str, str]:
    """``"a=scripted,module:Bot"`` -> ``{"a": "scripted", "module:Bot": "module:Bot"}``."""
    agents: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, spec = item.partition("=")
        name, spec = (name.strip(), spec.strip()) if sep else (item, item)
        if not name or not spec:
            raise ConfigError(f"--agents item {item!r} must be SPEC or NAME=SPEC")
        if name in agents:
            raise ConfigError(f"--agents names {name!r} twice; give each a distinct NAME=SPEC")
        agents[name] = spec
    return agents


def run(args: argparse.Namespace) -> int:
    from parley.arena.cli.common import check_agent_spec, check_out_dir, console
    from parley.arena.run.league import LeagueConfig, play_league

    agents = {name: check_agent_spec(spec) for name, spec in parse_agent_list(args.agents).items()}
    config = LeagueConfig(
        agents=agents,
        scenarios=[s.strip() for s in args.scenarios.split(",") if s.strip()],
        out=str(check_out_dir(args.out)),
        games_per_pair=args.games_per_pair,
        seed=args.seed,
        schedule=args.schedule,
        rounds=args.rounds,
        concurrency=args.concurrency,
        ray=args.ray,
        act_timeout=args.act_timeout,
    )
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    err = console(stderr=True)
    columns = ("games", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("games", total=None)
        league = play_league(
            config,
            log=lambda line: bar.console.print(line, style=_style(line), markup=False),
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    if args.json:
        print(json.dumps(league, sort_keys=True))
        return 0
    out = console()
    for table in tables(league):
        out.print(table)
    out.print(f"league.json and match runs in {config.out}; `parley view {config.out}`")
    return 0


def _style(line: str) -> str:
    """Progress lines dim; an agent changed in place (its matches played again) stands out."""
    return "yellow" if line.startswith("agent ") else "dim"


def tables(league: dict[str, Any]) -> list[Any]:
    """The rating ladder, the cross-play matrix and the per-scenario table (rich Tables)."""
    from rich.table import Table

    ladder = Table(title="ratings (Bradley-Terry, Elo scale, 95% bootstrap interval)")
    skill = {row["agent"]: row for row in league.get("openskill") or []}
    columns = ["rank", "agent", "rating", "interval", "games"]
    columns += ["openskill mu +- 2 sigma"] if skill else []
    for column in columns:
        ladder.add_column(column, justify="right" if column != "agent" else "left")
    for rank, row in enumerate(league["ratings"], 1):
        ci = row["ci"]
        shown = f"{ci[0]:.0f} .. {ci[1]:.0f}" if ci else "-"
        rating = f"{row['rating']:.0f}" if row["rating"] is not None else "-"
        cells = [str(rank), row["agent"], rating, shown, str(row["games"])]
        if skill:
            found = skill[row["agent"]]
            cells.append(f"{found['mu']:.1f} +- {2 * found['sigma']:.1f}")
        ladder.add_row(*cells)
    names = league["agents"]
    matrix = Table(title="cross-play: row's win rate against column (draws half), 95% interval")
    matrix.add_column("")
    for name in names:
        matrix.add_column(name, justify="center")
    for a in names:
        cells = []
        for b in names:
            cell = league["matrix"][a].get(b)
            if cell is None or cell["win_rate"] is None:
                cells.append("-")
            else:
                low, high = cell["ci"]
                cells.append(f"{cell['win_rate']:.2f} [{low:.2f},{high:.2f}] n={cell['games']}")
        matrix.add_row(a, *cells)
    scenarios = Table(
        title="per scenario: mean score (95% interval) of the games not forfeited, win rate",
        caption=_unscored(league.get("unscored") or {}),
    )
    for column in ("scenario", "agent", "games", "mean score", "win rate", "forfeits"):
        scenarios.add_column(column)
    for scenario, rows in league["scenarios"].items():
        for name, row in rows.items():
            ci = f" +- {row['ci']:.3g}" if row["ci"] is not None else ""
            mean = f"{row['mean_score']:.3g}{ci}" if row["mean_score"] is not None else "-"
            scenarios.add_row(
                scenario, name, str(row["games"]), mean, f"{row['win_rate']:.2f}",
                str(row.get("forfeits", 0)),
            )  # fmt: skip
    return [ladder, matrix, scenarios]


def _unscored(counts: dict[str, int]) -> str | None:
    """A caption naming the agents with failed games that no single agent forfeited."""
    listed = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    return f"failed, not scored (not one agent's doing): {listed}" if listed else None
