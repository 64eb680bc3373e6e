"""The inference pool on the tiny model: batching, routing, versions, timeouts, backpressure.

The backend is the real transformers backend; :class:`RecordingBackend` only records the
batches it is handed (and can hold a call back) so the tests can see what the pool did.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import zmq.asyncio

from parley.agents.llm import BusPoolClient
from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError
from parley.protocols.bus import Endpoint
from parley.protocols.errors import RemoteError
from parley.protocols.messages import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend

pytestmark = pytest.mark.timeout(120)


class RecordingBackend(TransformersBackend):
    """The transformers backend, recording each batch; ``hold`` keeps calls waiting."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.batches: list[list[GenerateRequest]] = []
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        self.batches.append(list(requests))
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        return await super().generate(requests)

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b) for b in self.batches]


async def make_backend(model_dir: Path) -> RecordingBackend:
    return await RecordingBackend.create(str(model_dir))


@pytest.fixture
async def backend(tiny_model_dir: Path) -> AsyncIterator[RecordingBackend]:
    b = await make_backend(tiny_model_dir)
    yield b
    await b.close()


def request(backend: TransformersBackend, i: int, **kwargs: object) -> GenerateRequest:
    chat = [{"role": "user", "content": f"offer number {i}"}]
    params = SamplingParams(max_tokens=4, seed=i)
    return GenerateRequest(
        prompt_token_ids=backend.tokenizer.encode_chat(chat),
        params=params,
        **kwargs,  # type: ignore[arg-type]
    )


async def test_concurrent_requests_share_batches(backend: RecordingBackend) -> None:
    config = PoolConfig(max_batch_size=8, max_wait=0.5)
    async with InferencePool({"default": backend}, config) as pool:
        results = await asyncio.gather(*(pool.generate(request(backend, i)) for i in range(16)))
    assert backend.batch_sizes == [8, 8]
    assert (pool.stats.batches, pool.stats.batched_requests) == (2, 16)
    assert pool.stats.max_batch_size == 8
    assert pool.stats.mean_batch_size == 8.0
    assert [len(r.completions) for r in results] == [1] * 16
    # Each answer belongs to its own request (same order in, same order out).
    for i, r in enumerate(results):
        assert r.prompt_token_ids == request(backend, i).prompt_token_ids


async def test_max_wait_gathers_late_requests_into_one_batch(backend: RecordingBackend) -> None:
    async with InferencePool({"default": backend}, PoolConfig(max_wait=1.0)) as pool:

        async def late(i: int) -> GenerateResult:
            await asyncio.sleep(0.05 * i)
            return await pool.generate(request(backend, i))

        await asyncio.gather(*(late(i) for i in range(4)))
    assert backend.batch_sizes == [4]


async def test_without_max_wait_one_request_is_one_call(backend: RecordingBackend) -> None:
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.0)) as pool:
        for i in range(3):
            await pool.generate(request(backend, i))
    assert backend.batch_sizes == [1, 1, 1]


async def test_requests_arriving_during_a_batch_form_the_next(backend: RecordingBackend) -> None:
    backend.hold = asyncio.Event()
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.0)) as pool:
        first = asyncio.ensure_future(pool.generate(request(backend, 0)))
        await backend.entered.wait()
        rest = [asyncio.ensure_future(pool.generate(request(backend, i))) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        backend.hold.set()
        await asyncio.gather(first, *rest)
    assert backend.batch_sizes == [1, 5]


async def test_routes_by_policy(tiny_model_dir: Path) -> None:
    a, b = await make_backend(tiny_model_dir), await make_backend(tiny_model_dir)
    async with InferencePool({"alice": a, "bob": b}, PoolConfig(max_wait=0.2)) as pool:
        jobs = [request(a, i, policy="alice") for i in range(3)]
        jobs += [request(b, i, policy="bob") for i in range(2)]
        results = await asyncio.gather(*(pool.generate(r) for r in jobs))
        with pytest.raises(PoolError) as err:
            await pool.generate(request(a, 0, policy="carol"))
    assert err.value.code == "unknown_policy"
    assert "alice" in err.value.message
    assert [r.policy for b_ in a.batches for r in b_] == ["alice"] * 3
    assert [r.policy for b_ in b.batches for r in b_] == ["bob"] * 2
    assert [r.policy for r in results] == ["alice"] * 3 + ["bob"] * 2


async def test_weight_update_bumps_the_version_of_its_policy_only(tiny_model_dir: Path) -> None:
    a, b = await make_backend(tiny_model_dir), await make_backend(tiny_model_dir)
    async with InferencePool({"alice": a, "bob": b}) as pool:
        before = await pool.generate(request(a, 0, policy="alice"))
        # A zero final norm makes every logit 0: the new weights are visible in the logprobs.
        hidden, vocab = a.model.config.hidden_size, a.model.config.vocab_size
        update = WeightUpdate(
            policy="alice", version=3, tensors={"model.norm.weight": np.zeros(hidden, "f4")}
        )
        assert await pool.update_weights(update) == 3
        after = await pool.generate(request(a, 0, policy="alice"))
        other = await pool.generate(request(b, 0, policy="bob"))
        with pytest.raises(PoolError) as err:
            await pool.update_weights(WeightUpdate(policy="alice", version=3, tensors={}))
    assert before.policy_version == 0
    assert after.policy_version == 3
    assert other.policy_version == 0
    assert pool.policies == {"alice": 3, "bob": 0}
    uniform = -math.log(vocab)
    assert after.completions[0].logprobs == pytest.approx([uniform] * 4, abs=1e-4)
    assert before.completions[0].logprobs != pytest.approx([uniform] * 4, abs=1e-4)
    assert err.value.code == "stale_weights"


async def test_weight_update_waits_for_the_running_batch(backend: RecordingBackend) -> None:
    backend.hold = asyncio.Event()
    async with InferencePool({"default": backend}) as pool:
        running = asyncio.ensure_future(pool.generate(request(backend, 0)))
        await backend.entered.wait()
        hidden = backend.model.config.hidden_size
        update = asyncio.ensure_future(
            pool.update_weights(
                WeightUpdate(
                    policy="default", version=1, tensors={"model.norm.weight": np.ones(hidden)}
                )
            )
        )
        await asyncio.sleep(0.05)
        assert not update.done()  # the batch holds the lane; weights must not change mid-batch
        backend.hold.set()
        first = await running
        assert await update == 1
        second = await pool.generate(request(backend, 1))
    assert (first.policy_version, second.policy_version) == (0, 1)


async def test_timeout_answers_and_drops_a_waiting_request(backend: RecordingBackend) -> None:
    backend.hold = asyncio.Event()
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.0)) as pool:
        busy = asyncio.ensure_future(pool.generate(request(backend, 0)))
        await backend.entered.wait()
        with pytest.raises(PoolError) as err:
            await pool.generate(request(backend, 1, timeout=0.1))
        assert err.value.code == "timeout"
        assert pool.stats.timeouts == 1
        backend.hold.set()
        await busy
        await pool.generate(request(backend, 2))
    # The timed-out request never reached the backend.
    assert backend.batch_sizes == [1, 1]
    assert backend.batches[1][0].params.seed == 2


@pytest.mark.parametrize("lag", [0.0, 0.08, 0.5])
async def test_a_pool_timeout_put_off_by_stalls_still_ends_within_its_bound(
    backend: RecordingBackend, lag: float
) -> None:
    """The pool's timers count the time it ran (``patience.PatientTimer``): on a loop that
    stands still ``lag`` s at every turn (the process stopped or starved again and again),
    a request it cannot finish still times out, by twice its timeout plus two turns' lag
    (``test_pool_serve`` stops a real ``parley serve``: what it finishes, it answers)."""
    backend.hold = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stall() -> None:
        time.sleep(lag)
        stalls.append(loop.call_later(0.01, stall))

    stalls = [loop.call_soon(stall)] if lag else []
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.0)) as pool:
        started = loop.time()
        with pytest.raises(PoolError) as err:
            await pool.generate(request(backend, 0, timeout=0.3))
        took = loop.time() - started
        for handle in stalls[-1:]:  # (the stall still to come)
            handle.cancel()
        backend.hold.set()
    assert err.value.code == "timeout"
    assert took >= 0.3
    assert took <= 2 * 0.3 + 3 * (lag + 0.05) + 0.2, took


async def test_full_queue_refuses_with_retryable_overloaded(backend: RecordingBackend) -> None:
    backend.hold = asyncio.Event()
    config = PoolConfig(max_wait=0.0, max_queue=2)
    async with InferencePool({"default": backend}, config) as pool:
        busy = asyncio.ensure_future(pool.generate(request(backend, 0)))
        await backend.entered.wait()  # started: no longer counted as waiting
        waiting = [asyncio.ensure_future(pool.generate(request(backend, i))) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(PoolError) as err:
            await pool.generate(request(backend, 3))
        assert (err.value.code, err.value.retryable) == ("overloaded", True)
        backend.hold.set()
        await asyncio.gather(busy, *waiting)
        await pool.generate(request(backend, 4))  # room again
    assert pool.stats.overloaded == 1
    assert backend.batch_sizes == [1, 2, 1]


async def test_bad_request_fails_alone(backend: RecordingBackend) -> None:
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.2)) as pool:
        good = asyncio.ensure_future(pool.generate(request(backend, 0)))
        with pytest.raises(PoolError) as err:
            await pool.generate(GenerateRequest(params=SamplingParams(max_tokens=2)))
        await good
    assert err.value.code == "bad_request"
    assert backend.batch_sizes == [1]


async def test_close_answers_waiting_requests(backend: RecordingBackend) -> None:
    backend.hold = asyncio.Event()
    pool = await InferencePool({"default": backend}, owns_backends=False).start()
    busy = asyncio.ensure_future(pool.generate(request(backend, 0)))
    await backend.entered.wait()
    waiting = asyncio.ensure_future(pool.generate(request(backend, 1)))
    await asyncio.sleep(0)
    await pool.close()
    for fut in (busy, waiting):
        with pytest.raises(PoolError) as err:
            await fut
        assert err.value.code in {"closed", "cancelled"}
    with pytest.raises(PoolError):
        await pool.generate(request(backend, 2))


async def test_continuous_backend_gets_every_request_at_once(tiny_model_dir: Path) -> None:
    backend = await make_backend(tiny_model_dir)
    backend.continuous_batching = True
    async with InferencePool({"default": backend}, PoolConfig(max_wait=1.0)) as pool:
        results = await asyncio.gather(*(pool.generate(request(backend, i)) for i in range(5)))
    # No gathering wait: each request went to the engine as its own call, right away.
    assert backend.batch_sizes == [1] * 5
    assert len(results) == 5


async def test_pool_on_the_bus(backend: RecordingBackend) -> None:
    ctx = zmq.asyncio.Context()
    backend.hold = asyncio.Event()
    config = PoolConfig(max_wait=0.0, max_queue=1)
    try:
        async with (
            InferencePool({"default": backend}, config) as pool,
            Endpoint("pool", context=ctx) as server,
            Endpoint("agents", context=ctx) as client_ep,
        ):
            pool.serve(server)
            address = await server.bind("inproc://test-pool-bus")
            assert await client_ep.connect(address, timeout=5) == "pool"
            client = BusPoolClient(client_ep, "pool", timeout=10)
            busy = asyncio.ensure_future(client.generate(request(backend, 0)))
            await backend.entered.wait()
            waiting = asyncio.ensure_future(client.generate(request(backend, 1)))
            await asyncio.sleep(0.05)
            with pytest.raises(RemoteError) as overloaded:
                await client.generate(request(backend, 2))
            with pytest.raises(RemoteError) as unknown:
                await client.generate(request(backend, 3, policy="nobody"))
            backend.hold.set()
            results = await asyncio.gather(busy, waiting)
            with pytest.raises(RemoteError) as refused:  # an empty update: the backend refuses
                await client_ep.request(
                    "pool", WeightUpdate(policy="default", version=2, tensors={}), timeout=10
                )
    finally:
        ctx.term()
    assert overloaded.value.code == "overloaded"
    assert unknown.value.code == "unknown_policy"
    assert [r.prompt_token_ids for r in results] == [
        request(backend, i).prompt_token_ids for i in (0, 1)
    ]
    assert refused.value.code == "bad_request"  # the update is at fault: a 4xx, not a 5xx


def test_a_pool_service_must_answer_both_requests() -> None:
    """``PoolService`` is the bus face of a pool: a subclass that forgets one of the two
    answers is refused when it is made, not when its first request arrives."""
    from parley.arena.inference.pool import PoolService

    class GeneratesOnly(PoolService):
        async def generate(self, request: GenerateRequest) -> GenerateResult:
            raise PoolError("unknown_policy", "nothing here")

    with pytest.raises(TypeError, match="update_weights"):
        GeneratesOnly()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="generate"):
        PoolService()  # type: ignore[abstract]
