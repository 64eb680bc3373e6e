"""Asynchronous sampler (S = 1) vs a synchronous generate-then-train loop, samples/s.

Workload (the same for both paths): self-play of ``negotiation/simple-trade-v0`` by the
tiny model (``parley model tiny``) through the in-process pool, one shared policy for both
seats, free-text actions. Episode lengths vary: each agent of each episode draws its
token budget uniformly from ``--min-tokens``..``--max-tokens`` (a random tiny model rarely
stops by itself, so the budget sets the length). Each update trains on ``--batch``
episodes (REINFORCE with per-role baselines) and pushes the weights to the pool.

- ``sync``: play a batch of episodes (all at once), wait for the slowest, train, push.
- ``async``: :class:`~parley.arena.training.sampler.AsyncSampler` with staleness S = 1 keeps
  episodes running while the trainer works on the previous batch (in a worker thread).

``async_ratio_vs_sync`` = trained decisions per second of ``async`` / of ``sync``
(published systems: 1.4-2.8x; target >= 1.5). Both paths run ``--updates`` updates after
one warm-up update, alternating, best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SCENARIO = "negotiation/simple-trade-v0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=8, help="episodes per update")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per path")
    parser.add_argument("--min-tokens", type=int, default=2, help="fewest tokens per action")
    parser.add_argument("--max-tokens", type=int, default=32, help="most tokens per action")
    parser.add_argument("--max-turns", type=int, default=4, help="turns per trade episode")
    parser.add_argument("--repeats", type=int, default=1, help="runs per path (best kept)")
    parser.add_argument("--model", default="", help="model directory (default: build tiny)")


async def _setup(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from parley.arena.inference.pool import InferencePool, PoolConfig
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner
    from parley.arena.training.loop import AgentConfig, _llm_factory, _load_policies
    from parley.arena.training.pg import PGConfig, PolicyGradientTrainer
    from parley.arena.training.sampler import ConstraintLog
    from parley.arena.training.sync import InProcessSync

    class _Cfg:  # the fields _load_policies reads
        max_batch_size = 256
        seed = 0

    policies = await _load_policies(_Cfg(), {"shared": model_dir})  # type: ignore[arg-type]
    policy = policies["shared"]
    pool = await InferencePool({"shared": policy.backend}, PoolConfig(max_batch_size=256)).start()
    log = ConstraintLog()
    agent = AgentConfig(temperature=1.0, max_tokens=args.max_tokens, max_prompt_tokens=384)
    base = _llm_factory(pool, "shared", policy.backend.tokenizer, "", agent, log)
    rng = np.random.default_rng(0)

    def factory() -> Any:
        # A fresh token budget per agent per episode: episodes of different lengths.
        llm = base()
        budget = int(rng.integers(args.min_tokens, args.max_tokens + 1))
        llm.config = llm.config.replace(max_tokens=budget)
        return llm

    run_config = RunConfig(
        scenario=SCENARIO,
        scenario_kwargs={"max_turns": args.max_turns},
        agents={"player_0": "llm:shared", "player_1": "llm:shared"},
        concurrency=args.batch * 2,
        progress=False,
        act_timeout=600.0,
    )
    runner = Runner(run_config, agents={"player_0": factory, "player_1": factory})
    trainer = PolicyGradientTrainer(
        {"shared": policy.model},
        policy.backend.tokenizer.hf,
        PGConfig(objective="reinforce", grouping="role", lr=1e-4, micro_batch=64),
    )
    return {
        "pool": pool,
        "runner": runner,
        "trainer": trainer,
        "sync": InProcessSync(pool),
        "log": log,
    }


async def _sync_path(parts: dict[str, Any], args: argparse.Namespace, seed: int) -> float:
    from parley.arena.run.runner import EpisodePlan
    from parley.arena.training.sampler import samples_from_record

    runner, trainer, sync, log = parts["runner"], parts["trainer"], parts["sync"], parts["log"]
    n_samples, started = 0, 0.0
    async with runner.open():
        for update in range(args.updates + 1):
            if update == 1:
                n_samples, started = 0, time.perf_counter()
            plans = [
                EpisodePlan(
                    i, i, 0, seed * 100_000 + update * 1000 + i, {"player_0": i, "player_1": i}
                )
                for i in range(args.batch)
            ]
            records = await asyncio.gather(*(runner.play(p) for p in plans))
            samples = [s for r in records if not r.failed for s in samples_from_record(r, log=log)]
            trainer.step(samples)  # the event loop waits: nothing is sampled meanwhile
            await sync.push("shared", trainer.version + 1000, trainer.state_tensors("shared"))
            n_samples += len(samples)
    return n_samples / (time.perf_counter() - started)


async def _async_path(parts: dict[str, Any], args: argparse.Namespace, seed: int) -> float:
    from parley.arena.training.sampler import AsyncSampler, SamplerConfig, samples_from_record

    runner, trainer, sync, log = parts["runner"], parts["trainer"], parts["sync"], parts["log"]
    config = SamplerConfig(
        batch_size=args.batch, staleness=1, concurrency=args.batch * 2, seed=seed
    )
    # Versions in the pool's numbering (both paths push to one pool, so they only grow).
    sampler = AsyncSampler(runner, config, version=parts["pool"].policies["shared"])
    n_samples, started, update = 0, 0.0, 0
    async with runner.open():
        async for batch in sampler.batches(limit=args.updates + 1):
            if update == 1:
                n_samples, started = 0, time.perf_counter()
            samples = [s for r in batch.records for s in samples_from_record(r, log=log)]
            await asyncio.to_thread(trainer.step, samples)  # sampling goes on meanwhile
            version = trainer.version + 1000
            await sync.push("shared", version, trainer.state_tensors("shared"))
            sampler.publish(version)
            n_samples += len(samples)
            update += 1
    return n_samples / (time.perf_counter() - started)


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else None
        if model_dir is None:
            from parley.arena.inference.models.tiny import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "tiny")
        parts = await _setup(args, model_dir)
        try:
            sync_rates, async_rates = [], []
            for r in range(args.repeats):
                sync_rates.append(await _sync_path(parts, args, seed=2 * r))
                async_rates.append(await _async_path(parts, args, seed=2 * r + 1))
        finally:
            await parts["pool"].close()
    best_sync, best_async = max(sync_rates), max(async_rates)
    return {
        "bench": "sampler",
        "workload": f"{SCENARIO} self-play, tiny model, batch {args.batch} episodes, "
        f"max_tokens {args.min_tokens}-{args.max_tokens} per agent, {args.max_turns} turns, "
        f"{args.updates} updates",
        "sync_samples_per_s": round(best_sync, 2),
        "async_samples_per_s": round(best_async, 2),
        "async_ratio_vs_sync": round(best_async / best_sync, 3) if best_sync else None,
        "target": {"async_ratio_vs_sync": 1.5},
    }


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_main(args))
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sampler: async (S=1) vs sync generate-then-train")
    table.add_column("path")
    table.add_column("samples/s", justify="right")
    table.add_row("sync", f"{result['sync_samples_per_s']:.1f}")
    table.add_row("async S=1", f"{result['async_samples_per_s']:.1f}")
    table.add_row("ratio", f"{result['async_ratio_vs_sync']}")
    Console().print(table)
    return 0
