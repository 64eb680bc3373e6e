"""The OpenAI-compatible HTTP front, driven by the official ``openai`` client."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from parley.arena.inference.http import serve_http
from parley.arena.inference.pool import InferencePool, PoolConfig

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def pool(tiny_model_dir: Path) -> AsyncIterator[InferencePool]:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"tiny": backend}, PoolConfig(max_wait=0.01)) as p:
        yield p


@pytest.fixture
async def base_url(pool: InferencePool) -> AsyncIterator[str]:
    runner, url = await serve_http(pool, "127.0.0.1", 0)
    try:
        yield url
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=60
    ) as c:
        yield c


async def test_models_lists_policies(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


async def test_chat_completion_with_logprobs(
    client: openai.AsyncOpenAI, pool: InferencePool
) -> None:
    reply = await client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "You trade hats."},
            {"role": "user", "content": "Make an offer."},
        ],
        max_tokens=5,
        temperature=0.8,
        seed=3,
        n=2,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in reply.choices] == [0, 1]
    tok = pool.tokenizer("tiny")
    prompt = tok.encode_chat(
        [
            {"role": "system", "content": "You trade hats."},
            {"role": "user", "content": "Make an offer."},
        ]
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(prompt)
    for choice in reply.choices:
        ids = choice.model_extra["token_ids"]  # type: ignore[index]
        assert choice.logprobs is not None
        assert choice.logprobs.content is not None
        assert len(choice.logprobs.content) == len(ids) <= 5
        assert all(t.logprob <= 0 for t in choice.logprobs.content)
        assert choice.message.content == tok.decode(ids)
        assert choice.finish_reason in {"stop", "length"}
    assert reply.usage.completion_tokens == sum(
        len(c.model_extra["token_ids"])  # type: ignore[index]
        for c in reply.choices
    )
    # Seeded: the same request gives the same text.
    again = await client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "You trade hats."},
            {"role": "user", "content": "Make an offer."},
        ],
        max_tokens=5,
        temperature=0.8,
        seed=3,
        n=2,
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in reply.choices]


async def test_completions_with_stop_and_several_prompts(client: openai.AsyncOpenAI) -> None:
    reply = await client.completions.create(
        model="tiny",
        prompt=["the hat is", "two books and"],
        max_tokens=6,
        temperature=0,
        n=2,
        logprobs=1,
    )
    assert len(reply.choices) == 4
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    # Greedy: both samples of one prompt agree.
    assert reply.choices[0].text == reply.choices[1].text
    for c in reply.choices:
        assert c.logprobs is not None
        assert c.logprobs.tokens is not None
        assert c.logprobs.token_logprobs is not None
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs)
        assert "".join(c.logprobs.tokens).startswith(c.text)
    # A stop string cuts the text before it.
    text = reply.choices[0].text
    assert len(text) > 1, "greedy output of the tiny model is not empty"
    stop = text[len(text) // 2 :][:2]
    cut = await client.completions.create(
        model="tiny", prompt="the hat is", max_tokens=6, temperature=0, stop=[stop]
    )
    assert stop not in cut.choices[0].text
    assert text.startswith(cut.choices[0].text)


async def test_token_id_prompts_and_constraints(
    client: openai.AsyncOpenAI, pool: InferencePool
) -> None:
    ids = pool.tokenizer("tiny").encode("deal or no deal")
    reply = await client.completions.create(
        model="tiny",
        prompt=ids,
        max_tokens=12,
        seed=1,
        extra_body={"structured_outputs": {"choice": ["deal", "no deal"]}},
    )
    assert reply.choices[0].text in {"deal", "no deal"}
    chat = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "claim?"}],
        max_tokens=16,
        seed=2,
        extra_body={"guided_regex": r"book=[0-3] hat=[0-2]"},
    )
    assert re.fullmatch(r"book=[0-3] hat=[0-2]", chat.choices[0].message.content or "")


async def test_errors_have_openai_shape(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.completions.create(model="tiny", prompt="x", max_tokens=0)
    assert "max_tokens" in bad.value.message
    with pytest.raises(openai.BadRequestError) as top:
        await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            logprobs=True,
            top_logprobs=21,
        )
    assert top.value.param == "top_logprobs"


async def test_streamed_chat_and_completions_match_the_plain_answers(
    client: openai.AsyncOpenAI,
) -> None:
    """stream=True (server-sent events) through the official client: the chunks join to
    the same text, with one logprob per token, a finish reason and the usage chunk."""
    messages = [{"role": "user", "content": "Make an offer."}]
    args = {"model": "tiny", "max_tokens": 12, "temperature": 0.9, "seed": 5, "n": 2}
    plain = await client.chat.completions.create(messages=messages, logprobs=True, **args)  # type: ignore[arg-type, call-overload]
    stream = await client.chat.completions.create(
        messages=messages,  # type: ignore[arg-type]
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        **args,  # type: ignore[arg-type]
    )
    texts: dict[int, str] = {}
    logprobs: dict[int, list[float]] = {}
    finish: dict[int, str] = {}
    usage = None
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.logprobs is not None and choice.logprobs.content:
                logprobs.setdefault(choice.index, []).extend(
                    t.logprob for t in choice.logprobs.content
                )
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    for c in plain.choices:
        assert texts[c.index] == c.message.content
        assert c.logprobs is not None
        assert c.logprobs.content is not None
        # The stream reuses the plain call's cached prefix: equal up to float rounding.
        assert logprobs[c.index] == pytest.approx([t.logprob for t in c.logprobs.content], abs=1e-5)
        assert finish[c.index] == c.finish_reason
    assert usage is not None
    assert plain.usage is not None
    assert usage.completion_tokens == plain.usage.completion_tokens

    prompts = ["the hat is", "two books"]
    plain_text = await client.completions.create(prompt=prompts, **args)  # type: ignore[arg-type, call-overload]
    streamed: dict[int, str] = {}
    async for chunk in await client.completions.create(prompt=prompts, stream=True, **args):  # type: ignore[arg-type, call-overload]
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [streamed[i] for i in range(4)] == [c.text for c in plain_text.choices]


async def test_overload_is_429(tiny_model_dir: Path) -> None:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    config = PoolConfig(max_queue=1, max_wait=0.0)
    async with InferencePool({"tiny": backend}, config) as pool:
        runner, url = await serve_http(pool)
        try:
            async with aiohttp.ClientSession() as http:

                async def post() -> tuple[int, dict[str, object]]:
                    body = {"model": "tiny", "prompt": "x", "max_tokens": 8}
                    async with http.post(f"{url}/completions", json=body) as r:
                        return r.status, await r.json()

                replies = await asyncio.gather(*(post() for _ in range(6)))
        finally:
            await runner.cleanup()
    statuses = sorted(s for s, _ in replies)
    assert 200 in statuses
    assert 429 in statuses
    refused = next(body for s, body in replies if s == 429)
    assert refused["error"]["code"] == "overloaded"  # type: ignore[index]


async def test_weights_endpoint_bumps_the_version(
    client: openai.AsyncOpenAI, base_url: str, tiny_model_dir: Path
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{base_url}/weights",
            json={"policy": "tiny", "version": 4, "path": str(tiny_model_dir)},
        ) as r,
    ):
        assert r.status == 200
        assert (await r.json())["policy_version"] == 4
    reply = await client.completions.create(model="tiny", prompt="hat", max_tokens=2)
    assert reply.model_extra["policy_version"] == 4  # type: ignore[index]


async def test_the_front_closes_connections_that_send_no_headers(pool: InferencePool) -> None:
    """Slow and idle connections (``test_http_slow_clients.py``) against the front itself."""
    from parley.arena.inference.http_guard import ConnectionLimits

    limits = ConnectionLimits(max_connections=8, header_timeout=0.3)
    runner, url = await serve_http(pool, "127.0.0.1", 0, limits=limits)
    try:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        async with aiohttp.ClientSession() as session, session.get(f"{url}/models") as response:
            assert response.status == 200
    finally:
        await runner.cleanup()
