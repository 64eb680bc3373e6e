"""Prefix reuse in the transformers backend: the same tokens and logprobs as a full
recompute, fewer prefilled tokens, bounded memory, and no stale keys after a weight change."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from parley.arena.inference.backends import load_backend  # noqa: E402
from parley.arena.inference.backends.prefix_cache import PrefixCache  # noqa: E402
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402
from parley.protocols.messages import (  # noqa: E402
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def backend(tiny_model_dir: Path) -> TransformersBackend:
    b = await load_backend("transformers", str(tiny_model_dir))
    assert isinstance(b, TransformersBackend)
    yield b
    await b.close()


def request(ids: list[int], **params: object) -> GenerateRequest:
    params = {"max_tokens": 8, "logprobs": True, **params}
    return GenerateRequest(prompt_token_ids=ids, params=SamplingParams(**params))  # type: ignore[arg-type]


def chat(b: TransformersBackend, *texts: str) -> list[int]:
    roles = ["user", "assistant"]
    msgs = [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]
    return b.tokenizer.encode_chat(msgs)


async def recompute(b: TransformersBackend, reqs: list[GenerateRequest]) -> list[GenerateResult]:
    """The same requests with no prefix cache (every prompt fully prefilled)."""
    kept, b.prefix_cache = b.prefix_cache, PrefixCache(0)
    try:
        return await b.generate(reqs)
    finally:
        b.prefix_cache = kept


def assert_same(got: list[GenerateResult], want: list[GenerateResult]) -> None:
    for g, w in zip(got, want, strict=True):
        for cg, cw in zip(g.completions, w.completions, strict=True):
            assert cg.token_ids == cw.token_ids
            np.testing.assert_allclose(cg.logprobs, cw.logprobs, atol=1e-5, rtol=0)
            for tg, tw in zip(cg.top_logprobs, cw.top_logprobs, strict=True):
                np.testing.assert_allclose(tg, tw, atol=1e-5, rtol=0)


async def test_next_turn_prefills_only_its_new_tokens(backend: TransformersBackend) -> None:
    first = chat(backend, "I offer 2 books and 1 hat")
    (r1,) = await backend.generate([request(first, temperature=0)])
    turn = r1.completions[0].token_ids
    second = first + turn + chat(backend, "deny, give me the ball")[1:]
    stats = backend.prefix_cache.stats
    before = stats.prefilled_tokens
    req = request(second, temperature=0, top_logprobs=3)
    got = await backend.generate([req])
    # Cached: the first prompt and every fed completion token (the last one never was).
    assert stats.prefilled_tokens - before == len(second) - (len(first) + len(turn) - 1)
    assert_same(got, await recompute(backend, [req]))


async def test_batch_of_rows_with_different_cached_lengths_is_exact(
    backend: TransformersBackend,
) -> None:
    base = chat(backend, "What is your name? " * 3)
    (r1,) = await backend.generate([request(base, temperature=0, max_tokens=12)])
    seen = base + r1.completions[0].token_ids
    reqs = [
        request(seen + chat(backend, "ok")[1:], temperature=1.0, seed=3, top_logprobs=4),
        request([*base[: len(base) // 2], 7, 8, 9], temperature=0.7, top_p=0.9, seed=5),
        request(base[:5], temperature=0, n=2),  # shorter than the entry: all but one cached
        request(chat(backend, "3"), temperature=1.0, seed=11),  # shares only the template
        request(seen + seen[:20], temperature=0),
    ]
    before = backend.prefix_cache.stats.prefilled_tokens
    got = await backend.generate(reqs)
    prefilled = backend.prefix_cache.stats.prefilled_tokens - before
    full = sum(len(r.prompt_token_ids) * r.params.n for r in reqs)
    assert prefilled < full / 2
    assert_same(got, await recompute(backend, reqs))


async def test_a_weight_update_drops_the_cached_keys(backend: TransformersBackend) -> None:
    prompt = chat(backend, "hi there")
    (r1,) = await backend.generate([request(prompt, temperature=0)])
    name, weight = next(
        (k, v) for k, v in backend.model.state_dict().items() if k.endswith("k_proj.weight")
    )
    changed = {name: (weight * 1.5).numpy()}
    await backend.update_weights(WeightUpdate(policy="default", version=1, tensors=changed))
    assert len(backend.prefix_cache) == 0
    req = request(prompt + r1.completions[0].token_ids + [5, 6], temperature=0)
    assert_same(await backend.generate([req]), await recompute(backend, [req]))


def entry_kv(tokens: int) -> list[tuple[object, object]]:
    """One layer of keys and values for ``tokens`` tokens: 2 x 4 x tokens x 8 bytes."""
    return [(torch.zeros(1, tokens, 1), torch.zeros(1, tokens, 1))]


def test_a_flood_of_one_off_prompts_does_not_evict_reused_sessions() -> None:
    cache = PrefixCache(budget_bytes=8 * 1000)  # 1000 tokens of entry_kv
    session = list(range(100))
    cache.store("p", session, entry_kv(100), hit=None)
    hit, reused = cache.lookup("p", [*session, 500])
    assert hit is not None
    assert reused == 100
    cache.store("p", [*session, 500, 501], entry_kv(102), hit)  # the session's next turn
    assert len(cache) == 1  # the continued entry replaced its prefix
    for i in range(200):  # a client looping on prompts nobody reuses
        cache.store("p", [10_000 + i] * 150, entry_kv(150), hit=None)
        assert cache.nbytes <= cache.budget
    hit, reused = cache.lookup("p", [*session, 500, 501, 7])
    assert reused == 102
    cache.store("p", [1] * 300, entry_kv(300), hit=None)  # over a quarter of the budget
    assert cache.stats.refused == 1
    assert cache.lookup("q", session) == (None, 0)  # entries are per policy


async def folded_episode(backend: TransformersBackend, fold_to: float) -> tuple[int, float]:
    """An LLM agent's 16 turns at a prompt budget it outgrows: (turns whose prompt starts
    differently from the turn before, the backend's prefix hit rate)."""
    from parley.agents.llm import LLMAgent, LLMAgentConfig
    from parley.arena.inference.pool import InferencePool, PoolConfig
    from parley.protocols.messages import Observation

    backend.prefix_cache.clear()
    backend.prefix_cache.reset_stats()
    config = LLMAgentConfig(max_tokens=6, max_prompt_tokens=200, fold_to=fold_to)
    async with InferencePool({"default": backend}, PoolConfig(), owns_backends=False) as pool:
        agent = LLMAgent(pool, backend.tokenizer, system_prompt="You trade hats.", config=config)
        agent.reset(seed=0)
        prompts = []
        for i in range(16):
            text = f"offer {i}: two hats for one book and " + "a ball " * 4
            action = await agent.act(Observation(agent="player_0", text=text))
            prompts.append(action.tokens[0].prompt_token_ids)
    starts = [tuple(p[:40]) for p in prompts]
    changes = sum(a != b for a, b in itertools.pairwise(starts))
    return changes, backend.prefix_cache.stats.hit_rate


async def test_folding_in_blocks_keeps_the_prefix_and_the_cache_hits(
    backend: TransformersBackend,
) -> None:
    every_turn, low_hits = await folded_episode(backend, 1.0)
    blocks, hits = await folded_episode(backend, 0.5)
    assert every_turn >= 10  # at its budget, the default folds (and changes) every turn
    assert blocks <= every_turn / 3
    assert hits > low_hits + 0.2


@pytest.mark.slow
def test_bench_llm_episodes_reports_prefill_ratios(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``parley bench llm-episodes --json`` on a short self-play: reuse lowers the prefill
    ratio and leaves the sampled tokens as they were."""
    import argparse
    import json

    from parley.arena.bench import llm_episodes

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    llm_episodes.add_arguments(parser)
    spec = "negotiation/deal-or-no-deal-v3:max_turns=6"
    args = parser.parse_args(
        ["--json", "--model", str(tiny_model_dir), "--episodes", "2", "--max-tokens", "4"]
    )
    args.scenarios = [spec]
    assert llm_episodes.run(args) == 0
    figs = json.loads(capsys.readouterr().out)["scenarios"][spec]
    assert figs["before_prefill_ratio"] > 1.5
    assert figs["prefill_ratio"] < figs["before_prefill_ratio"] / 1.5
    assert figs["hit_rate"] > 0.3
    assert figs["same_actions"] == 1.0


@pytest.mark.parametrize(
    "argv", [["--block-size", "32"], ["--backend", "vllm", "--block-size", "0"]]
)
def test_bench_llm_episodes_refuses_a_block_size_vllm_would_not_take(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--block-size`` is vLLM's: on the transformers backend (which reuses prefixes token by
    token) or not positive it is refused before any model loads, saying what to give."""
    import argparse

    from parley.arena.bench import llm_episodes

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    llm_episodes.add_arguments(parser)
    assert llm_episodes.run(parser.parse_args(argv)) == 2
    assert "positive number with --backend vllm" in capsys.readouterr().err


async def test_an_adapter_never_reuses_keys_computed_without_it(
    backend: TransformersBackend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from tests.arena.inference.lora_util import make_adapter

    prompt = chat(backend, "I offer 2 books and 1 hat")
    # Before "alice" exists, its requests decode with the base and are cached under it.
    (r1,) = await backend.generate([GenerateRequest(policy="alice", **vars_of(prompt))])
    await backend.add_adapter("alice", str(make_adapter(tiny_model_dir, tmp_path / "a")))
    ids = prompt + r1.completions[0].token_ids + [5, 6]
    req = GenerateRequest(policy="alice", **vars_of(ids))
    assert_same(await backend.generate([req]), await recompute(backend, [req]))


def vars_of(ids: list[int]) -> dict[str, object]:
    r = request(ids, temperature=0)
    return {"prompt_token_ids": r.prompt_token_ids, "params": r.params}
