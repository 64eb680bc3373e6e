"""Inference pool throughput with 32 concurrent agents beside the bare backend, as ratios.

On the tiny model (built if absent; ``--model`` for another), in one run:

* **sequential**: the backend called with one request at a time (what agents without a
  pool would get): generated tokens/s;
* **direct batch**: one ``backend.generate`` call with all the agents' prompts (the best
  batching can do): generated tokens/s;
* **pool**: ``--agents`` agents, each with its own prompt, asking the pool over the bus
  (``inproc://``, through :class:`~parley.agents.llm.BusPoolClient`) ``--rounds`` times one
  after the other, all agents at once: generated tokens/s, wall clock from the first request
  to the last answer.

Ratios: ``batched_ratio_vs_sequential`` = pool ÷ sequential (target >= 6) and
``pool_ratio_vs_direct_batch`` = pool ÷ direct batch (target >= 0.8). Requests are seeded
and use temperature 1 with ``--max-tokens`` tokens at most; tokens/s counts the tokens
actually generated. Each figure is the best of ``--repeat`` measurements (load on a shared
machine only slows things down).

With ``--adapters N`` (default 4; 0 skips it): ``multi_adapter_ratio_vs_single``, N LoRA
adapters batched together ÷ the plain model, same requests (target >= 0.7; see
:mod:`~parley.arena.bench.pool_lora`). ``--model-size small`` builds and uses a larger
local model (hidden 512, 4 layers) where ``--model`` is not given.

Transformers backend, continuous batching (``--mixed-rounds R``; 0, the default, skips it):
``--agents`` agents each ask the in-process pool ``R`` times one after the other, each
request for a seeded random 1-256 new tokens (``--mixed-max``), at most ``--mixed-slots``
rows decoded together (16: half the agents wait), once with the backend's static batching
and once with continuous batching, interleaved, on two backends loaded alike:
``continuous_ratio_vs_static`` = tokens/s continuous ÷ static (target >= 1.5). With
static batching a waiting request starts only when the whole running batch has ended
(its longest request); with continuous batching it takes the first row that frees.
``--batching`` picks the mode of the backend the other figures use.

Transformers backend: ``mask_cpu_us_per_token``, the CPU time (not wall clock: load on the
machine does not change it) of one constraint token mask and its advance, over random
walks through the allowed tokens of a regex (deal-or-no-deal's claim), a JSON schema and
a choice (:mod:`~parley.arena.inference.backends.constraints`); no target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

TARGETS = {
    "batched_ratio_vs_sequential": (">=", 6.0),
    "pool_ratio_vs_direct_batch": (">=", 0.8),
    "multi_adapter_ratio_vs_single": (">=", 0.7),  # with --adapters N > 0 (pool_lora.py)
    "continuous_ratio_vs_static": (">=", 1.5),  # transformers, with --mixed-rounds R > 0
}

_TOPICS = ("hats", "books", "balls", "a fair split", "the last offer", "trust", "time", "value")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--agents", type=int, default=32, help="concurrent agents")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    parser.add_argument("--rounds", type=int, default=2, help="requests per agent (pool)")
    parser.add_argument(
        "--sequential-requests",
        type=int,
        default=8,
        help="requests timed one at a time (tokens/s does not depend on how many)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="measurements; the best is kept")
    parser.add_argument("--device", default="cpu", help="transformers device")
    parser.add_argument(
        "--adapters",
        type=int,
        default=4,
        help="LoRA adapters batched together for multi_adapter_ratio_vs_single (0: skip)",
    )
    parser.add_argument("--lora-rank", type=int, default=16, help="rank of those adapters")
    parser.add_argument(
        "--batching",
        choices=("static", "continuous"),
        default="static",
        help="transformers: the batching of the backend the main figures use",
    )
    parser.add_argument(
        "--mixed-rounds",
        type=int,
        default=0,
        help="transformers: requests per agent of the mixed-length workload, static and "
        "continuous batching side by side (default 0: skipped; 3 for the README's figure)",
    )
    parser.add_argument(
        "--mixed-max", type=int, default=256, help="most new tokens of a mixed-length request"
    )
    parser.add_argument(
        "--mixed-slots",
        type=int,
        default=16,
        help="rows decoded together in the mixed-length workload (static: the pool's batch "
        "size; continuous: the backend's max_batch_rows); below --agents, requests queue",
    )
    parser.add_argument(
        "--model-size",
        choices=("tiny", "small"),
        default="tiny",
        help="locally built model when --model is not given (small: hidden 512, 4 layers)",
    )


def _requests(tokenizer: Any, agents: int, max_tokens: int, round_: int = 0) -> list[Any]:
    from parley.protocols.messages import GenerateRequest, SamplingParams

    out = []
    for i in range(agents):
        chat = [
            {"role": "system", "content": f"You are agent {i} in a negotiation."},
            {"role": "user", "content": f"Round {round_}: make an offer about {_TOPICS[i % 8]}."},
        ]
        params = SamplingParams(max_tokens=max_tokens, seed=1000 * round_ + i, temperature=1.0)
        out.append(GenerateRequest(prompt_token_ids=tokenizer.encode_chat(chat), params=params))
    return out


_MASK_SCHEMA = (
    '{"type": "object", "properties": {"action": {"enum": ["offer", "accept"]}, '
    '"book": {"type": "integer"}, "note": {"type": "string", "maxLength": 12}}}'
)


def mask_cost(vocab: Any, walks: int = 8, steps: int = 48) -> float:
    """CPU microseconds per constrained token (mask + advance), over ``walks`` seeded
    random walks per constraint through the allowed tokens of ``vocab`` (a
    :class:`~parley.arena.inference.backends.constraints.TokenVocab`)."""
    import numpy as np

    from parley.arena.inference.backends.constraints import TokenMatcher
    from parley.protocols.messages import Constraint

    take = "book=[0-2] hat=[0-2] ball=[0-2]"
    constraints = [
        Constraint(type="regex", pattern=f"({take} / {take})|no agreement"),
        Constraint(type="json", json_schema=_MASK_SCHEMA),
        Constraint(type="choice", choices=["offer", "accept", "deny", "no agreement"]),
    ]
    rng = np.random.default_rng(0)
    tokens, spent = 0, 0.0
    for c in constraints:
        for _ in range(walks):
            started = time.process_time()
            matcher = TokenMatcher(vocab, c)
            for _ in range(steps):
                allowed = np.flatnonzero(matcher.allowed())
                tokens += 1
                if not allowed.size:
                    break
                token = int(rng.choice(allowed))
                if token == vocab.eos_id:
                    break
                matcher.advance(token)
            spent += time.process_time() - started
    return 1e6 * spent / max(tokens, 1)


def _tokens(results: list[Any]) -> int:
    return sum(len(c.token_ids) for r in results for c in r.completions)


async def _sequential(backend: Any, requests: list[Any]) -> float:
    started = time.perf_counter()
    tokens = 0
    for r in requests:
        tokens += _tokens(await backend.generate([r]))
    return tokens / (time.perf_counter() - started)


async def _direct(backend: Any, requests: list[Any]) -> float:
    started = time.perf_counter()
    tokens = _tokens(await backend.generate(requests))
    return tokens / (time.perf_counter() - started)


async def _through_pool(backend: Any, args: argparse.Namespace) -> tuple[float, float]:
    """Tokens/s of ``args.agents`` agents asking the pool over the bus; mean batch size."""
    import zmq.asyncio

    from parley.agents.llm import BusPoolClient
    from parley.arena.inference.pool import POOL_ENDPOINT, InferencePool, PoolConfig
    from parley.protocols.bus import Endpoint

    rounds = [
        _requests(backend.tokenizer, args.agents, args.max_tokens, k) for k in range(args.rounds)
    ]
    config = PoolConfig(max_batch_size=args.agents, max_wait=0.02)
    ctx = zmq.asyncio.Context()
    try:
        async with (
            InferencePool({"default": backend}, config, owns_backends=False) as pool,
            Endpoint(POOL_ENDPOINT, context=ctx) as server,
            Endpoint("bench-agents", context=ctx) as agents_ep,
        ):
            pool.serve(server)
            await agents_ep.connect(await server.bind("inproc://bench-pool"), timeout=10)
            client = BusPoolClient(agents_ep, POOL_ENDPOINT, timeout=600)

            async def agent(i: int) -> int:
                tokens = 0
                for k in range(args.rounds):  # one request after the other, like turns
                    tokens += _tokens([await client.generate(rounds[k][i])])
                return tokens

            started = time.perf_counter()
            tokens = sum(await asyncio.gather(*(agent(i) for i in range(args.agents))))
            wall = time.perf_counter() - started
            return tokens / wall, pool.stats.mean_batch_size
    finally:
        ctx.term()


async def _mixed_rate(backend: Any, args: argparse.Namespace) -> dict[str, float]:
    """``args.agents`` agents asking an in-process pool ``args.mixed_rounds`` times each, one
    request after the other, for seeded 1..``args.mixed_max`` new tokens: tokens per second
    (wall clock) and per CPU second of the process, forward passes and attended slots."""
    import numpy as np

    from parley.arena.inference.pool import InferencePool, PoolConfig

    rng = np.random.default_rng(0)
    rounds = [
        _requests(backend.tokenizer, args.agents, args.mixed_max, k)
        for k in range(args.mixed_rounds)
    ]
    for batch in rounds:
        for r in batch:
            r.params.max_tokens = int(rng.integers(1, args.mixed_max + 1))
    config = PoolConfig(max_batch_size=args.mixed_slots, max_wait=0.02)
    async with InferencePool({"default": backend}, config, owns_backends=False) as pool:

        async def agent(i: int) -> int:
            tokens = 0
            for batch in rounds:  # one request after the other, like turns
                tokens += _tokens([await pool.generate(batch[i])])
            return tokens

        work = (backend.forward_passes, backend.attended_slots)
        started, cpu = time.perf_counter(), time.process_time()
        tokens = sum(await asyncio.gather(*(agent(i) for i in range(args.agents))))
        return {
            "tokens_per_s": tokens / (time.perf_counter() - started),
            "tokens_per_cpu_s": tokens / (time.process_time() - cpu),
            "forwards": backend.forward_passes - work[0],
            "slots": backend.attended_slots - work[1],
        }


async def _mixed(
    model: str, options: dict[str, Any], args: argparse.Namespace, progress: Any
) -> dict[str, Any]:
    """``continuous_ratio_vs_static``: the mixed-length workload on a static and a
    continuous backend, interleaved ``args.repeat`` times, best of each."""
    from parley.arena.inference.backends import load_backend

    options = {**options, "max_batch_rows": args.mixed_slots}
    arms = {
        mode: await load_backend("transformers", model, **options, batching=mode)
        for mode in ("static", "continuous")
    }
    best: dict[str, dict[str, float]] = {mode: {} for mode in arms}
    task = progress.add_task("mixed lengths", total=2 * args.repeat)
    try:
        for _ in range(args.repeat):
            for mode, backend in arms.items():
                got = await _mixed_rate(backend, args)
                # The same seeded work every time: counts agree; rates keep the best.
                best[mode] = {k: max(v, best[mode].get(k, 0.0)) for k, v in got.items()}
                progress.advance(task)
    finally:
        for backend in arms.values():
            await backend.close()
    static, cont = best["static"], best["continuous"]
    return {
        "mixed_max_tokens": args.mixed_max,
        "mixed_rounds": args.mixed_rounds,
        "mixed_slots": args.mixed_slots,
        "static_mixed_tokens_per_s": round(static["tokens_per_s"], 1),
        "continuous_mixed_tokens_per_s": round(cont["tokens_per_s"], 1),
        "continuous_ratio_vs_static": round(cont["tokens_per_s"] / static["tokens_per_s"], 3),
        # CPU time: what a loaded machine's wall clock hides.
        "continuous_cpu_ratio_vs_static": round(
            cont["tokens_per_cpu_s"] / static["tokens_per_cpu_s"], 3
        ),
        # Work counts: steps saved (what a GPU, flat in batch size, turns into tokens/s),
        # and attention work added by padding rows of different ages to one width.
        "forward_passes_static_vs_continuous": round(static["forwards"] / cont["forwards"], 3),
        "attended_slots_continuous_vs_static": round(cont["slots"] / static["slots"], 3),
    }


async def _bench(args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    from parley.arena.bench.pool_lora import measure, model_for_size
    from parley.arena.inference.backends import load_backend

    model = args.model or await asyncio.to_thread(model_for_size, args.model_size)
    options: dict[str, Any] = {"device": args.device} if args.backend == "transformers" else {}
    mixed = args.backend == "transformers" and args.mixed_rounds > 0
    continuous = await _mixed(str(model), options, args, progress) if mixed else {}
    if args.backend == "transformers":
        options["batching"] = args.batching
    if args.backend == "vllm" and args.adapters > 0:
        options.update(max_loras=args.adapters, max_lora_rank=args.lora_rank)
    backend = await load_backend(args.backend, str(model), **options)
    lora: dict[str, Any] = {}
    try:
        batch = _requests(backend.tokenizer, args.agents, args.max_tokens)
        await backend.generate(batch[:4])  # warm-up: first-call costs are not throughput
        best: dict[str, float] = {"sequential": 0.0, "direct_batch": 0.0, "pool": 0.0}
        mean_batch = 0.0
        task = progress.add_task("pool bench", total=3 * args.repeat)
        for _ in range(args.repeat):  # interleaved, so drifting load hits every path alike
            best["sequential"] = max(
                best["sequential"], await _sequential(backend, batch[: args.sequential_requests])
            )
            progress.advance(task)
            best["direct_batch"] = max(best["direct_batch"], await _direct(backend, batch))
            progress.advance(task)
            rate, batch_size = await _through_pool(backend, args)
            if rate > best["pool"]:
                best["pool"], mean_batch = rate, batch_size
            progress.advance(task)
        vocab = getattr(backend, "_vocab", None)  # the transformers backend computes masks
        mask = {"mask_cpu_us_per_token": round(mask_cost(vocab), 1)} if vocab else {}
        if args.adapters > 0:
            # transformers: the adapters go into a second backend; this one stays plain.
            second = args.backend == "transformers"
            holder = await load_backend(args.backend, str(model), **options) if second else None
            try:
                target, plain = (holder, backend) if holder is not None else (backend, None)
                lora = await measure(target, model, batch, args, progress, plain=plain)
            finally:
                if holder is not None:
                    await holder.close()
    finally:
        await backend.close()
    result = {
        "backend": args.backend,
        "model": str(model),
        "agents": args.agents,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "batching": options.get("batching", "engine"),
        "sequential_tokens_per_s": round(best["sequential"], 1),
        "direct_batch_tokens_per_s": round(best["direct_batch"], 1),
        "pool_tokens_per_s": round(best["pool"], 1),
        "pool_mean_batch_size": round(mean_batch, 2),
        "batched_ratio_vs_sequential": round(best["pool"] / best["sequential"], 3),
        "pool_ratio_vs_direct_batch": round(best["pool"] / best["direct_batch"], 3),
        **mask,
        **lora,
        **continuous,
    }
    result["targets"] = {k: f"{op} {v}" for k, (op, v) in TARGETS.items() if k in result}
    return result


def _meets(value: float, op: str, target: float) -> bool:
    return value >= target if op == ">=" else value <= target


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print tables (or JSON with ``--json``). Missed targets show red
    (and in the JSON); the exit status is 0 either way, as for the other benches."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    err = Console(stderr=True)
    with Progress(console=err, transient=True) as progress:
        result = asyncio.run(_bench(args, progress))
    targets = {k: t for k, t in TARGETS.items() if k in result}
    result["targets_met"] = all(_meets(result[k], op, v) for k, (op, v) in targets.items())
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(title=f"inference pool, {args.backend}, {args.agents} agents")
    table.add_column("path")
    table.add_column("tokens/s", justify="right")
    table.add_row("backend, one request at a time", f"{result['sequential_tokens_per_s']:,.0f}")
    table.add_row("backend, one batched call", f"{result['direct_batch_tokens_per_s']:,.0f}")
    table.add_row(
        f"pool over the bus (mean batch {result['pool_mean_batch_size']})",
        f"{result['pool_tokens_per_s']:,.0f}",
    )
    if "continuous_mixed_tokens_per_s" in result:
        for mode in ("static", "continuous"):
            table.add_row(
                f"pool, {mode} batching, 1-{result['mixed_max_tokens']} new tokens",
                f"{result[f'{mode}_mixed_tokens_per_s']:,.0f}",
            )
    if "multi_adapter_tokens_per_s" in result:
        table.add_row("pool, plain model (all at once)", f"{result['plain_tokens_per_s']:,.0f}")
        table.add_row(
            f"pool, {result['adapters']} LoRA adapters batched together",
            f"{result['multi_adapter_tokens_per_s']:,.0f}",
        )
    ratios = Table(title="ratios")
    ratios.add_column("ratio")
    ratios.add_column("value", justify="right")
    ratios.add_column("target", justify="right")
    for key, (op, target) in targets.items():
        ok = "green" if _meets(result[key], op, target) else "red"
        ratios.add_row(key, f"[{ok}]{result[key]:.2f}[/{ok}]", f"{op} {target}")
    out = Console()
    out.print(table)
    out.print(ratios)
    if "mask_cpu_us_per_token" in result:
        out.print(f"constraint mask: {result['mask_cpu_us_per_token']:,.1f} CPU µs per token")
    return 0
