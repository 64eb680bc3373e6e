"""LLM-agent episodes through the arena and the pool: prefix reuse on vs off, and vs offline.

LLM self-play (every seat an :class:`~parley.agents.llm.LLMAgent` of one shared policy,
the tiny model unless ``--model``; ``--model-size small`` builds a larger one) of each
``--scenarios`` entry, ``--episodes`` episodes at ``--concurrency`` at once, on the
transformers backend (``--backend vllm``: vLLM's automatic prefix caching, set per engine),
in one run:

* **before**: the backend without prefix reuse (``prefix_cache_bytes=0``) and folding
  just enough (``fold_to`` 1.0, the agent's default until the cache-friendly one): every
  turn prefills its whole prompt;
* **after**: prefix reuse on (:mod:`~parley.arena.inference.backends.prefix_cache`) and
  the agent's cache-friendly folding (``--fold-to``, default the agent's 0.5: once over its
  token budget, a chat folds whole old turns down to half the budget, so its beginning
  changes rarely);
* **after, fold 1.0**: prefix reuse with folding on every turn over the budget (what that
  costs the cache);
* **before, folded**: no prefix reuse, ``--fold-to`` folding: folding to half the budget
  also shortens the prompts, so ``speedup_same_folding`` (after ÷ this) is the speed-up of
  prefix reuse alone;
* **offline**: every generation of the *after* run issued to the backend as one batch (no
  turn dependencies). On the transformers backend this is no ideal: one batch pads every
  row to the longest prompt and reuses no prefix, so ``vs_offline`` exceeds 1.

Every arm's agents keep their own generated token ids in their next prompts
(``LLMAgentConfig.keep_token_ids``; ``--retokenize``: re-encode the chat's text every
turn, where a tiny model's random text often does not come back as the same ids and each
such turn misses the cache from its previous completion on).

Keys per scenario: ``prefill_ratio`` = prefilled prompt tokens ÷ Σ over seat-episodes of its
longest prompt (1.0: each seat-episode prefilled its context once; target <= 1.3 after),
``hit_rate`` (share of prompt tokens taken from the cache, folding on), per arm
``prefilled_tokens`` and ``longest_prompt_tokens`` (the ratio's two sides: under folding
the longest prompt is capped by the budget, so shorter prompts can raise the ratio while
fewer tokens are prefilled), ``folded_share`` (share of seat-episodes that folded),
``unfolded_per_longest`` (Σ tokens of each seat-episode's whole chat, nothing folded,
÷ Σ longest prompt: every token of a chat is computed once at least, generated (a reply)
or prefilled unless another seat's cached prompt shares it (a system prompt): where seats
fold, no folding takes ``prefill_ratio`` below this less those replies and shared tokens) and
``prefill_ratio_unfolded`` (prefilled ÷ those whole chats' tokens: what folding and misses
cost over computing each token once; equal to ``prefill_ratio`` where no seat folds, up to
the text chat's tokens vs the kept ids), ``episodes_per_s``,
``speedup_vs_before`` (episodes/s after ÷ before, target >= 2 on 10-turn episodes; it
includes the shorter folded prompts), ``speedup_same_folding``,
``vs_offline`` (episodes/s after ÷ the offline batch's), ``mean_batch_size`` (pool),
``continued_share`` (share of later turns whose prompt extends the previous prompt and
completion as cached: the others missed inside the chat, by a fold or a reply whose ids
did not come back), ``turns_per_seat_episode`` and ``same_actions`` (share of
seat-episodes whose generated tokens equal the *before* run's: prefix reuse changes
logprobs only by float rounding, so a seeded draw that falls within it of a token boundary
can flip; ``same_actions_fold`` is
the same between the two folded runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

FOLD_TO = 0.5  # LLMAgentConfig.fold_to's default (a test holds them equal)
TARGETS = {"prefill_ratio": ("<=", 1.3), "speedup_vs_before": (">=", 2.0)}
# 10+ turns per seat with the tiny model: simple-trade-v0 loses a turn to an invalid move
# where v1 and later end the game at the first (a random model's first move, usually); its
# invalid moves do not count as turns, so max_cycles (steps) bounds it.
SCENARIOS = (
    "negotiation/deal-or-no-deal-v3:max_turns=20",
    "tool_use/retail-desk-v3:max_steps=20",
    "negotiation/simple-trade-v0:max_turns=20,max_cycles=24",
)
ARMS: dict[str, dict[str, Any]] = {
    "before": {"cache": False, "fold": False},
    "before_fold": {"cache": False, "fold": True},
    "after": {"cache": True, "fold": True},
    "after_fold_1": {"cache": True, "fold": False},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), help="ID[:k=v,...]")
    parser.add_argument("--episodes", type=int, default=8, help="episodes per scenario and arm")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes at once")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per action")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="agent's budget")
    parser.add_argument(
        "--fold-to", type=float, default=FOLD_TO, help="after-arm folding (the agent's default)"
    )
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--model-size", choices=("tiny", "small"), default="tiny")
    parser.add_argument(
        "--retokenize",
        action="store_true",
        help="agents re-encode their chat's text every turn (LLMAgentConfig.keep_token_ids off)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        help="vLLM's KV block size, the granularity of its prefix reuse (default: vLLM's, "
        "128 on CPU, 16 on GPU)",
    )


def _parse(spec: str) -> tuple[str, dict[str, Any]]:
    """``ID:k=v,k=v`` -> (id, kwargs); values are ints where they parse."""
    name, _, rest = spec.partition(":")
    kwargs: dict[str, Any] = {}
    for pair in filter(None, rest.split(",")):
        key, _, value = pair.partition("=")
        kwargs[key] = int(value) if value.lstrip("-").isdigit() else value
    return name, kwargs


class _Seat:
    """The pool client of one seat-episode: records its requests (prompt lengths and the
    requests themselves, for the offline batch) and its generated tokens."""

    def __init__(self, pool: Any, log: list[_Seat]) -> None:
        self.pool = pool
        self.agent: Any = None  # the seat's LLMAgent (its whole chat, for the unfolded length)
        self.requests: list[Any] = []
        self.tokens: list[list[int]] = []
        log.append(self)

    async def generate(self, request: Any) -> Any:
        self.requests.append(request)
        result = await self.pool.generate(request)
        self.tokens.append(list(result.completions[0].token_ids))
        return result


async def _play(
    pool: Any, backend: Any, scenario: str, kwargs: dict[str, Any], fold: float, args: Any
) -> tuple[dict[str, Any], list[_Seat]]:
    """One arm of one scenario: its figures and its seats' logs."""
    from parley.agents.llm import LLMAgent, LLMAgentConfig
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner
    from parley.scenarios import make

    env = make(scenario, **kwargs)
    env.reset(seed=0)
    get = getattr(env, "system_prompt", None)
    prompts = {s: (str(get(s)) if callable(get) else "") for s in env.possible_agents}
    env.close()
    config = LLMAgentConfig(
        policy="bench",
        temperature=1.0,
        max_tokens=args.max_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        fold_to=fold,
        request_timeout=0.0,
        keep_token_ids=not args.retokenize,
    )
    seats: list[_Seat] = []

    def factory(seat: str) -> Any:
        def make_agent() -> Any:
            client = _Seat(pool, seats)
            client.agent = LLMAgent(
                client, backend.tokenizer, system_prompt=prompts[seat], config=config
            )
            return client.agent

        return make_agent

    run_config = RunConfig(
        scenario=scenario,
        scenario_kwargs=kwargs,
        agents={s: "llm:bench" for s in prompts},
        episodes=args.episodes,
        concurrency=args.concurrency,
        progress=False,
        act_timeout=600.0,
    )
    runner = Runner(run_config, agents={s: factory(s) for s in prompts})
    stats = _stats(backend)
    before = (stats.prompt_tokens, stats.prefilled_tokens)
    requests_before = (pool.stats.batched_requests, pool.stats.batches)
    started = time.perf_counter()
    summary = (await runner.run()).summary
    wall = time.perf_counter() - started
    if summary["episodes"]["failed"]:
        raise RuntimeError(f"{scenario}: {summary['episodes']['failed']} episodes failed")
    prompt = stats.prompt_tokens - before[0]
    prefilled = stats.prefilled_tokens - before[1]
    played = [s for s in seats if s.requests]
    longest = sum(max(len(r.prompt_token_ids) for r in s.requests) for s in played)
    unfolded = [s.agent.unfolded_prompt_tokens() for s in played]
    folded = sum(s.agent.folded > 0 for s in played)
    batches = pool.stats.batches - requests_before[1]
    figures = {
        "episodes_per_s": round(args.episodes / wall, 3),
        "prefill_ratio": round(prefilled / max(longest, 1), 3),
        "prefill_ratio_unfolded": round(prefilled / max(sum(unfolded), 1), 3),
        "unfolded_per_longest": round(sum(unfolded) / max(longest, 1), 3),
        "folded_share": round(folded / max(len(played), 1), 3),
        "hit_rate": round(1 - prefilled / prompt, 3) if prompt else 0.0,
        "prefilled_tokens": prefilled,
        "longest_prompt_tokens": longest,
        "continued_share": _continued_share(seats),
        "turns_per_seat_episode": round(sum(len(s.requests) for s in seats) / len(seats), 2),
        "mean_batch_size": round(
            (pool.stats.batched_requests - requests_before[0]) / max(batches, 1), 2
        ),
    }
    return figures, seats


def _continued_share(seats: list[_Seat]) -> float:
    """Share of later turns whose prompt starts with the previous turn's prompt and
    generated tokens but the last (what the backend caches): the rest missed the cache
    inside the chat so far (a fold, or a reply that did not come back as the same ids)."""
    pairs = [(s, t) for s in seats for t in range(1, len(s.requests))]
    hits = 0
    for seat, t in pairs:
        kept = [*seat.requests[t - 1].prompt_token_ids, *seat.tokens[t - 1][:-1]]
        hits += list(seat.requests[t].prompt_token_ids[: len(kept)]) == kept
    return round(hits / max(len(pairs), 1), 3)


def _same_actions(a: list[_Seat], b: list[_Seat]) -> float:
    """Share of ``a``'s seat-episodes with a seat-episode of ``b`` of the same first prompt
    (the episode's deal and seat) that generated the same tokens throughout."""

    def key(seat: _Seat) -> tuple[Any, ...]:
        first = tuple(seat.requests[0].prompt_token_ids) if seat.requests else ()
        return first, tuple(tuple(t) for t in seat.tokens)

    matched = Counter(map(key, a)) & Counter(map(key, b))
    return round(sum(matched.values()) / max(len(a), 1), 3)


async def _offline(backend: Any, seats: list[Any], episodes: int) -> float:
    """Episodes/s of the same generations issued to the backend as one batch
    (transformers: with prefix reuse off, as nothing in one batch reuses another row)."""
    requests = [r for s in seats for r in s.requests]
    cache = getattr(backend, "prefix_cache", None)
    budget, started = (cache.budget if cache is not None else 0), time.perf_counter()
    if cache is not None:
        cache.budget = 0
    await backend.generate(requests)
    if cache is not None:
        cache.budget = budget
    return episodes / (time.perf_counter() - started)


async def _load(kind: str, model: Path, cache: bool, block_size: int | None = None) -> Any:
    """A backend of ``kind`` with prefix reuse on or off (vLLM: ``block_size`` if given)."""
    from parley.arena.inference.backends import load_backend

    if kind == "vllm":
        engine_args: dict[str, Any] = {"enable_prefix_caching": cache}
        if block_size:
            engine_args["block_size"] = block_size
        options: dict[str, Any] = {"engine_args": engine_args}
    else:
        options = {} if cache else {"prefix_cache_bytes": 0}
    return await load_backend(kind, str(model), **options)


def _stats(backend: Any) -> Any:
    """The backend's prompt/prefilled token counters (PrefixStats)."""
    return backend.prefix_stats if hasattr(backend, "prefix_stats") else backend.prefix_cache.stats


async def _forget(backend: Any) -> None:
    """Drop every cached prefix: each measured run starts cold."""
    if hasattr(backend, "prefix_cache"):
        backend.prefix_cache.clear()
    else:
        await backend.engine.reset_prefix_cache()


async def _bench(args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    from parley.arena.bench.pool_lora import model_for_size
    from parley.arena.inference.pool import InferencePool, PoolConfig

    model = args.model or await asyncio.to_thread(model_for_size, args.model_size)
    specs = [_parse(spec) for spec in args.scenarios]
    arms: dict[str, dict[str, dict[str, Any]]] = {spec: {} for spec in args.scenarios}
    logs: dict[str, dict[str, list[_Seat]]] = {spec: {} for spec in args.scenarios}
    offline: dict[str, float] = {}
    prefix_caching = False
    task = progress.add_task("llm-episodes bench", total=len(specs) * len(ARMS))
    # transformers: one backend, prefix reuse switched per arm, so the arms of a scenario
    # run back to back under the same load. vLLM sets it per engine: one engine without
    # prefix caching, then one with it (one engine at a time).
    passes = [(False,), (True,)] if args.backend == "vllm" else [(False, True)]
    for caches in passes:
        backend = await _load(args.backend, model, caches[-1], args.block_size)
        budget = backend.prefix_cache.budget if hasattr(backend, "prefix_cache") else 0
        prefix_caching = prefix_caching or bool(getattr(backend, "prefix_caching", True))
        try:
            config = PoolConfig()
            async with InferencePool({"bench": backend}, config, owns_backends=False) as pool:
                for spec, (scenario, kwargs) in zip(args.scenarios, specs, strict=True):
                    for arm, how in ARMS.items():
                        if how["cache"] not in caches:
                            continue
                        await _forget(backend)
                        if hasattr(backend, "prefix_cache"):
                            backend.prefix_cache.budget = budget if how["cache"] else 0
                        fold = args.fold_to if how["fold"] else 1.0
                        figs, seats = await _play(pool, backend, scenario, kwargs, fold, args)
                        arms[spec][arm], logs[spec][arm] = figs, seats
                        progress.advance(task)
                    if caches[-1]:  # the after run's generations, as one batch, from cold
                        await _forget(backend)
                        offline[spec] = await _offline(backend, logs[spec]["after"], args.episodes)
        finally:
            await backend.close()
    results: dict[str, Any] = {}
    for spec in args.scenarios:
        after, plain = arms[spec]["after"], arms[spec]["before"]
        results[spec] = {
            **{f"{arm}_{k}": v for arm, figs in arms[spec].items() for k, v in figs.items()},
            "prefill_ratio": after["prefill_ratio"],
            "hit_rate": after["hit_rate"],
            "prefill_ratio_unfolded": after["prefill_ratio_unfolded"],
            "folded_share": after["folded_share"],
            "speedup_vs_before": round(after["episodes_per_s"] / plain["episodes_per_s"], 3),
            "speedup_same_folding": round(
                after["episodes_per_s"] / arms[spec]["before_fold"]["episodes_per_s"], 3
            ),
            "offline_episodes_per_s": round(offline[spec], 3),
            "vs_offline": round(after["episodes_per_s"] / offline[spec], 3),
            "same_actions": _same_actions(logs[spec]["after_fold_1"], logs[spec]["before"]),
            "same_actions_fold": _same_actions(logs[spec]["after"], logs[spec]["before_fold"]),
        }
    return {
        "backend": args.backend,
        "prefix_caching": prefix_caching,
        "model": str(model),
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "max_prompt_tokens": args.max_prompt_tokens,
        "fold_to": args.fold_to,
        "block_size": args.block_size,
        "keep_token_ids": not args.retokenize,
        "scenarios": results,
        "targets": {k: f"{op} {v}" for k, (op, v) in TARGETS.items()},
    }


def _meets(value: float, op: str, target: float) -> bool:
    return value >= target if op == ">=" else value <= target


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``). Exit status 0 either way,
    as for the other benches; missed targets show red (and ``targets_met`` in the JSON)."""
    import os

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    if args.block_size is not None and (args.backend != "vllm" or args.block_size < 1):
        print(
            "--block-size is vLLM's KV block size: give a positive number with --backend vllm "
            "(the transformers backend reuses prefixes token by token)",
            file=sys.stderr,
        )
        return 2
    with Progress(console=Console(stderr=True), transient=True) as progress:
        result = asyncio.run(_bench(args, progress))
    result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    result["targets_met"] = all(
        _meets(figs[k], op, v)
        for figs in result["scenarios"].values()
        for k, (op, v) in TARGETS.items()
    )
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(title=f"LLM self-play, {args.backend}, {args.episodes} episodes each")
    keys = [
        *("before_prefill_ratio", "prefill_ratio", "after_fold_1_hit_rate", "hit_rate"),
        *("speedup_vs_before", "vs_offline", "same_actions"),
    ]
    table.add_column("scenario")
    for key in keys:
        table.add_column(key, justify="right")
    for spec, figs in result["scenarios"].items():
        cells = []
        for key in keys:
            op_target = TARGETS.get(key)
            ok = op_target is None or _meets(figs[key], *op_target)
            cells.append(f"{figs[key]:.2f}" if ok else f"[red]{figs[key]:.2f}[/red]")
        table.add_row(spec, *cells)
    Console().print(table)
    return 0
