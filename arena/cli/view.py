"""``parley view RUN_DIR... [--port N] [--export DIR] [--rate [--seat S] [--rater NAME]...]``:
look at runs in the browser, or rate pairs of episodes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "view",
        help="browse runs, episodes and live training curves in a web page",
        description="Serve a web viewer over the run folders under RUN_DIR (parley run "
        "and parley train outputs, found up to 4 levels down): runs, metrics with 95%% "
        "CIs, failures, episodes with filters, one episode's timeline, two runs compared, "
        "training curves updated live. Binds 127.0.0.1 unless --host says otherwise.",
    )
    parser.add_argument("dirs", nargs="+", metavar="RUN_DIR", help="run folders to show")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; anything else exposes the runs to the network)",
    )
    parser.add_argument("--export", metavar="DIR", help="write static HTML pages to DIR and exit")
    parser.add_argument(
        "--rate",
        action="store_true",
        help="rate mode: pick the better of two episodes of one scenario and seed; ratings "
        "go to preferences.jsonl in the first RUN_DIR (prompt/chosen/rejected for TRL)",
    )
    parser.add_argument(
        "--seat",
        metavar="S",
        help="with --rate: compare what seat S saw and did (default: every seat's moves)",
    )
    parser.add_argument(
        "--rater",
        action="append",
        metavar="NAME",
        help="with --rate: a rater's name, each printed with its own page and token "
        "(repeatable; default: your login name)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parley.arena.view.server import export_static, serve

    roots = [Path(d) for d in args.dirs]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        print(f"parley view: not a folder: {', '.join(missing)}")
        return 2
    if (args.seat or args.rater) and not args.rate:
        print("parley view: --seat and --rater go with --rate")
        return 2
    if args.rate and args.export:
        print("parley view: --rate needs the server: leave out --export")
        return 2
    if args.export:
        written = export_static(roots, Path(args.export))
        print(
            f"wrote {len(written)} pages to {args.export} (open {Path(args.export) / 'index.html'})"
        )
        return 0
    rating = None
    if args.rate:
        from parley.arena.view.rate import Rating

        rating = Rating(roots[0], raters=args.rater or [_login()], seat=args.seat)
    serve(roots, host=args.host, port=args.port, rating=rating)
    return 0


def _login() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):  # (no login name in a bare container)
        return "rater"
