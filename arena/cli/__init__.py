"""The ``parley`` command line (also ``python -m parley.arena.cli``).

Each subcommand lives in its own module of this folder (``list``, ``bench``, ``model``,
``run``, ``tournament``, ``eval``, ``agent``, ``keys``, ``train``, ``train-rm``, ``serve``,
``view``, ``new``, ``demo``) and exposes ``add_parser(subparsers)``
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
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

COMMANDS: tuple[str, ...] = (
    "list",
    "bench",
    "model",
    "run",
    "tournament",
    "eval",
    "exploit",
    "agent",
    "keys",
    "train",
    "train-rm",
    "serve",
    "env-server",
    "view",
    "new",
    "demo",
)
"""Commands, in the order ``parley --help`` lists them; each is the module of
``parley.arena.cli`` of the same name (``-`` spelled ``_``: :func:`command_module`)."""

SUMMARIES: dict[str, str] = {
    "list": "list the registered scenarios",
    "bench": "measure parley beside its reference path",
    "model": "build models parley needs (the tiny test model)",
    "run": "play episodes of a scenario with agents in seats",
    "tournament": "play agents against each other over scenarios; cross-play matrix and ratings",
    "eval": "play a named, versioned benchmark suite; compare two reports",
    "exploit": "train best responses against a frozen policy; its exploitability with a CI",
    "agent": "join a running arena and play a seat",
    "keys": "make CURVE key pairs for authenticated tcp (arena, pool, seats)",
    "train": "train LLM policies on a scenario by RL (staged, async sampling)",
    "train-rm": "train a reward model from pairwise preferences; export them for TRL",
    "serve": "start an inference pool that arenas connect to over the bus (and HTTP)",
    "env-server": "serve a scenario to an outside trainer playing its learner seat (OpenEnv)",
    "view": "browse runs, episodes and live training curves in a web page",
    "new": "write a ready package for a new scenario or agent",
    "demo": "train a speaker-listener team by RL, then play LLM and scripted agents",
}
"""Each command's one-line help, for ``parley --help`` without importing the commands
(``tests/arena/cli/test_conventions.py`` checks they match the modules' own)."""


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends each option's line with its default, when it has a real one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = default not in (None, False, "", [], argparse.SUPPRESS) and action.option_strings
        if shown and "%(default)" not in text and "default" not in text.lower():
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """Every command's parser shows the defaults (:class:`_DefaultsFormatter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version (read only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print parley's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from parley import __version__

        print(f"parley {__version__}")
        parser.exit()


def command_module(command: str) -> str:
    """The module of ``command`` (``env-server`` -> ``parley.arena.cli.env_server``)."""
    return f"parley.arena.cli.{command.replace('-', '_')}"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered; given ``command``, only that
    command's module is imported (the others are listed by their :data:`SUMMARIES`)."""
    parser = argparse.ArgumentParser(
        prog="parley",
        description="A multi-agent gym for LLMs: run scenario arenas, plug in agents, "
        "train cooperative policies.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )
    for name in COMMANDS:
        if command is None or name == command:
            module = importlib.import_module(command_module(name))
            module.add_parser(sub)
        else:
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
    return parser


def _command(argv: Sequence[str]) -> str:
    """The command ``argv`` names (its first word), or ``""`` (``parley --help``)."""
    first = next((arg for arg in argv if not arg.startswith("-")), "")
    return first if first in COMMANDS else ""


def _one_line_notes() -> None:
    """Show the registry's note on an id without a version as one line, not a warning."""
    from parley.scenarios.registry import LatestVersionNote

    show = warnings.showwarning

    def shown(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, LatestVersionNote):
            print(f"note: {message}", file=sys.stderr)
        else:
            show(message, category, *args, **kwargs)

    if getattr(show, "__name__", "") != "shown":  # (main may run many times in one process)
        warnings.showwarning = shown


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``parley`` console script; returns the exit status."""
    # Hugging Face download/shard/weight-loading bars would interleave with ours (set it
    # to 0 to see them).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args_list = sys.argv[1:] if argv is None else [*argv]  # (`list` is a submodule here)
    _one_line_notes()
    parser = build_parser(_command(args_list) or "")
    args = parser.parse_args(args_list)
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
