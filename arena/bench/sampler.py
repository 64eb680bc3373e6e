"""Asynchronous sampler (S = 1) vs a synchronous generate-then-train loop, samples/s.

Workload (the same for both paths): self-play of ``negotiation/simple-trade-v0`` (a real
multi-turn scenario: offers, counter-offers, accept or walk away) by the tiny model
(``parley model tiny``) through the in-process pool, one shared policy for both seats,
free-text actions. Episode lengths vary: each agent of each episode draws its token budget
uniformly from ``--min-tokens``..``--max-tokens`` (a random tiny model rarely stops by
itself, so the budget sets the length). Each update trains on ``--batch`` episodes
(REINFORCE with per-role baselines) and pushes the weights to the pool.

- ``sync``: play a batch of episodes (all at once), wait for the slowest, train, push.
- ``async``: :class:`~parley.arena.training.sampler.AsyncSampler` with staleness S = 1 keeps
  episodes running while the trainer works on the previous batch (in a worker thread).

The comparison is fair by construction: both paths train ``--updates`` updates of
``--batch`` episodes (the same number of trained episodes; decisions per episode vary with
the drawn budgets and are counted), both clocks start at zero *before the first episode*
(one untimed warm-up update runs before either path), and both end after the last weight
push. ``async_ratio_vs_sync`` = trained decisions per second of ``async`` / of ``sync``
(published systems: 1.4-2.8x; target >= 1.5), best of ``--repeats`` alternating runs;
``episodes_ratio_vs_sync`` is the same for trained episodes (async batches fill in finishing
order, so they hold shorter episodes than sync's: fewer decisions per episode).

Where the time goes: ``timeline`` gives, per path, the wall time, the time any episode was
being generated, the time the trainer ran (train + push), and how much of the training
overlapped generation; ``per_update`` lists each update's generate / train / push interval.
``--timeline FILE.json`` writes every interval (each episode, each train step), and a PNG
beside it when matplotlib is installed. On one CPU, generation and training share the same
cores, so overlapping them gains little; ``two_device_estimate`` is an *estimate*, not a
measurement: the async time if generation and training ran on separate devices at the speeds
the sync path measured (a pipeline: first batch, then ``max(generate, train)`` per update).
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
    parser.add_argument(
        "--timeline", default="", help="write every interval here (JSON) and a PNG beside it"
    )


async def _setup(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from parley.arena.inference.pool import InferencePool, PoolConfig
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner
    from parley.arena.training.config import RunSeeds, StageConfig, TrainConfig
    from parley.arena.training.loop import AgentConfig
    from parley.arena.training.models import load_policies
    from parley.arena.training.pg import PGConfig, PolicyGradientTrainer
    from parley.arena.training.sampler import ConstraintLog
    from parley.arena.training.seats import llm_factory
    from parley.arena.training.sync import InProcessSync

    # A training config only for what load_policies reads (batch rows, seed, device).
    config = TrainConfig(
        scenario=SCENARIO,
        policies=["shared"],
        stages=[StageConfig(name="bench", train=["shared"], kind="reading")],
        max_batch_size=256,
        seed=0,
    )
    seeds = RunSeeds.from_config(config)
    dirs = {"shared": model_dir}
    policies = await asyncio.to_thread(load_policies, config, seeds, dirs, model_dir.parent)
    pool = await InferencePool(policies.served, PoolConfig(max_batch_size=256)).start()
    log = ConstraintLog()
    agent = AgentConfig(temperature=1.0, max_tokens=args.max_tokens, max_prompt_tokens=384)
    base = llm_factory(pool, "shared", policies.tokenizer, "", agent, log)
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
        {"shared": policies.weights["shared"]},
        policies.tokenizer.hf,
        PGConfig(objective="reinforce", grouping="role", lr=1e-4, micro_batch=64),
    )
    return {
        "pool": pool,
        "runner": runner,
        "trainer": trainer,
        "sync": InProcessSync(pool),
        "log": log,
    }


class _Clock:
    """Intervals relative to one zero: ``(kind, start, end, update)``."""

    def __init__(self) -> None:
        self.zero = time.perf_counter()
        self.events: list[tuple[str, float, float, int]] = []
        self.update = 0

    def now(self) -> float:
        return time.perf_counter() - self.zero

    def add(self, kind: str, start: float, update: int | None = None) -> float:
        end = self.now()
        self.events.append((kind, start, end, self.update if update is None else update))
        return end


class _TimedRunner:
    """The runner, with every episode's play interval recorded on the current clock."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.clock = _Clock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    async def play(self, plan: Any) -> Any:
        clock, update = self.clock, self.clock.update
        start = clock.now()
        try:
            return await self._runner.play(plan)
        finally:
            clock.add("episode", start, update)


async def _sync_path(
    parts: dict[str, Any], args: argparse.Namespace, seed: int, updates: int
) -> dict[str, Any]:
    from parley.arena.run.runner import EpisodePlan
    from parley.arena.training.sampler import samples_from_record

    runner, trainer, sync, log = parts["runner"], parts["trainer"], parts["sync"], parts["log"]
    n_samples = 0
    async with runner.open():
        clock = runner.clock = _Clock()  # zero: before the first episode starts
        for update in range(updates):
            clock.update = update
            plans = [
                EpisodePlan(
                    i, i, 0, seed * 100_000 + update * 1000 + i, {"player_0": i, "player_1": i}
                )
                for i in range(args.batch)
            ]
            start = clock.now()
            records = await asyncio.gather(*(runner.play(p) for p in plans))
            start = clock.add("generate", start)
            samples = [s for r in records if not r.failed for s in samples_from_record(r, log=log)]
            await asyncio.to_thread(trainer.step, samples)  # nothing is sampled meanwhile
            start = clock.add("train", start)
            await sync.push("shared", trainer.version + 1000, trainer.state_tensors("shared"))
            clock.add("push", start)
            n_samples += len(samples)
        wall = clock.now()
    return _summary("sync", clock, wall, n_samples, updates * args.batch)


async def _async_path(
    parts: dict[str, Any], args: argparse.Namespace, seed: int, updates: int
) -> dict[str, Any]:
    from parley.arena.training.sampler import AsyncSampler, SamplerConfig, samples_from_record

    runner, trainer, sync, log = parts["runner"], parts["trainer"], parts["sync"], parts["log"]
    config = SamplerConfig(
        batch_size=args.batch, staleness=1, concurrency=args.batch * 2, seed=seed
    )
    # Versions in the pool's numbering (both paths push to one pool, so they only grow).
    sampler = AsyncSampler(runner, config, version=parts["pool"].policies["shared"])
    n_samples = n_episodes = 0
    async with runner.open():
        clock = runner.clock = _Clock()  # zero: before the first episode starts
        async for batch in sampler.batches(limit=updates):
            samples = [s for r in batch.records for s in samples_from_record(r, log=log)]
            start = clock.now()
            clock.update += 1  # episodes started from now on belong to the next update
            await asyncio.to_thread(trainer.step, samples)  # sampling goes on meanwhile
            start = clock.add("train", start, clock.update - 1)
            version = trainer.version + 1000
            await sync.push("shared", version, trainer.state_tensors("shared"))
            clock.add("push", start, clock.update - 1)
            sampler.publish(version)
            n_samples += len(samples)
            n_episodes += len(batch.records)
        wall = clock.now()
    result = _summary("async", clock, wall, n_samples, n_episodes)
    result["dropped_stale"] = sampler.dropped_stale
    return result


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def _summary(
    path: str, clock: _Clock, wall: float, n_samples: int, n_episodes: int
) -> dict[str, Any]:
    """Rates and where the time went, from the clock's intervals."""
    episodes = [(s, e) for k, s, e, _ in clock.events if k == "episode"]
    trains = [(s, e) for k, s, e, _ in clock.events if k in ("train", "push")]
    generating = _union(episodes)
    per_update: dict[int, dict[str, list[float]]] = {}
    for kind, start, end, update in clock.events:
        if kind != "episode":
            per_update.setdefault(update, {})[kind] = [round(start, 3), round(end, 3)]
    return {
        "path": path,
        "wall_s": round(wall, 3),
        "samples": n_samples,
        "episodes_trained": n_episodes,
        "episodes_played": len(episodes),
        "samples_per_s": n_samples / wall if wall else 0.0,
        "episodes_per_s": round(n_episodes / wall, 4) if wall else 0.0,
        "generating_s": round(sum(e - s for s, e in generating), 3),
        "training_s": round(sum(e - s for s, e in trains), 3),
        "training_overlapping_generation_s": round(_overlap(_union(trains), generating), 3),
        "per_update": [{"update": u, **per_update[u]} for u in sorted(per_update)],
        "events": [(k, round(s, 4), round(e, 4), u) for k, s, e, u in clock.events],
    }


def _two_device_estimate(sync: dict[str, Any], updates: int) -> dict[str, Any]:
    """Async wall time if generation and training had a device each (an estimate).

    From the sync path's own phases: ``G`` = mean generate time per update, ``T`` = mean
    train + push time. Sync stays ``n (G + T)``; a pipeline with S = 1 and no contention
    takes ``G + (n - 1) max(G, T) + T``.
    """
    rows = sync["per_update"]
    g = float(np.mean([r["generate"][1] - r["generate"][0] for r in rows]))
    t = float(np.mean([r["push"][1] - r["train"][0] for r in rows]))
    sync_s = updates * (g + t)
    async_s = g + (updates - 1) * max(g, t) + t
    return {
        "kind": "estimate, not a measurement",
        "generate_s_per_update": round(g, 3),
        "train_s_per_update": round(t, 3),
        "async_ratio_vs_sync": round(sync_s / async_s, 3),
        "ceiling_many_updates": round((g + t) / max(g, t), 3),
    }


def _write_timeline(path: Path, runs: dict[str, dict[str, Any]]) -> list[str]:
    """The intervals as JSON, and a PNG (one lane per path) when matplotlib is installed."""
    path.write_text(json.dumps({k: v["events"] for k, v in runs.items()}))
    written = [str(path)]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.8 * len(runs) + 1), sharex=True)
    colors = {"episode": "tab:blue", "generate": "tab:cyan", "train": "tab:red", "push": "k"}
    for ax, (name, run) in zip(np.atleast_1d(axes), runs.items(), strict=True):
        lane: dict[int, float] = {}
        for kind, start, end, _ in run["events"]:
            if kind == "episode":  # stack episodes on free rows
                row = next((r for r, free in sorted(lane.items()) if free <= start), len(lane))
                lane[row] = end
                y = 2 + row * 0.2
            else:
                y = 0.0 if kind == "generate" else 1.0
            ax.plot([start, end], [y, y], color=colors[kind], lw=4 if kind != "episode" else 1.5)
        ax.set_yticks([0, 1, 2], ["generate (sync)", "train+push", "episodes"])
        ax.set_title(f"{name}: {run['wall_s']} s, {run['samples']} decisions")
    np.atleast_1d(axes)[-1].set_xlabel("seconds from zero")
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return [*written, str(png)]


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else None
        if model_dir is None:
            from parley.arena.inference.models.tiny import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "tiny")
        parts = await _setup(args, model_dir)
        parts["runner"] = _TimedRunner(parts["runner"])
        try:
            await _sync_path(parts, args, seed=999, updates=1)  # warm-up, untimed
            syncs, asyncs = [], []
            for r in range(args.repeats):
                syncs.append(await _sync_path(parts, args, seed=2 * r, updates=args.updates))
                asyncs.append(await _async_path(parts, args, seed=2 * r + 1, updates=args.updates))
        finally:
            await parts["pool"].close()
    best_sync = max(syncs, key=lambda x: x["samples_per_s"])
    best_async = max(asyncs, key=lambda x: x["samples_per_s"])
    result: dict[str, Any] = {
        "bench": "sampler",
        "workload": f"{SCENARIO} self-play, tiny model, batch {args.batch} episodes, "
        f"max_tokens {args.min_tokens}-{args.max_tokens} per agent, {args.max_turns} turns, "
        f"{args.updates} updates per path, clocks from zero",
        "sync_samples_per_s": round(best_sync["samples_per_s"], 2),
        "async_samples_per_s": round(best_async["samples_per_s"], 2),
        "async_ratio_vs_sync": round(best_async["samples_per_s"] / best_sync["samples_per_s"], 3)
        if best_sync["samples_per_s"]
        else None,
        "episodes_ratio_vs_sync": round(
            best_async["episodes_per_s"] / best_sync["episodes_per_s"], 3
        )
        if best_sync["episodes_per_s"]
        else None,
        "timeline": {
            run["path"]: {k: v for k, v in run.items() if k != "events"}
            for run in (best_sync, best_async)
        },
        "two_device_estimate": _two_device_estimate(best_sync, args.updates),
        "target": {"async_ratio_vs_sync": 1.5},
    }
    if args.timeline:
        runs = {"sync": best_sync, "async S=1": best_async}
        result["timeline_files"] = _write_timeline(Path(args.timeline), runs)
    return result


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_main(args))
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sampler: async (S=1) vs sync generate-then-train, clocks from zero")
    for col in ("path", "samples/s", "wall s", "generating s", "training s", "overlap s"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for name, run_ in result["timeline"].items():
        table.add_row(
            name,
            f"{run_['samples_per_s']:.1f}",
            f"{run_['wall_s']}",
            f"{run_['generating_s']}",
            f"{run_['training_s']}",
            f"{run_['training_overlapping_generation_s']}",
        )
    Console().print(table)
    est = result["two_device_estimate"]
    print(
        f"async/sync: {result['async_ratio_vs_sync']} measured; "
        f"{est['async_ratio_vs_sync']} estimated with a second device "
        f"(generate {est['generate_s_per_update']} s, train {est['train_s_per_update']} s "
        "per update, from the sync path)"
    )
    return 0
