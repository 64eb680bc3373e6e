"""The LLM agent on the tiny model through a real pool: token records, constraints, budget."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import zmq.asyncio

from parley.agents.llm import BusPoolClient, LLMAgent, LLMAgentConfig, parse_action
from parley.protocols.bus import Endpoint
from parley.protocols.messages import Constraint, GenerateRequest, Observation, SamplingParams

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend
from parley.arena.inference.pool import InferencePool, PoolConfig

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def pool(tiny_model_dir: Path) -> AsyncIterator[InferencePool]:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.01)) as p:
        yield p


def agent(pool: InferencePool, **config: object) -> LLMAgent:
    cfg = LLMAgentConfig(**{"max_tokens": 6, **config})  # type: ignore[arg-type]
    return LLMAgent(pool, pool.tokenizer("default"), system_prompt="You trade hats.", config=cfg)


def observation(text: str, **info: object) -> Observation:
    return Observation(agent="player_0", text=text, info=dict(info))


async def test_records_exactly_what_the_backend_generated(pool: InferencePool) -> None:
    a = agent(pool)
    a.reset(seed=7)
    action = await a.act(observation("I offer two hats."))
    (record,) = action.tokens
    assert (record.policy, record.policy_version) == ("default", 0)
    assert len(record.token_ids) == len(record.logprobs) > 0
    # Replaying the recorded request on the backend alone gives the same tokens and
    # logprobs: the record is what the model produced, not a re-tokenisation of the text.
    # The agent derives each request's seed from its episode seed.
    seed = int(np.random.default_rng(7).integers(2**31 - 1))
    replay = GenerateRequest(
        prompt_token_ids=record.prompt_token_ids,
        params=SamplingParams(max_tokens=6, seed=seed),
    )
    (direct,) = await pool.backend("default").generate([replay])
    assert direct.completions[0].token_ids == record.token_ids
    assert direct.completions[0].logprobs == pytest.approx(record.logprobs, abs=1e-5)
    tok = pool.tokenizer("default")
    prompt = tok.decode(record.prompt_token_ids)
    assert "You trade hats." in prompt
    assert "I offer two hats." in prompt


async def test_history_grows_turn_by_turn(pool: InferencePool) -> None:
    a = agent(pool)
    a.reset(seed=1)
    first = await a.act(observation("first message"))
    second = await a.act(observation("second message"))
    p1, p2 = first.tokens[0].prompt_token_ids, second.tokens[0].prompt_token_ids
    assert p2[: len(p1)] == p1  # the second prompt extends the first chat
    text = pool.tokenizer("default").decode(p2)
    assert text.index("first message") < text.index("second message")
    a.reset(seed=1)
    again = await a.act(observation("first message"))
    assert again.tokens[0].prompt_token_ids == p1  # reset forgets the episode
    assert again.tokens[0].token_ids == first.tokens[0].token_ids  # same seed, same sample


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_choice_constraint_holds_end_to_end(pool: InferencePool, seed: int) -> None:
    a = agent(pool, max_tokens=12)
    a.reset(seed=seed)
    choices = ["accept", "reject", "counter offer"]
    action = await a.act(observation("Deal?", constraint={"type": "choice", "choices": choices}))
    assert action.text in choices


async def test_regex_constraint_holds_end_to_end(pool: InferencePool) -> None:
    a = agent(pool, max_tokens=20)
    pattern = r"book=[0-3] hat=[0-2] ball=[0-1]"
    for seed in range(3):
        a.reset(seed=seed)
        constraint = Constraint(type="regex", pattern=pattern)
        action = await a.act(observation("Your claim?", constraint=constraint))
        assert re.fullmatch(pattern, action.text), action.text


async def test_oldest_turns_fold_to_fit_the_budget(pool: InferencePool) -> None:
    a = agent(pool, max_prompt_tokens=120)
    a.reset(seed=0)
    records = []
    for i in range(8):
        action = await a.act(observation(f"message {i}: " + "hats and books " * 6))
        records.append(action.tokens[0])
    assert all(len(r.prompt_token_ids) <= 120 for r in records)
    last = pool.tokenizer("default").decode(records[-1].prompt_token_ids)
    assert "earlier messages omitted" in last
    assert "message 7" in last
    assert "message 0" not in last
    assert "You trade hats." in last  # the system prompt is never folded


async def test_an_overlong_observation_keeps_its_end(pool: InferencePool) -> None:
    a = agent(pool, max_prompt_tokens=40)
    a.reset(seed=0)
    action = await a.act(observation("filler " * 200 + "THE END"))
    prompt = action.tokens[0].prompt_token_ids
    assert len(prompt) <= 40
    assert "THE END" in pool.tokenizer("default").decode(prompt)


async def test_observation_info_overrides_the_system_prompt(pool: InferencePool) -> None:
    a = agent(pool)
    action = await a.act(observation("hello", system_prompt="You are the seller."))
    text = pool.tokenizer("default").decode(action.tokens[0].prompt_token_ids)
    assert "You are the seller." in text
    assert "You trade hats." not in text


async def test_agent_over_the_bus(pool: InferencePool) -> None:
    ctx = zmq.asyncio.Context()
    try:
        async with Endpoint("pool", context=ctx) as server:
            pool.serve(server)
            address = await server.bind("inproc://test-llm-agent-bus")
            client = await BusPoolClient.connect(address, context=ctx, timeout=10)
            try:
                a = LLMAgent(client, pool.tokenizer("default"), config=LLMAgentConfig(max_tokens=4))
                a.reset(seed=3)
                action = await a.act(observation("hi"))
            finally:
                await client.close()
    finally:
        ctx.term()
    assert len(action.tokens[0].token_ids) == len(action.tokens[0].logprobs) > 0


async def test_an_overloaded_pool_is_retried(tiny_model_dir: Path) -> None:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    # A queue of one: concurrent agents are refused until the pool has room, then retried.
    async with InferencePool({"default": backend}, PoolConfig(max_queue=1, max_wait=0)) as pool:
        agents = [agent(pool, backoff=0.01, retries=20) for _ in range(4)]
        for i, a in enumerate(agents):
            a.reset(seed=i)
        actions = await asyncio.gather(*(a.act(observation("go")) for a in agents))
    assert pool.stats.overloaded > 0
    assert all(act.tokens for act in actions)


def test_parse_action() -> None:
    choice = Constraint(type="choice", choices=["accept", "reject"])
    assert parse_action("  accept \n", choice) == "accept"
    assert parse_action("reject because", choice) == "reject"
    assert parse_action("acceptable", choice) == "acceptable"  # as-is: an invalid move
    assert parse_action("garbage", None) == "garbage"
