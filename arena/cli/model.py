"""``parley model tiny DIR``: build the tiny test/demo model in Hugging Face format."""

from __future__ import annotations

import argparse
import time
from typing import Any


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("model", help="build models parley needs (the tiny test model)")
    kinds = parser.add_subparsers(dest="model_kind", metavar="KIND", required=True)
    tiny = kinds.add_parser(
        "tiny",
        help="train a byte-level BPE tokenizer and save a random small Llama into DIR",
    )
    tiny.add_argument("directory", metavar="DIR", help="output directory (created if needed)")
    tiny.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    tiny.add_argument("--vocab-size", type=int, default=1024, help="BPE vocabulary size")
    tiny.add_argument("--hidden-size", type=int, default=128, help="residual width")
    tiny.add_argument("--layers", type=int, default=2, help="transformer blocks")
    tiny.add_argument("--heads", type=int, default=4, help="attention heads (head size >= 32)")
    tiny.set_defaults(func=_run_tiny)


def _run_tiny(args: argparse.Namespace) -> int:

    from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(
        seed=args.seed,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=min(2, args.heads) if args.heads % 2 == 0 else args.heads,
    )
    from parley.arena.cli.common import console as make_console

    console = make_console(stderr=True)
    start = time.perf_counter()
    with console.status(f"building the tiny model into {args.directory}"):
        out = build_tiny_model(args.directory, config)
    console.print(f"tiny model saved to {out} in {time.perf_counter() - start:.1f} s")
    return 0
