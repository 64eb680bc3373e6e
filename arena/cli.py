"""The ``parley`` command line.

Each subcommand lives in its own module under ``parley.arena.commands`` and exposes
``add_parser(subparsers)`` (which sets ``func`` on its parser) — so adding a command is
one module and one line in :data:`COMMANDS`, and ``parley --help`` imports nothing heavy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser", "COMMANDS"]

COMMANDS: tuple[str, ...] = ("list", "bench", "model", "run", "agent", "train", "serve", "demo")
"""Modules of ``parley.arena.commands``, in the order ``parley --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="parley",
        description="A multi-agent gym for LLMs: run scenario arenas, plug in agents, "
        "train cooperative policies.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"parley.arena.commands.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``parley`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    raise SystemExit(main())
