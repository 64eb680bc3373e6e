"""``stream: true`` sends tokens as they are generated (issue 12 §6), through the official
``openai`` client against the transformers backend: the first chunks arrive while the pool
is still decoding, stop strings never leak into a chunk, and a client that goes away does
not hurt the pool."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest

pytest.importorskip("torch")

from parley.arena.inference.backends.transformers import TransformersBackend
from parley.arena.inference.http import serve_http
from parley.arena.inference.pool import InferencePool, PoolConfig

pytestmark = pytest.mark.timeout(120)

CHAT = [{"role": "user", "content": "Make an offer."}]


@pytest.fixture
async def served(tiny_model_dir: Path) -> AsyncIterator[tuple[InferencePool, openai.AsyncOpenAI]]:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"tiny": backend}, PoolConfig(max_wait=0.01)) as pool:
        runner, url = await serve_http(pool)
        try:
            async with openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as client:
                yield pool, client
        finally:
            await runner.cleanup()


async def test_chunks_arrive_while_the_completion_is_generated(
    served: tuple[InferencePool, openai.AsyncOpenAI],
) -> None:
    """Fails on a front that streams only once the pool has the whole completion: there
    the first chunk comes after the pool counted the request completed, and all chunks
    arrive within a few milliseconds of each other."""
    pool, client = served
    args: dict[str, Any] = {"model": "tiny", "messages": CHAT, "max_tokens": 400}
    args |= {"temperature": 0, "logprobs": True}
    plain = await client.chat.completions.create(**args)
    assert plain.choices[0].finish_reason == "length"  # the tiny model never stops early
    done_before = pool.stats.completed
    start = time.monotonic()
    stamps: list[float] = []
    unfinished_at_first = None
    text = ""
    async for chunk in await client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            if choice.delta.content:
                if unfinished_at_first is None:
                    unfinished_at_first = pool.stats.completed == done_before
                stamps.append(time.monotonic() - start)
                text += choice.delta.content
    assert unfinished_at_first, "the first token came after the pool finished the request"
    assert text == plain.choices[0].message.content
    spread = stamps[-1] - stamps[0]
    print(f"first text chunk {stamps[0]:.3f} s, last {stamps[-1]:.3f} s, {len(stamps)} chunks")
    assert spread > 0.3 * stamps[-1], (
        f"chunks came in one burst: {stamps[0]:.3f}-{stamps[-1]:.3f} s"
    )


async def test_stop_strings_never_leak_into_chunks(
    served: tuple[InferencePool, openai.AsyncOpenAI],
) -> None:
    """Text that could be the start of a stop string is held back until it is not; the
    chunks join to the non-streamed text, which the stop string cut."""
    _, client = served
    base: dict[str, Any] = {"model": "tiny", "prompt": "the hat", "max_tokens": 60}
    base |= {"temperature": 0}
    free = (await client.completions.create(**base)).choices[0].text
    assert len(free) > 40
    stops = [free[25:29], free[30:31] + "\u00e9never", "zzzz"]  # one hit, two near misses
    cut = free.find(stops[0])
    plain = await client.completions.create(stop=stops, **base)
    assert plain.choices[0].text == free[:cut]
    pieces = [
        choice.text
        async for chunk in await client.completions.create(stop=stops, stream=True, **base)
        for choice in chunk.choices
    ]
    assert "".join(pieces) == free[:cut]
    assert not any(stops[0] in p for p in pieces)


async def test_a_client_that_leaves_mid_stream_does_not_hurt_the_pool(
    served: tuple[InferencePool, openai.AsyncOpenAI],
) -> None:
    pool, client = served
    args: dict[str, Any] = {"model": "tiny", "prompt": "a ball", "max_tokens": 2000}
    args |= {"temperature": 1.0, "seed": 1}
    stream = await client.completions.create(stream=True, **args)
    async for _ in stream:
        break
    await stream.close()
    # The pool forgets the abandoned request (its static batch finishes without it): the
    # next request is answered normally and nothing counts as failed.
    short = await asyncio.wait_for(
        client.completions.create(model="tiny", prompt="ok", max_tokens=3), 30
    )
    assert short.choices[0].finish_reason in ("length", "stop")
    assert pool.stats.failed == 0


async def test_an_error_after_the_first_token_ends_the_stream_with_an_error_event(
    tiny_model_dir: Path,
) -> None:
    """A request that times out mid-stream: the tokens sent so far stay sent, then an
    ``{"error": ...}`` event (the ``openai`` client raises ``APIError``), never a normal end
    with ``finish_reason``."""
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"tiny": backend}) as pool:
        runner, url = await serve_http(pool, request_timeout=0.5)
        try:
            async with openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as client:
                texts: list[str] = []
                finishes: list[str] = []

                async def read() -> None:
                    stream = await client.completions.create(
                        model="tiny", prompt="a hat", max_tokens=2000, temperature=0, stream=True
                    )
                    async for chunk in stream:
                        texts.extend(c.text for c in chunk.choices)
                        finishes.extend(c.finish_reason for c in chunk.choices if c.finish_reason)

                with pytest.raises(openai.APIError) as failed:
                    await read()
        finally:
            await runner.cleanup()
    assert "".join(texts)  # tokens arrived before the error
    assert finishes == []
    assert "no result within 0.5 s" in failed.value.message


class FailsOnceAfterStreaming(TransformersBackend):
    """The first streamed call sends tokens (sampled with other seeds, as a restarted engine
    would not reproduce them) and then fails; later calls are the plain backend."""

    failed = False

    async def generate(self, requests: Any, sinks: Any = None) -> Any:
        if sinks and not self.failed:
            self.failed = True
            other = [
                msgspec.structs.replace(
                    r, params=msgspec.structs.replace(r.params, seed=(r.params.seed or 0) + 99)
                )
                for r in requests
            ]
            await super().generate(other, sinks=sinks)
            raise RuntimeError("engine died after streaming")
        return await super().generate(requests, sinks=sinks)


async def test_a_regenerated_batch_member_ends_its_stream_with_one_error_event(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A streamed batch that fails after sending tokens is run again member by member; the
    new tokens differ from those sent, so the stream ends with a ``retry`` error event and
    nothing after it (it used to write usage and ``[DONE]`` after ``write_eof``)."""
    backend = await FailsOnceAfterStreaming.create(str(tiny_model_dir))
    async with InferencePool({"tiny": backend}, PoolConfig(max_wait=0.3)) as pool:
        runner, url = await serve_http(pool)
        try:
            async with openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as client:

                async def read(seed: int) -> str:
                    stream = await client.completions.create(
                        model="tiny",
                        prompt="a hat",
                        max_tokens=24,
                        temperature=1.0,
                        seed=seed,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    try:
                        async for _chunk in stream:
                            pass
                    except openai.APIError as exc:
                        return exc.message
                    return "ended normally"

                messages = await asyncio.gather(read(1), read(2))
        finally:
            await runner.cleanup()
    assert backend.failed
    assert pool.stats.isolated_batches == 1
    for message in messages:
        assert "regenerated after part of it was streamed" in message
    handler_errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert handler_errors == [], [r.getMessage() for r in handler_errors]
