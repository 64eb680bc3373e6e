"""A hostile client of the pool (second review of 2026-12-04): a ten-character regex that
backtracks for hours, a 494-character schema whose pattern grows 4x per level, 1,100
prompts in one call, a weights version of 10**30. Each was answered or refused without
holding the others up; real pool, real tiny model, real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from parley.arena.inference.backends import BackendError
from parley.arena.inference.backends.constraints import check_constraint
from parley.arena.inference.backends.json_schema import (
    MAX_SCHEMA_REGEX_CHARS,
    json_schema_to_regex,
)
from parley.arena.inference.http import serve_http
from parley.arena.inference.http_fields import MAX_PROMPTS
from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError
from parley.protocols.messages import Constraint, GenerateRequest, SamplingParams, WeightUpdate

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def backend(tiny_model_dir: Path) -> AsyncIterator[TransformersBackend]:
    b = await TransformersBackend.create(str(tiny_model_dir))
    try:
        yield b
    finally:
        await b.close()


def _nested_arrays(depth: int) -> str:
    schema: dict[str, object] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return json.dumps(schema)


def test_a_schema_whose_pattern_outgrows_the_cap_is_refused_at_once() -> None:
    json_schema_to_regex(_nested_arrays(3))  # (a few levels compile)
    started = time.monotonic()
    with pytest.raises(BackendError) as refused:
        check_constraint(Constraint(type="json", json_schema=_nested_arrays(17)))
    assert time.monotonic() - started < 5  # (it had taken minutes and gigabytes)
    assert f"at most {MAX_SCHEMA_REGEX_CHARS:,}" in str(refused.value)


async def test_a_backtracking_regex_ends_its_own_completion_not_the_batch(
    backend: TransformersBackend,
) -> None:
    """``(a|a){40}``: each partial match of a run of a's had backtracked exponentially (a
    mask over its time budget allowed nothing, and the completion ended ``error``); the
    matching engine (llguidance) does not backtrack, so it completes with its 40 a's, and
    the request batched with it is answered as usual."""
    hostile = GenerateRequest(
        prompt="a",
        params=SamplingParams(max_tokens=60, temperature=0.0),
        constraint=Constraint(type="regex", pattern="(a|a){40}"),
    )
    victim = GenerateRequest(prompt="hello", params=SamplingParams(max_tokens=5, seed=1))
    attacked, answered = await asyncio.wait_for(backend.generate([hostile, victim]), 90)
    assert attacked.completions[0].finish_reason == "stop"
    assert attacked.completions[0].text == "a" * 40
    assert answered.completions[0].finish_reason in ("stop", "length")
    assert answered.completions[0].token_ids


async def test_weights_versions_outside_int64_are_refused(
    backend: TransformersBackend, tiny_model_dir: Path
) -> None:
    async with InferencePool({"tiny": backend}, PoolConfig(), owns_backends=False) as pool:
        for version in (10**30, 0, -1, True):
            update = WeightUpdate(policy="tiny", version=version, path=str(tiny_model_dir))
            with pytest.raises(PoolError) as refused:
                await pool.update_weights(update)
            assert refused.value.code == "bad_request", version
        runner, url = await serve_http(pool)
        try:
            async with aiohttp.ClientSession() as http:
                for raw in ('{"policy": "tiny", "version": 1e30, "path": "x"}',
                            '{"policy": "tiny", "version": Infinity, "path": "x"}'):  # fmt: skip
                    headers = {"Content-Type": "application/json"}
                    async with http.post(f"{url}/weights", data=raw, headers=headers) as r:
                        assert r.status == 400, (raw, await r.text())
                good = {"policy": "tiny", "version": 2**62, "path": str(tiny_model_dir)}
                async with http.post(f"{url}/weights", json=good) as r:
                    assert r.status == 200, await r.text()
        finally:
            await runner.cleanup()


async def test_many_prompts_are_refused_and_a_refused_call_leaves_nothing_queued(
    backend: TransformersBackend,
) -> None:
    config = PoolConfig(max_queue=4, max_batch_size=1)
    async with InferencePool({"tiny": backend}, config, owns_backends=False) as pool:
        runner, url = await serve_http(pool)
        try:
            async with aiohttp.ClientSession() as http:
                body = {"model": "tiny", "prompt": ["hi"] * (MAX_PROMPTS + 1), "max_tokens": 2}
                async with http.post(f"{url}/completions", json=body) as r:
                    assert r.status == 400
                    assert f"at most {MAX_PROMPTS} prompts" in (await r.json())["error"]["message"]
                body = {"model": "tiny", "prompt": ["hi"] * 20, "max_tokens": 50}
                async with http.post(f"{url}/completions", json=body) as r:
                    assert r.status == 429  # (the queue holds 4)
                for _ in range(200):  # its queued siblings were cancelled, not generated
                    if pool._queued == 0:
                        break
                    await asyncio.sleep(0.01)
                assert pool._queued == 0
                body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
                async with http.post(f"{url}/completions", json=body) as r:
                    assert r.status == 200
        finally:
            await runner.cleanup()
