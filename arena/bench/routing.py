"""Cache-aware routing beside least-busy routing over Ray pool replicas, in one run.

Two :class:`~parley.arena.inference.ray_pool.RayPool` fronts of ``--replicas`` transformers
replicas each (the tiny model, built if absent; ``--model-size small`` or ``--model`` for
another) run side by side on one local Ray (``--cpus``), one routing ``cache_aware``, the
other ``least_busy``. Each plays the same workload, interleaved ``--repeat`` times (the
order alternates, so drifting load hits both alike): ``--episodes`` multi-turn episodes at
once, each ``--turns`` requests one after the other whose prompt extends the last (a shared
``--system-tokens`` system prompt, then per turn the previous completion and
``--user-tokens`` new tokens), ``--max-tokens`` new tokens per request, seeded, and between
turns a seeded random pause of ``--think-ms`` on average (the other seats' and the
scenario's steps: without it the episodes move in lockstep, and least-busy routing sends
each one to the same replica every turn by accident of the order). Requests
carry no session key unless ``--session-keys`` (agents over the bus do not set one today):
routing then has only the prompts to go by. Each repeat uses fresh episode contents, so no
run finds the previous run's sessions in a cache. ``--prefix-cache-mb`` bounds each
replica's prefix cache (the transformers backend's ``prefix_cache_bytes``): where KV memory
is short, as on a GPU serving many sessions, a replica that sees every session (least-busy)
evicts what one that sees its own sessions (cache-aware) keeps.

Keys of ``--json``, per routing ``R`` in ``cache_aware`` / ``least_busy``:

* ``R_hit_rate`` — share of prompt tokens the replicas took from their prefix caches
  (the backends' own counters, summed over the replicas and every repeat);
* ``R_tokens_per_s`` — generated tokens/s from the first request to the last answer (best
  repeat); ``R_requests_per_replica`` — how the requests spread;
* ``R_prefilled_tokens`` — prompt tokens the replicas ran through the model (the rest came
  from a cache), over every repeat; ``prefill_ratio_least_busy_vs_cache_aware`` — least-busy's
  over cache-aware's (a session that moves to the other replica loses only the turns that
  replica has not seen: its cache still holds the session's older turns, so this, not the
  hit rate, shows the difference);
* ``hit_rate_ratio_vs_least_busy`` and ``tokens_per_s_ratio_vs_least_busy`` — cache-aware
  over least-busy; ``cache_aware_routing`` — how its router decided (by prefix, by load,
  overloaded); ``load_avg`` — the machine's 1-minute load average at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

TARGETS = {
    "prefill_ratio_least_busy_vs_cache_aware": (">=", 1.2),
    "tokens_per_s_ratio_vs_least_busy": (">=", 1.0),
}
"""Ours (issue 33 sets none for this): least-busy prefills at least 1.2 times the tokens
cache-aware does, and cache-aware is no slower."""

POLICIES = ("cache_aware", "least_busy")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument(
        "--model-size", choices=("tiny", "small"), default="tiny", help="built when no --model"
    )
    parser.add_argument("--replicas", type=int, default=2, help="pool replicas per front")
    parser.add_argument("--episodes", type=int, default=64, help="concurrent episodes")
    parser.add_argument("--turns", type=int, default=8, help="requests per episode")
    parser.add_argument("--max-tokens", type=int, default=8, help="new tokens per request")
    parser.add_argument("--system-tokens", type=int, default=32, help="shared system prompt")
    parser.add_argument("--user-tokens", type=int, default=24, help="new prompt tokens per turn")
    parser.add_argument(
        "--think-ms", type=float, default=20.0, help="mean pause between an episode's turns"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per routing (best kept)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument(
        "--session-keys", action="store_true", help="requests carry their episode as a key"
    )
    parser.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=0.0,
        help="each replica's prefix-cache budget (0: the backend's default, 256 MB)",
    )


def _user(rng: np.random.Generator, n: int) -> list[int]:
    """``n`` token ids of a turn's new text (ids 16-999: no special token of the tiny
    vocabulary)."""
    return [int(t) for t in rng.integers(16, 1000, size=n)]


async def _episode(pool: Any, args: argparse.Namespace, run: int, episode: int) -> int:
    """Play one episode against ``pool``; returns the tokens generated."""
    from parley.protocols.messages import GenerateRequest, SamplingParams

    rng = np.random.default_rng([run, episode])
    prompt = _user(np.random.default_rng([run]), args.system_tokens) + _user(rng, args.user_tokens)
    session = f"run{run}/episode{episode}" if args.session_keys else ""
    generated = 0
    for turn in range(args.turns):
        params = SamplingParams(max_tokens=args.max_tokens, seed=1000 * episode + turn)
        request = GenerateRequest(prompt_token_ids=prompt, params=params)
        result = await pool.generate(request, session=session)
        ids = list(result.completions[0].token_ids)
        generated += len(ids)
        prompt = prompt + ids + _user(rng, args.user_tokens)
        await asyncio.sleep(rng.exponential(args.think_ms / 1000))
    return generated


async def measure(pool: Any, args: argparse.Namespace, run: int) -> dict[str, Any]:
    """One run of the workload on ``pool``: generated tokens, seconds, and the replicas'
    prefix counters over it."""
    before = await pool.prefix_stats()
    started = time.perf_counter()
    tokens = await asyncio.gather(*(_episode(pool, args, run, e) for e in range(args.episodes)))
    seconds = time.perf_counter() - started
    after = await pool.prefix_stats()
    return {
        "tokens": sum(tokens),
        "seconds": seconds,
        "prompt_tokens": after["prompt_tokens"] - before["prompt_tokens"],
        "prefilled_tokens": after["prefilled_tokens"] - before["prefilled_tokens"],
    }


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from parley.arena.bench.pool_lora import model_for_size
    from parley.arena.inference.pool import PoolConfig
    from parley.arena.inference.ray_pool import RayPool, ReplicaSpec

    model = args.model or await asyncio.to_thread(model_for_size, args.model_size)
    budget = int(args.prefix_cache_mb * (1 << 20))
    cache = (("prefix_cache_bytes", budget),) if budget else ()
    spec = ReplicaSpec(
        backend="transformers",
        model=str(model),
        options=(("num_threads", args.threads), *cache),
        config=PoolConfig(max_batch_size=max(1, args.episodes)),
    )
    pools = {p: RayPool(spec, args.replicas, cpus_per_replica=0.0, routing=p) for p in POLICIES}
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    try:
        for pool in pools.values():
            await pool.start()
        warm = argparse.Namespace(**{**vars(args), "episodes": 2 * args.replicas, "turns": 2})
        for pool in pools.values():
            await measure(pool, warm, run=10_000)  # first-call costs are not throughput
        for repeat in range(args.repeat):
            order = POLICIES if repeat % 2 == 0 else POLICIES[::-1]
            for policy in order:
                runs[policy].append(await measure(pools[policy], args, run=repeat))
        figures = {p: pools[p].figures() for p in POLICIES}
    finally:
        for pool in pools.values():
            await pool.close()
    result: dict[str, Any] = {
        "model": str(model),
        "replicas": args.replicas,
        "episodes": args.episodes,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "session_keys": args.session_keys,
        "prefix_cache_mb": args.prefix_cache_mb or 256,
    }
    for policy in POLICIES:
        prompt = sum(r["prompt_tokens"] for r in runs[policy])
        prefilled = sum(r["prefilled_tokens"] for r in runs[policy])
        result[f"{policy}_hit_rate"] = round(1 - prefilled / prompt, 4) if prompt else 0.0
        result[f"{policy}_prefilled_tokens"] = prefilled
        best = max(r["tokens"] / r["seconds"] for r in runs[policy])
        result[f"{policy}_tokens_per_s"] = round(best, 1)
        result[f"{policy}_requests_per_replica"] = figures[policy]["requests"]
    plain = result["least_busy_hit_rate"]
    result["hit_rate_ratio_vs_least_busy"] = (
        round(result["cache_aware_hit_rate"] / plain, 3) if plain else float("inf")
    )
    aware = result["cache_aware_prefilled_tokens"]
    result["prefill_ratio_least_busy_vs_cache_aware"] = (
        round(result["least_busy_prefilled_tokens"] / aware, 3) if aware else float("inf")
    )
    result["tokens_per_s_ratio_vs_least_busy"] = round(
        result["cache_aware_tokens_per_s"] / result["least_busy_tokens_per_s"], 3
    )
    result["cache_aware_routing"] = figures["cache_aware"]["routing"]
    result["targets"] = {k: f"{op} {v}" for k, (op, v) in TARGETS.items()}
    return result


def run(args: argparse.Namespace) -> int:
    """Run the benchmark on a local Ray (or the one this process is connected to); print a
    table (or JSON with ``--json``). Exit status 0 either way, as for the other benches."""
    from rich.console import Console
    from rich.table import Table

    from parley.arena.run.ray_cluster import import_ray, init_ray

    load_before = os.getloadavg()[0]
    started = init_ray(None, num_cpus=args.cpus)
    try:
        result = asyncio.run(_bench(args))
    finally:
        if started:
            import_ray().shutdown()
    result["load_avg"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    result["targets_met"] = all(
        result[k] >= v if op == ">=" else result[k] <= v for k, (op, v) in TARGETS.items()
    )
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(
        title=f"routing over {args.replicas} replicas, {args.episodes} episodes x "
        f"{args.turns} turns (load {result['load_avg'][0]}-{result['load_avg'][1]})"
    )
    for column in ("routing", "prefix hit rate", "prefilled", "tokens/s", "requests/replica"):
        table.add_column(column, justify="right")
    for policy in POLICIES:
        table.add_row(
            policy,
            f"{result[f'{policy}_hit_rate']:.3f}",
            f"{result[f'{policy}_prefilled_tokens']:,}",
            f"{result[f'{policy}_tokens_per_s']:,.0f}",
            str(result[f"{policy}_requests_per_replica"]),
        )
    out = Console()
    out.print(table)
    for key, (op, target) in TARGETS.items():
        out.print(f"{key}: {result[key]:.2f} (target {op} {target})")
    return 0
