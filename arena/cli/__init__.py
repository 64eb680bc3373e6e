"""The ``parley`` command line (also ``python -m parley.arena.cli``).

Each subcommand lives in its own module of this folder (``list``, ``bench``, ``model``,
``run``, ``agent``, ``keys``, ``train``, ``serve``, ``view``, ``demo``) and exposes
``add_parser(subparsers)``
(which sets ``func`` on its parser) — so adding a command is one module and one line in
:data:`COMMANDS`, and ``parley --help`` imports nothing heavy: each command imports its parts
inside the command. :mod:`~parley.arena.cli.demo` and :mod:`~parley.arena.cli.demo_train` are
``parley demo`` (``make demo``): the training demo, then the LLM-vs-scripted arena.

May import everything in ``parley``; nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser", "COMMANDS"]

COMMANDS: tuple[str, ...] = (
    "list",
    "bench",
    "model",
    "run",
    "agent",
    "keys",
    "train",
    "serve",
    "view",
    "demo",
)
"""Modules of ``parley.arena.cli``, in the order ``parley --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="parley",
        description="A multi-agent gym for LLMs: run scenario arenas, plug in agents, "
        "train cooperative policies.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"parley.arena.cli.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``parley`` console script; returns the exit status."""
    # Hugging Face download/shard/weight-loading bars would interleave with ours (set it
    # to 0 to see them).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a user's error is one line and a status, not a traceback
        from parley.arena.cli.common import error_line, user_error_status

        known = user_error_status(exc)
        if known is None or os.environ.get("PARLEY_DEBUG"):
            raise
        error_line(args.command, known[1])
        return int(known[0])
    return int(status or 0)
