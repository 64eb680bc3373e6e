"""``parley train --config train.yaml [key.sub=value ...]``: multi-agent RL on a scenario.

Exit status: 0 when every stage with a ``target`` reached it; 3
(:data:`~parley.arena.training.loop.SHORT_OF_TARGET`) when the run finished but a stage's
last attempt ended at ``max_updates`` below its target (named in the last line and in
``summary.json``'s ``short_of_target``; the checkpoints are written all the same); 1 on
an error, 2 on a bad command line."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "train",
        help="train LLM policies on a scenario by RL (staged, async sampling)",
        description="Train LLM policies by policy gradient. The YAML config maps onto "
        "parley.arena.training.loop.TrainConfig; KEY=VALUE overrides (YAML values, dotted "
        "keys, list indices) apply on top, e.g. pg.lr=3e-3 stages.0.max_updates=20. "
        "Exit status 3: the run finished but a stage ended short of its target.",
    )
    parser.add_argument("--config", required=True, help="training config (YAML)")
    parser.add_argument("--out", help="output directory (overrides the config's out)")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="play the episodes on Ray worker actors: a Ray address (auto, HOST:6379) or, "
        "without one, a local Ray (needs pip install 'parley[ray]')",
    )
    parser.add_argument(
        "--ray-workers", type=int, metavar="N", help="Ray worker actors (default: one per CPU)"
    )
    parser.add_argument(
        "--trainer-actor",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --ray: the trainer and its pool in a Ray actor of their own, on a GPU "
        "when device asks for one (default: exactly then, if the cluster has a GPU)",
    )
    parser.add_argument(
        "--pool-replicas",
        type=int,
        metavar="N",
        help="with --ray: the workers' LLM seats on N inference pool replicas (Ray actors, "
        "one front; every weight update reaches each of them)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from parley.arena.cli import common
    from parley.arena.training.config import TrainConfig
    from parley.arena.training.loop import SHORT_OF_TARGET, load_train_config, train
    from parley.protocols.errors import ConfigError

    overrides = list(args.overrides)
    if args.out:
        overrides.append(f"out={args.out}")
    if args.ray is not None:
        overrides.append(f"ray={args.ray}")
    if args.ray_workers is not None:
        overrides.append(f"ray_workers={args.ray_workers}")
    if args.pool_replicas is not None:
        overrides.append(f"ray_pool_replicas={args.pool_replicas}")
    if args.trainer_actor is not None:
        overrides.append(f"ray_trainer_actor={str(args.trainer_actor).lower()}")
    try:
        config = load_train_config(args.config, _checked(args.config, overrides))
    except ConfigError as exc:
        raise ConfigError(f"{exc}{common.valid_keys_hint(str(exc), TrainConfig)}") from None
    result = train(config)
    table = Table(title=f"{config.scenario}: training ({result.wall_s:.0f} s)")
    columns = (
        *("stage", "updates", "episodes", "first", "last", "target"),
        *("failed", "stale dropped", "wall s"),
    )
    for column in columns:
        table.add_column(column, justify="right" if column != "stage" else "left")
    for s in result.stage_summaries:
        # A restarted stage: one row per attempt, the stalled ones marked.
        attempt = f" (attempt {s['attempt'] + 1}{', stalled' if s.get('stalled') else ''})"
        table.add_row(
            s["stage"] + (attempt if s.get("attempt") or s.get("stalled") else ""),
            str(s["updates"]),
            str(s["episodes"]),
            _num(s["first"]),
            _num(s["last"]),
            _target(s),
            str(s["failed_episodes"]),
            str(s.get("dropped_stale", 0)),
            f"{s['wall_s']:.0f}",
        )
    console = common.console()
    console.print(table)
    for s in result.stage_summaries:  # on Ray: what the stage's workers cost
        if "ray" in s:
            ray = s["ray"]
            console.print(
                f"{s['stage']} on Ray: {ray['workers_started']} workers started, "
                f"{len(ray['workers_lost'])} lost, {ray['retried']['episodes']} episodes retried"
            )
            if "pool_replicas" in ray:
                replicas = ray["pool_replicas"]
                console.print(
                    f"{s['stage']} pool: {replicas['live']} of {replicas['replicas']} replicas "
                    f"live, {replicas['resent']} requests sent again"
                )
    for name, path in result.checkpoints.items():
        console.print(f"checkpoint {name}: {path}  (parley run ... --agents {_spec(path)})")
    console.print(
        f"metrics: {result.out / 'metrics.jsonl'}  plot: {result.out / 'learning_curve.png'}"
    )
    console.print(f"seeds (summary.json): {result.seeds}")
    short = result.short_of_target
    if not short:
        console.print("every stage with a target reached it")
        return 0
    ended = "; ".join(
        f"{s['stage']} at {_num(s['last'])} < {s['target']} after {s['updates']} updates"
        for s in short
    )
    # The last line, to stderr as well: a script or CI log sees it beside the status.
    common.error_line(
        "train", f"short of target: {ended} (exit status {SHORT_OF_TARGET}; summary.json)"
    )
    return SHORT_OF_TARGET


def _spec(checkpoint: Any) -> str:
    """The agent spec that plays ``checkpoint``: ``llm:DIR`` for a whole model,
    ``llm:BASE?adapter=DIR`` for a LoRA adapter (its base named in adapter_config.json)."""
    import json

    config = checkpoint / "adapter_config.json"
    if not config.is_file():
        return f"llm:{checkpoint}"
    base = json.loads(config.read_text()).get("base_model_name_or_path") or "BASE"
    return f"llm:{base}?adapter={checkpoint}"


def _target(stage: dict[str, Any]) -> str:
    """A stage's target and whether it was reached ("-" without one)."""
    if stage.get("target") is None:
        return "-"
    return f"{stage['target']:.3f} {'reached' if stage.get('reached') else 'short'}"


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _checked(path: str, overrides: list[str]) -> list[str]:
    """``overrides``, once the config file and every override key are known fields of
    ``TrainConfig`` (:class:`ConfigError` listing the valid keys otherwise)."""
    from pathlib import Path

    import yaml

    from parley.arena.cli.common import check_config_keys, check_key_path
    from parley.arena.training.config import TrainConfig
    from parley.protocols.errors import ConfigError

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read --config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"--config {path} is not valid YAML: {' '.join(str(exc).split())}"
        ) from None
    check_config_keys(data, TrainConfig)
    for item in overrides:
        key, sep, _ = item.partition("=")
        if sep and key:
            check_key_path(key.split("."), TrainConfig)
    return overrides
