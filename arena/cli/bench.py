"""``parley bench KIND``: our path beside the reference path, in one run, as ratios."""

from __future__ import annotations

import importlib
from typing import Any

BENCHES: dict[str, str] = {
    "bus": "parley.arena.bench.bus",
    "pool": "parley.arena.bench.pool",
    "env": "parley.arena.bench.env",
    "games": "parley.arena.bench.games",
    "sandbox": "parley.arena.bench.sandbox",
    "sampler": "parley.arena.bench.sampler",
    "ray": "parley.arena.bench.ray_scale",
    "routing": "parley.arena.bench.routing",
    "llm-episodes": "parley.arena.bench.llm_episodes",
    "env-server": "parley.arena.integrations.bench",
}
"""Benchmark name -> module exposing ``add_arguments(parser)`` and ``run(args) -> int``."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("bench", help="measure parley beside its reference path")
    kinds = parser.add_subparsers(dest="bench", metavar="KIND", required=True)
    for name, module_name in BENCHES.items():
        module = importlib.import_module(module_name)
        p = kinds.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--json", action="store_true", help="print one JSON object")
        module.add_arguments(p)
        p.set_defaults(func=module.run)
