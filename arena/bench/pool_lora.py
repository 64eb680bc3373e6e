"""The cost of per-seat LoRA adapters in the pool: N adapters batched together ÷ the plain model.

``multi_adapter_ratio_vs_single`` (target >= 0.7): the same requests (same prompts, same
seeds, temperature 1) through ONE pool, all at once, first on the plain model, then with
``--adapters`` N LoRA adapters loaded into that pool's backend and the requests spread over
them round-robin (every batch mixes all N). Each figure is generated tokens/s, the best of
``--repeat``.

The adapters are peft adapters of rank ``--lora-rank`` on every linear layer of the blocks
(q, k, v, o, gate, up, down) with random ``A`` and ``B = 0`` (how peft initialises an
adapter before training): the model's outputs are then exactly the base's, so both runs
generate the same tokens — equal token counts, equal batch shapes as rows finish — and the
ratio is the cost of the LoRA computation alone (which does not depend on the values).
``same_tokens`` says whether the completions were indeed identical.

transformers: the plain model is a second backend of the same model in the same pool, and
the plain and adapter runs take turns (a drifting load on a shared machine hits both
alike). vLLM: one engine (a second would need its own share of GPU memory), started with
LoRA enabled (``max_loras`` = N; it must be, to take adapters later); the plain figure is
the base on that engine before any adapter is loaded. Also reported:
``base_with_adapters_tokens_per_s``, the plain requests on the backend holding the adapters,
``multi_adapter_mean_batch_size``, requests per backend call in the adapter runs (1 on
vLLM, whose engine batches concurrent calls itself), and (transformers)
``multi_adapter_ratio_median_of_turns``, the median of the per-turn ratios.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["measure", "model_for_size"]

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

SIZES: dict[str, dict[str, int]] = {
    "tiny": {},  # TinyModelConfig's defaults: hidden 128, 2 layers (~0.43 M parameters)
    "small": {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "intermediate_size": 1024},
}
"""``--model-size`` -> TinyModelConfig fields: built locally, no download."""


def model_for_size(size: str) -> Path:
    """The locally built model of ``size`` (built on first use, cached)."""
    from parley.arena.inference.models.tiny import (
        TinyModelConfig,
        build_tiny_model,
        default_model_dir,
        ensure_tiny_model,
    )

    if size == "tiny":
        return ensure_tiny_model()
    directory = default_model_dir().parent / f"{size}-model"
    if not (directory / "config.json").is_file():
        build_tiny_model(directory, TinyModelConfig(**SIZES[size]))
    return directory


async def _rate(pool: Any, requests: list[Any]) -> tuple[float, list[list[int]]]:
    """Generated tokens/s of ``requests`` sent to ``pool`` all at once; their tokens."""
    started = time.perf_counter()
    results = await asyncio.gather(*(pool.generate(r) for r in requests))
    wall = time.perf_counter() - started
    tokens = [c.token_ids for r in results for c in r.completions]
    return sum(map(len, tokens)) / wall, tokens


async def measure(
    backend: Any, model: Path, requests: list[Any], args: Any, progress: Any, plain: Any = None
) -> dict[str, Any]:
    """The multi-adapter figures for ``requests``: the adapters go into ``backend`` (which
    serves ``model``); the plain figure comes from ``plain``, a second backend of the same
    model in the same pool, when given (then the two are measured in turns, so a drifting
    load on a shared machine hits both alike), else from ``backend`` before any adapter."""
    import msgspec

    from parley.arena.inference.backends.lora import save_random_adapter
    from parley.arena.inference.pool import InferencePool, PoolConfig

    n = args.adapters
    config = PoolConfig(max_batch_size=max(len(requests), 1), max_wait=0.02)
    backends = {"base": backend} if plain is None else {"base": backend, "plain": plain}
    as_plain = [msgspec.structs.replace(r, policy="plain" if plain else "base") for r in requests]
    as_base = [msgspec.structs.replace(r, policy="base") for r in requests]
    as_lora = [msgspec.structs.replace(r, policy=f"lora{i % n}") for i, r in enumerate(requests)]
    rates: dict[str, list[float]] = {"plain": [], "adapters": [], "base": []}
    tokens: dict[str, list[list[int]]] = {}

    sizes: list[float] = []  # mean batch size of each adapter run

    async def measure_once(pool: Any, name: str, batch: list[Any]) -> None:
        before = (pool.stats.batches, pool.stats.batched_requests)
        rate, tokens[name] = await _rate(pool, batch)
        rates[name].append(rate)
        if name == "adapters":
            calls = pool.stats.batches - before[0]
            sizes.append((pool.stats.batched_requests - before[1]) / max(calls, 1))
        progress.advance(task)

    task = progress.add_task("multi-adapter bench", total=3 * args.repeat)
    async with InferencePool(backends, config, owns_backends=False) as pool:
        await _rate(pool, as_plain)  # warm-up
        for _ in range(args.repeat if plain is None else 0):
            await measure_once(pool, "plain", as_plain)
        with tempfile.TemporaryDirectory(prefix="parley-bench-lora-") as tmp:
            for i in range(n):
                path = save_random_adapter(
                    model, Path(tmp) / f"a{i}", seed=i, rank=args.lora_rank,
                    targets=LORA_TARGETS, zero_b=True,
                )  # fmt: skip
                await pool.add_adapter(f"lora{i}", "base", str(path))
        await _rate(pool, as_lora)  # warm-up with adapters
        for _ in range(args.repeat):
            if plain is not None:
                await measure_once(pool, "plain", as_plain)
            await measure_once(pool, "adapters", as_lora)
            await measure_once(pool, "base", as_base)
    best = {name: max(values) for name, values in rates.items()}
    # Runs taken in turns (transformers) also give one ratio per turn: their median is
    # steadier than best ÷ best on a machine whose load drifts within seconds.
    pairs = [a / p for a, p in zip(rates["adapters"], rates["plain"], strict=False)]
    paired = plain is not None
    return {
        "adapters": n,
        "lora_rank": args.lora_rank,
        "lora_targets": list(LORA_TARGETS),
        "plain_tokens_per_s": round(best["plain"], 1),
        "multi_adapter_tokens_per_s": round(best["adapters"], 1),
        "base_with_adapters_tokens_per_s": round(best["base"], 1),
        "multi_adapter_ratio_vs_single": round(best["adapters"] / best["plain"], 3),
        "multi_adapter_ratio_median_of_turns": round(statistics.median(pairs), 3)
        if paired
        else None,
        "multi_adapter_mean_batch_size": round(min(sizes), 2),
        "same_tokens": tokens["plain"] == tokens["adapters"],
        "generated_tokens": [sum(map(len, tokens["plain"])), sum(map(len, tokens["adapters"]))],
    }
