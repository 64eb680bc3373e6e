"""``parley keys``: CURVE key pairs for arenas, pools and the agents that join them.

    parley keys new arena agent-listener --dir keys    # keys/arena.key, keys/arena.key_secret, ...
    parley keys show keys/arena.key                    # the public key, as 40 Z85 characters

A ``.key`` file holds a public key and can be handed out; a ``.key_secret`` file holds the
pair and stays with its owner (it is created readable by the owner only). See
:mod:`parley.protocols.keys` for how ``parley run``, ``agent`` and ``serve`` use them.
"""

from __future__ import annotations

import argparse
from typing import Any

from parley.protocols.errors import ConfigError

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "keys",
        help="make CURVE key pairs for authenticated tcp (arena, pool, seats)",
        description="Make and show CURVE key pairs. An arena listening on tcp with "
        "--curve-key admits only the seat keys it is given; each agent joins with its own "
        "secret key and the arena's public key.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="make one key pair per NAME")
    new.add_argument("names", nargs="+", metavar="NAME", help="e.g. arena agent-listener")
    new.add_argument("--dir", default="keys", help="folder for the key files (default: keys)")
    new.set_defaults(func=_new)
    show = actions.add_parser("show", help="print the public key of a key file")
    show.add_argument("file", help="a NAME.key or NAME.key_secret file")
    show.set_defaults(func=_show)


def _new(args: argparse.Namespace) -> int:
    from parley.arena.cli.common import console
    from parley.protocols.keys import load_public_key, make_key_pair

    out, err = console(), console(stderr=True)
    try:
        for name in args.names:
            public, secret = make_key_pair(args.dir, name)
            key = load_public_key(public).decode()
            out.print(f"{name}: public {public} ({key}), secret {secret} (keep it private)")
    except ConfigError as exc:
        err.print(f"[red]parley keys: {exc}[/red]")
        return 2
    return 0


def _show(args: argparse.Namespace) -> int:
    from parley.arena.cli.common import error_line
    from parley.protocols.keys import load_public_key

    try:
        print(load_public_key(args.file).decode())
    except ConfigError as exc:
        error_line("keys", str(exc))
        return 2
    return 0
