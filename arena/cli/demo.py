"""``parley demo`` (``make demo``): train a speaker-listener team by RL, then play arenas.

1. Trains the referential-game team of ``examples/referential.yaml`` (K = 4 candidates,
   two tiny random models, staged RL through the pool, the sampler and the trainer; about
   1-3 minutes on 2 CPU cores) and plays the untrained team and the trained team in the
   arena (:func:`parley.arena.cli.demo_train.train_demo`). ``--no-train`` skips this.
2. Builds the tiny model (``parley model tiny``) into ``--model`` if it is not there yet
   (default ``$PARLEY_CACHE/tiny-model``, ``~/.cache/parley/tiny-model``).
3. Starts an in-process inference pool (transformers backend) on it.
4. Plays negotiation episodes concurrently: an LLM agent in one seat, the scenario's
   scripted baseline in the other; every LLM agent of every episode asks the one pool,
   which batches their requests.
5. Prints the run's summary table and what the pool did (requests, batches, tokens/s).

The negotiation model is untrained, so its moves are mostly invalid: the point is the
whole path, end to end on this machine. The steps are separate functions
(:func:`~parley.arena.inference.models.tiny.ensure_tiny_model`,
:func:`play_arena`) so that longer demos (e.g. a short training run between two arenas)
compose them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from parley.arena.inference.models.tiny import ensure_tiny_model

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="train a speaker-listener team by RL, then play LLM and scripted agents",
        description=(__doc__ or "").strip().splitlines()[0],
    )
    p.add_argument("--model", type=Path, help="model directory (built if absent)")
    p.add_argument("--scenario", default=DemoOptions.scenario, help="scenario id")
    p.add_argument("--episodes", type=int, default=DemoOptions.episodes, help="episodes")
    p.add_argument("--max-turns", type=int, default=DemoOptions.max_turns, help="talk turns")
    p.add_argument(
        "--max-tokens", type=int, default=DemoOptions.max_tokens, help="tokens per LLM action"
    )
    p.add_argument("--seed", type=int, default=0, help="run seed")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="training output dir")
    p.add_argument("--no-train", action="store_true", help="skip the training part")
    p.set_defaults(func=main)


@dataclass(frozen=True)
class DemoOptions:
    """What the demo arena plays."""

    scenario: str = "negotiation/deal-or-no-deal-v3"
    """Scenario id; the LLM takes the first seat, scripted baselines the others."""
    episodes: int = 8
    """Episodes, all played concurrently so the pool batches across them."""
    max_turns: int = 4
    """Talk turns before the choice (a scenario argument; kept short for a quick demo)."""
    max_tokens: int = 16
    """Most tokens per LLM action."""
    seed: int = 0
    """Run seed."""
    scenario_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra scenario arguments (``max_turns`` is added when the scenario takes it)."""


async def play_arena(
    model_dir: Path, options: DemoOptions, *, console: Console | None = None
) -> tuple[Any, dict[str, Any]]:
    """Play ``options`` with an LLM seat on ``model_dir`` through an in-process pool.

    Returns the runner's :class:`~parley.arena.run.runner.RunResult` and the pool's figures
    (requests, backend calls, mean batch size, generated tokens, tokens/s).
    """
    from parley.arena.inference.backends import load_backend
    from parley.arena.inference.pool import InferencePool, PoolConfig
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner
    from parley.scenarios import make

    kwargs = dict(options.scenario_kwargs)
    if options.scenario.startswith("negotiation/deal-or-no-deal"):
        kwargs.setdefault("max_turns", options.max_turns)
    probe = make(options.scenario, **kwargs)
    llm_seat = probe.possible_agents[0]
    probe.close()
    backend = await load_backend("transformers", str(model_dir))
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.02)) as pool:
        config = RunConfig(
            scenario=options.scenario,
            scenario_kwargs=kwargs,
            agents={llm_seat: f"llm:{model_dir}?max_tokens={options.max_tokens}&temperature=0.8"},
            episodes=options.episodes,
            concurrency=options.episodes,
            seed=options.seed,
            act_timeout=300.0,
            agent_options={"pool": pool},  # the agents use this pool, in-process
        )
        started = time.perf_counter()
        result = await Runner(config, console=console).run()
        wall = time.perf_counter() - started
        stats = pool.stats
    figures = {
        "requests": stats.completed,
        "backend_calls": stats.backend_calls,
        "mean_batch_size": round(stats.mean_batch_size, 2),
        "max_batch_size": stats.max_batch_size,
        "generated_tokens": stats.generated_tokens,
        "tokens_per_s": round(stats.generated_tokens / wall, 1) if wall else 0.0,
    }
    return result, figures


def main(args: argparse.Namespace) -> int:
    """Build the model if needed, play the arena, print the tables; 0 if episodes finished."""
    from rich.table import Table

    from parley.arena.cli.common import console
    from parley.arena.run.summary import summary_table

    err, out = console(stderr=True), console()
    from transformers.utils import logging as hf_logging

    # A bar per checkpoint load drowns the demo's own. (Typed here: some transformers
    # releases leave this function unannotated.)
    disable_hf_bars: Callable[[], None] = hf_logging.disable_progress_bar
    disable_hf_bars()
    if not args.no_train:
        from parley.arena.cli.demo_train import print_demo, train_demo

        out.rule("1. RL: a speaker and a listener learn to talk (referential game, K = 4)")
        print_demo(asyncio.run(train_demo(args.out)), out)
        out.rule("2. An arena: a tiny LLM agent and a scripted negotiator, one batched pool")
    model_dir = ensure_tiny_model(args.model, err)
    options = DemoOptions(
        scenario=args.scenario,
        episodes=args.episodes,
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    result, pool = asyncio.run(play_arena(model_dir, options, console=err))
    seats = ", ".join(f"{seat}={spec}" for seat, spec in result.summary["agents"].items())
    out.print(summary_table(result.summary, title=f"{options.scenario} — {seats}"))
    table = Table(title="inference pool")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in pool.items():
        table.add_row(key.replace("_", " "), str(value))
    out.print(table)
    return 0 if result.summary["episodes"]["ok"] else 1
