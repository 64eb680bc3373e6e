"""``parley list``: every registered scenario (built-in and entry-point ones), one row per game
with its versions, the latest marked (the one an id without ``-vN`` plays)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("list", help="list the registered scenarios")
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    parser.add_argument("--family", default="", help="only this family (e.g. negotiation)")
    parser.add_argument(
        "--all",
        action="store_true",
        help="also the games of installed outside libraries (openspiel:GAME, textarena:ID), "
        "with seats, and those their adapters cannot play, with the reason",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parley.scenarios import ScenarioSpec, registry

    specs = [s for s in registry().values() if not args.family or s.family == args.family]
    games: dict[str, list[ScenarioSpec]] = {}
    for found in specs:
        games.setdefault(found.game, []).append(found)
    for versions in games.values():
        versions.sort(key=lambda s: s.version, reverse=True)  # latest first
    if args.json:
        for versions in games.values():
            for found in versions:
                row = {
                    "id": found.id,
                    "game": found.game,
                    "latest": found is versions[0],
                    "entry_point": found.entry_point,
                    "kwargs": dict(found.kwargs),
                    "baselines": dict(found.baselines),
                    "description": found.description,
                }
                print(json.dumps(row, sort_keys=True))
        return 0

    from rich.table import Table

    from parley.arena.cli.common import console

    table = Table(
        title=f"parley scenarios ({len(games)} games, {len(specs)} versions)",
        caption="an id without -vN plays the latest version (marked *); pin -vN to reproduce",
    )
    table.add_column("game", style="bold", no_wrap=True)
    table.add_column("versions", no_wrap=True)
    table.add_column("seats -> baseline")
    table.add_column("description (latest)")
    for game, versions in games.items():
        latest = versions[0]
        marks = " ".join(f"v{s.version}" + ("*" if s is latest else "") for s in versions)
        seats = "\n".join(
            f"{seat} -> {ref.rsplit(':', 1)[-1]}" for seat, ref in latest.baselines.items()
        )
        table.add_row(game, marks, seats, latest.description)
    console().print(table)
    if args.all:
        _print_imported(args.family)
    return 0


def _print_imported(family: str) -> None:
    """The games of outside libraries (``--all``): accepted ones, then refused ones."""
    from rich.table import Table

    from parley.arena.cli.common import console
    from parley.scenarios.imported import PREFIXES, catalog

    prefixes = tuple(p for p in PREFIXES if not family or p == family)
    entries = catalog(prefixes)
    accepted = [e for e in entries if e.accepted]
    table = Table(title=f"games of outside libraries ({len(accepted)} playable)")
    for column in ("id", "seats", "description"):
        table.add_column(column, no_wrap=column == "id")
    for entry in accepted:
        table.add_row(entry.id, ", ".join(entry.seats), entry.description)
    console().print(table)
    refused = Table(title=f"not playable as parley scenarios ({len(entries) - len(accepted)})")
    refused.add_column("id", no_wrap=True)
    refused.add_column("reason")
    for entry in entries:
        if not entry.accepted:
            refused.add_row(entry.id, entry.reason)
    console().print(refused)
