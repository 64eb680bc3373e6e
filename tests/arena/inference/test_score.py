"""Reward models served by the pool: ScoreRequest on the bus, /v1/score over HTTP, batching."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import zmq.asyncio

from parley.arena.inference.http import serve_http
from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError
from parley.protocols.bus import Endpoint
from parley.protocols.errors import RemoteError
from parley.protocols.messages import ScoreRequest, ScoreResult

torch = pytest.importorskip("torch")
from parley.arena.inference.backends.scorer import SequenceScorer  # noqa: E402
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TEXTS = ["the deal", "a much longer reply about books and hats and balls", "<|end|> yes"]


@pytest.fixture(scope="module")
def scorer(tiny_model_dir: Path) -> SequenceScorer:
    """The tiny model with a new score head (seeded; untrained is enough to compare paths)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return SequenceScorer.load(tiny_model_dir)


@pytest.fixture
async def pool(tiny_model_dir: Path, scorer: SequenceScorer) -> AsyncIterator[InferencePool]:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"tiny": backend}, PoolConfig(max_wait=0.01)) as p:
        p.add_scorer("rm", scorer)
        yield p


def direct(scorer: SequenceScorer, text: str) -> float:
    """The model's own score of one text, unbatched and unpadded."""
    tokenizer = scorer.tokenizer
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False, split_special_tokens=True)
    with torch.no_grad():
        return float(scorer.model(**ids).logits[0, 0])


async def test_score_over_the_bus_equals_the_direct_model_call(
    pool: InferencePool, scorer: SequenceScorer
) -> None:
    ctx = zmq.asyncio.Context()
    try:
        async with Endpoint("pool", context=ctx) as server, Endpoint("c", context=ctx) as client:
            pool.serve(server)
            address = await server.bind("inproc://test-score-bus")
            assert await client.connect(address, timeout=5) == "pool"
            asked = ScoreRequest(model="rm", prompt="Reply: ", texts=TEXTS)
            result = await client.request("pool", asked, timeout=30)
            with pytest.raises(RemoteError) as empty:
                await client.request("pool", ScoreRequest(model="rm", texts=[]), timeout=30)
            with pytest.raises(RemoteError) as unknown:
                await client.request("pool", ScoreRequest(model="tiny", texts=["x"]), timeout=30)
    finally:
        ctx.term()
    assert isinstance(result, ScoreResult)
    assert result.model == "rm"
    expected = [direct(scorer, "Reply: " + t) for t in TEXTS]
    assert result.scores == pytest.approx(expected, abs=1e-4)  # padded batch == one by one
    assert empty.value.code == "bad_request"
    assert unknown.value.code == "unknown_policy"  # a policy is not a reward model


async def test_concurrent_score_requests_share_one_forward_pass(pool: InferencePool) -> None:
    batcher = pool._scorers["rm"]
    requests = [ScoreRequest(model="rm", texts=[t]) for t in TEXTS]
    results = await asyncio.gather(*(pool.score(r) for r in requests))
    assert batcher.batches == 1
    alone = await pool.score(ScoreRequest(model="rm", texts=TEXTS))
    assert [r.scores[0] for r in results] == pytest.approx(alone.scores, abs=1e-4)
    with pytest.raises(PoolError) as unknown:
        await pool.score(ScoreRequest(model="nobody", texts=["x"]))
    assert unknown.value.code == "unknown_policy"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "rm"}, "texts"),
        ({"model": "rm", "texts": []}, "texts"),
        ({"model": "rm", "texts": ["a", 3]}, "texts"),
        ({"model": "rm", "texts": "a"}, "texts"),
        ({"model": "rm", "texts": ["a"], "prompt": 3}, "prompt"),
        ({"texts": ["a"]}, "model"),
    ],
)
async def test_v1_score_bad_input_is_400_naming_the_field(
    pool: InferencePool, body: dict[str, object], param: str
) -> None:
    runner, url = await serve_http(pool, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http, http.post(f"{url}/score", json=body) as bad:
            error = (await bad.json())["error"]
            status = bad.status
    finally:
        await runner.cleanup()
    assert status == 400
    assert error["param"] == param


async def test_v1_score_answers_in_order(pool: InferencePool, scorer: SequenceScorer) -> None:
    runner, url = await serve_http(pool, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": "rm", "prompt": "Reply: ", "texts": TEXTS}
            async with http.post(f"{url}/score", json=body) as ok:
                answer = await ok.json()
            async with http.post(f"{url}/score", json={**body, "model": "x"}) as unknown:
                assert unknown.status == 404
    finally:
        await runner.cleanup()
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    scores = [d["score"] for d in answer["data"]]
    assert scores == pytest.approx([direct(scorer, "Reply: " + t) for t in TEXTS], abs=1e-4)
    assert answer["policy_version"] == 0


async def test_score_times_out_and_close_answers_closed(
    tiny_model_dir: Path, scorer: SequenceScorer
) -> None:
    """A batch that never starts: the request's timeout answers ``timeout``; a request
    waiting when the pool closes is answered ``closed``."""
    backend = await TransformersBackend.create(str(tiny_model_dir))
    pool = InferencePool({"tiny": backend}, PoolConfig(max_wait=0.0))
    await pool.start()
    pool.add_scorer("rm", scorer)
    batcher = pool._scorers["rm"]
    batcher.max_wait = 3600.0  # the batch waits for more texts: nothing starts
    batcher.max_batch_texts = 10**6
    with pytest.raises(PoolError) as late:
        await pool.score(ScoreRequest(model="rm", texts=["x"], timeout=0.2))
    waiting = asyncio.ensure_future(pool.score(ScoreRequest(model="rm", texts=["y"])))
    await asyncio.sleep(0)
    await pool.close()
    with pytest.raises(PoolError) as closed:
        await waiting
    assert late.value.code == "timeout"
    assert closed.value.code == "closed"
