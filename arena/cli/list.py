"""``parley list``: every registered scenario (built-in and entry-point ones) as a table."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("list", help="list the registered scenarios")
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    parser.add_argument("--family", default="", help="only this family (e.g. negotiation)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parley.scenarios import registry

    specs = [s for s in registry().values() if not args.family or s.family == args.family]
    if args.json:
        for found in specs:
            row = {
                "id": found.id,
                "entry_point": found.entry_point,
                "kwargs": dict(found.kwargs),
                "baselines": dict(found.baselines),
                "description": found.description,
            }
            print(json.dumps(row, sort_keys=True))
        return 0

    from rich.table import Table

    from parley.arena.cli.common import console

    table = Table(title=f"parley scenarios ({len(specs)})")
    table.add_column("id", style="bold", no_wrap=True)
    table.add_column("seats -> baseline")
    table.add_column("description")
    for found in specs:
        seats = "\n".join(
            f"{seat} -> {ref.rsplit(':', 1)[-1]}" for seat, ref in found.baselines.items()
        )
        table.add_row(found.id, seats, found.description)
    console().print(table)
    return 0
