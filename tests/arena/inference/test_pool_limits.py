"""Every request field's range, checked at the pool's door (in-process and over the bus)."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zmq.asyncio

from parley.agents.llm import BusPoolClient
from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError
from parley.protocols.bus import Endpoint
from parley.protocols.errors import RemoteError
from parley.protocols.messages import Constraint, GenerateRequest, SamplingParams

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend

pytestmark = pytest.mark.timeout(120)


def req(
    prompt: str = "hat",
    constraint: Constraint | None = None,
    timeout: float = 0.0,
    **params: object,
) -> GenerateRequest:
    return GenerateRequest(
        policy="p",
        prompt=prompt,
        params=SamplingParams(**{"max_tokens": 3, **params}),  # type: ignore[arg-type]
        constraint=constraint,
        timeout=timeout,
    )


BAD: list[tuple[GenerateRequest, str]] = [
    (req(seed=2**63), "seed"),
    (req(seed=2**64 - 1, n=2), "seed"),
    (req(seed=2**63 - 1, n=2), "seed"),
    (req(seed=-1), "seed"),
    (req(n=0), "n"),
    (req(n=129), "n"),
    (req(max_tokens=0), "max_tokens"),
    (req(max_tokens=2**31), "max_tokens"),
    (req(temperature=math.nan), "temperature"),
    (req(temperature=math.inf), "temperature"),
    (req(temperature=1e-9), "temperature"),
    (req(temperature=-1.0), "temperature"),
    (req(top_p=math.nan), "top_p"),
    (req(top_p=0.0), "top_p"),
    (req(stop=[""]), "stop"),
    (req(stop=["x"] * 33), "stop"),
    (req(stop=["x" * 1025]), "stop"),
    (req(prompt=""), "prompt"),
    (req(top_logprobs=21), "top_logprobs"),
    (req(top_logprobs=-1), "top_logprobs"),
    (req(top_logprobs=3, logprobs=False), "top_logprobs"),
    (req(timeout=-1.0), "timeout"),
    (req(timeout=math.nan), "timeout"),
    (req(constraint=Constraint(type="choice", choices=[])), "constraint"),
    (req(constraint=Constraint(type="choice", choices=["a"] * 5000)), "constraint"),
    (req(constraint=Constraint(type="json", json_schema='{"enum": []}')), "constraint"),
    (req(constraint=Constraint(type="json", json_schema='{"anyOf": []}')), "constraint"),
    (req(constraint=Constraint(type="regex", pattern="(?!)a")), "constraint"),
    (
        req(constraint=Constraint(type="json", json_schema='{"type": "string", "format": "x"}')),
        "constraint",
    ),
    (GenerateRequest(policy="p", prompt_token_ids=[1, -5]), "prompt_token_ids"),
    (GenerateRequest(policy="p", prompt_token_ids=[10**6]), "prompt_token_ids"),
    (GenerateRequest(policy="p", prompt_token_ids=[5] * 3000), "prompt"),
]

GOOD = [
    req(seed=2**63 - 2, n=2),
    req(seed=0, temperature=1e-5),
    req(seed=1, temperature=100.0, top_p=1e-9),
    req(seed=2, stop=["x" * 1024] * 32),
    req(seed=3, constraint=Constraint(type="choice", choices=["deal", "no deal"])),
    req(seed=4, top_logprobs=20, n=2),
]


@pytest.fixture
async def pool(tiny_model_dir: Path) -> AsyncIterator[InferencePool]:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"p": backend}, PoolConfig(max_wait=0.2)) as p:
        yield p


async def test_bad_requests_mixed_with_good_ones_in_process(pool: InferencePool) -> None:
    alone = [await pool.generate(r) for r in GOOD]
    answers = await asyncio.gather(
        *(pool.generate(r) for r in [*GOOD, *(b for b, _ in BAD)]), return_exceptions=True
    )
    for got, want in zip(answers[: len(GOOD)], alone, strict=True):
        assert not isinstance(got, BaseException), got
        assert [c.text for c in got.completions] == [c.text for c in want.completions]
    for got, (bad, field) in zip(answers[len(GOOD) :], BAD, strict=True):
        assert isinstance(got, PoolError), (bad, got)
        assert got.code == "bad_request", (bad, got.message)
        assert got.param == field, (bad, got.param, got.message)
    assert pool.stats.max_batch_size > 1
    assert pool.stats.failed == 0


async def test_bad_requests_over_the_bus_get_bad_request(pool: InferencePool) -> None:
    ctx = zmq.asyncio.Context()
    try:
        async with Endpoint("pool", context=ctx) as server, Endpoint("a", context=ctx) as ep:
            pool.serve(server)
            await ep.connect(await server.bind("inproc://limits"), timeout=5)
            client = BusPoolClient(ep, "pool", timeout=30)
            wire_bad = [b for b, _ in BAD]
            answers = await asyncio.gather(
                *(client.generate(r) for r in [*GOOD, *wire_bad]), return_exceptions=True
            )
    finally:
        ctx.term()
    assert all(not isinstance(a, BaseException) for a in answers[: len(GOOD)]), answers
    for request, got in zip(wire_bad, answers[len(GOOD) :], strict=True):
        assert isinstance(got, RemoteError), got
        # A negative token id does not decode (the schema says ids >= 0): refused on receipt.
        negative = min(request.prompt_token_ids, default=0) < 0
        assert got.code == ("bad_message" if negative else "bad_request"), got


async def test_random_params_get_a_result_or_bad_request(pool: InferencePool) -> None:
    """Seeded random values in every field (what a hostile bus peer can encode): the pool
    answers each with a result or ``bad_request``, and nothing reaches a batch to fail."""
    rnd = random.Random(0)
    top = random.Random(1)
    ints = [-(2**63), -1, 0, 1, 2, 3, 127, 129, 2**31, 2**63 - 1, 2**64 - 1]
    floats = [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-320, 1e-6, 0.5, 1.0, 2.0, 1e300]
    strings = ["", "x", "\x00", "é" * 3, "a" * 2000]

    def pick(good: object, hostile: list[Any]) -> Any:
        return rnd.choice(hostile) if rnd.random() < 0.15 else good

    def random_request() -> GenerateRequest:
        params = SamplingParams(
            temperature=pick(1.0, floats),
            top_p=pick(1.0, floats),
            max_tokens=pick(3, ints),
            n=pick(1, ints[:8]),
            seed=pick(rnd.randrange(100), [None, *ints]),
            stop=pick([], [rnd.sample(strings, 2), [strings[0]]]),
            # Its own generator: the other fields' draws stay those of before top_logprobs.
            top_logprobs=top.choice(ints) if top.random() < 0.15 else top.choice([0, 5]),
        )
        return GenerateRequest(
            policy="p",
            prompt=pick("hat", strings),
            prompt_token_ids=pick([], [[1, 2], [-1], [2**40]]),
            params=params,
            timeout=pick(30.0, [0.0, -1.0, math.nan, math.inf]),
        )

    requests = [random_request() for _ in range(300)]
    answers = []
    for start in range(0, len(requests), 50):
        wave = requests[start : start + 50]
        answers += await asyncio.gather(*(pool.generate(r) for r in wave), return_exceptions=True)
    kinds = {type(a).__name__ if not isinstance(a, PoolError) else a.code for a in answers}
    assert kinds <= {"GenerateResult", "bad_request"}, kinds
    assert "GenerateResult" in kinds
    assert pool.stats.failed == 0
