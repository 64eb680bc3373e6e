"""``parley eval SUITE --agents SPEC``: play a named benchmark suite; ``--compare A B``.

The suites, the resume rule, the report and the Welch comparison live in
:mod:`parley.arena.run.suites`; this module parses the command line and prints tables.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from parley.protocols.errors import ConfigError

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="play a named, versioned benchmark suite; compare two reports",
        description="Play every entry of SUITE (pinned scenario versions, seeds, episode "
        "counts; `--list` shows them) with --agents, one run folder per entry under --out, "
        "then write OUT/report.json and OUT/report.md (mean ± 95%% CI per metric, pass^k). "
        "Started again with the same suite and agents it resumes, skipping finished "
        "entries. `--compare A B` prints B - A per metric with 95%% Welch intervals.",
    )
    p.add_argument("suite", nargs="?", help="suite name, e.g. all-v1 (see --list)")
    p.add_argument(
        "--agents",
        default="scripted",
        help="one agent spec for every seat (scripted, llm:PATH, module:Class, ...), or "
        "seat=spec items: named seats play that spec, the others their scripted baseline",
    )
    p.add_argument("--out", help="report folder (default: runs/eval-SUITE)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes at once in a run")
    p.add_argument("--pool", help="bus address of an inference pool for llm: agents")
    p.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), help="two report.json files (or folders)"
    )
    p.add_argument("--list", action="store_true", help="list the suites and their entries")
    p.add_argument("--no-progress", action="store_true", help="no progress bar per run")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=main)


def parse_eval_agents(text: str) -> str | dict[str, str]:
    """``"llm:m"`` -> ``"llm:m"``; ``"speaker=llm:m,coder=scripted"`` -> a seat mapping.
    Several specs in seat order are refused: suites mix scenarios of different seats."""
    from parley.arena.cli.run import parse_agents

    parsed = parse_agents(text)
    if parsed is None:
        raise ConfigError("--agents is empty: give a spec such as scripted or llm:PATH")
    if isinstance(parsed, list):
        if len(parsed) != 1:
            raise ConfigError(
                "--agents: give one spec for every seat, or seat=spec items (a list in seat "
                "order cannot fit every scenario of a suite)"
            )
        return parsed[0]
    return parsed


def main(args: argparse.Namespace) -> int:
    """Exit status 0, or 2 on a bad suite, agents or report (one line on stderr)."""
    from parley.arena.cli.common import error_line

    try:
        return _main(args)
    except ConfigError as exc:
        error_line("eval", str(exc))
        return 2


def _main(args: argparse.Namespace) -> int:
    from parley.arena.cli.common import check_agent_spec, check_out_dir, console, load_agent_kinds
    from parley.arena.run import suites

    if args.list:
        return _list(args.json)
    if args.compare:
        rows = suites.compare_reports(*(suites.load_report(p) for p in args.compare))
        if args.json:
            print(json.dumps(rows))
        else:
            console().print(_compare_table(rows, args.compare))
        return 0
    if not args.suite:
        raise ConfigError("give a SUITE (parley eval --list), or --compare A B")
    suite = suites.get_suite(args.suite)
    load_agent_kinds()
    agents = parse_eval_agents(args.agents)
    if isinstance(agents, str):
        agents = check_agent_spec(agents)
    else:
        agents = {seat: check_agent_spec(spec) for seat, spec in agents.items()}
    out = check_out_dir(args.out or f"runs/eval-{suite.name}")
    err = console(stderr=True)
    report = suites.run_suite(
        suite,
        agents,
        out,
        concurrency=args.concurrency,
        agent_options={"pool": args.pool} if args.pool else None,
        progress=not args.no_progress,
        log=lambda line: err.print(line, markup=False, highlight=False),
    )
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    console().print(suites.report_markdown(report), markup=False, highlight=False)
    err.print(f"wrote {out}/report.json and report.md", markup=False, highlight=False)
    return 0


def _list(as_json: bool) -> int:
    from parley.arena.cli.common import console
    from parley.arena.run.suites import SUITES, suite_digest

    if as_json:
        for suite in SUITES.values():
            print(json.dumps({**suite.canonical(), "digest": suite_digest(suite)}))
        return 0
    from rich.table import Table

    table = Table(title="parley eval suites (a change is a new version)")
    for column in ("suite", "entries: scenario episodes x trials (seed)", "digest"):
        table.add_column(column)
    for suite in SUITES.values():
        entries = "\n".join(
            f"{e.scenario} {e.episodes}x{e.trials} ({e.seed})" for e in suite.entries
        )
        table.add_row(f"{suite.name}\n{suite.description}", entries, suite_digest(suite)[:12])
    console().print(table)
    return 0


def _compare_table(rows: list[dict[str, Any]], names: list[str]) -> Any:
    from rich.table import Table

    a, b = names
    table = Table(title=f"B - A per metric, 95% Welch interval (A: {a}, B: {b})")
    for column in ("scenario", "metric", "A", "B", "B - A", "95% interval"):
        table.add_column(column, justify="left" if column in ("scenario", "metric") else "right")
    for row in rows:
        ci = "—" if row["ci"] is None else f"[{row['ci'][0]:+.3f}, {row['ci'][1]:+.3f}]"
        table.add_row(
            row["scenario"], row["metric"], f"{row['a']:.3f}", f"{row['b']:.3f}",
            f"{row['diff']:+.3f}", ci,
        )  # fmt: skip
    return table
