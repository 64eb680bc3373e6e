"""``parley train-rm --data prefs.jsonl --model DIR --out DIR``: train a reward model.

The model is a one-label sequence classifier on the causal LM checkpoint ``--model``,
trained by the Bradley-Terry loss on the preference pairs of ``--data`` (TRL's preference
rows, ``{prompt, chosen, rejected}``; ties skipped) and saved in ``--out`` as TRL's
RewardTrainer saves one (:mod:`parley.arena.training.reward_model`). With ``--export dpo``
or ``--export rm`` it trains nothing and writes ``--data`` to the file ``--out`` as a TRL
DPOTrainer or RewardTrainer dataset instead.

Exit status: 0 on success, 2 on bad input (command line, data rows, settings), 1 on
another error."""

from __future__ import annotations

import argparse
from typing import Any

_HELP = "train a reward model from pairwise preferences; export them for TRL"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("train-rm", help=_HELP, description=__doc__.split("\n\n")[1])
    parser.add_argument(
        "--data", required=True, action="append", metavar="JSONL",
        help="preferences.jsonl rows {prompt, chosen, rejected} (repeat to train on several)",
    )  # fmt: skip
    parser.add_argument(
        "--model", metavar="DIR", help="the causal LM checkpoint the reward model starts from"
    )
    parser.add_argument(
        "--out", required=True, help="the reward model's directory (with --export: the file)"
    )
    parser.add_argument(
        "--export", choices=("dpo", "rm"), help="write a TRL DPO / RewardTrainer dataset instead"
    )
    parser.add_argument("--epochs", type=int, default=3, help="passes over the pairs")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per optimiser step")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    parser.add_argument("--max-length", type=int, default=512, help="most tokens of a text")
    parser.add_argument(
        "--padding-penalty", type=float, default=1.0,
        help="weight of the term that keeps padded replies from scoring higher (0: off)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seeds the head and the pair order")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parley.arena.cli import common
    from parley.arena.training.reward_model import (
        RewardModelConfig,
        export_preferences,
        read_preferences,
        train_reward_model,
    )
    from parley.protocols.errors import ConfigError

    rows = [row for path in args.data for row in _read(read_preferences, path)]
    console = common.console()
    if args.export:
        written = export_preferences(rows, args.out, args.export)
        console.print(f"{written} rows of {len(rows)} written to {args.out} ({args.export})")
        return 0
    if not args.model:
        raise ConfigError("train-rm needs --model DIR (the checkpoint to start from)")
    config = RewardModelConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        max_length=args.max_length,
        padding_penalty=args.padding_penalty,
        seed=args.seed,
        device=args.device,
    )
    out = common.check_out_dir(args.out)
    with console.status(f"training a reward model on {len(rows)} rows"):
        report = train_reward_model(rows, args.model, out, config)
    console.print(
        f"reward model saved to {out}: {report.pairs} pairs ({report.ties} ties skipped), "
        f"{report.steps} steps, loss {report.first_loss:.3f} -> {report.last_loss:.3f}, "
        f"train accuracy {report.train_accuracy:.2f}, length bias {report.length_bias:+.2f}"
    )
    if abs(report.length_bias) > 0.5:
        console.print(
            "warning: chosen and rejected differ in length in most pairs; the model may "
            "reward length itself (rate length-matched pairs to avoid it)"
        )
    return 0


def _read(read: Any, path: str) -> Any:
    """The rows of ``path``, a missing file said as a user error."""
    from parley.protocols.errors import ConfigError

    try:
        return read(path)
    except OSError as exc:
        raise ConfigError(f"cannot read --data {path}: {exc.strerror or exc}") from None
