"""Continuous batching in the transformers backend: requests that join a running batch get
the tokens and logprobs the static path gives them, and a costly neighbour delays only
itself (measured in decoding steps, never in seconds)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from parley.arena.inference.backends import load_backend  # noqa: E402
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402
from parley.arena.inference.pool import InferencePool, PoolConfig  # noqa: E402
from parley.protocols.errors import ConfigError  # noqa: E402
from parley.protocols.messages import (  # noqa: E402
    Completion,
    Constraint,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)

pytestmark = pytest.mark.timeout(120)

# Letters only and 2000 of them: no end-of-sequence before max_tokens (a forced length).
LONG = Constraint(type="regex", pattern=r"(\w{0,40}[aeiou]\w{0,40} ){1,9}[a-z]{2000}")


@pytest.fixture
async def backends(tiny_model_dir: Path) -> tuple[TransformersBackend, TransformersBackend]:
    static = await load_backend("transformers", str(tiny_model_dir))
    continuous = await load_backend("transformers", str(tiny_model_dir), batching="continuous")
    assert isinstance(static, TransformersBackend)
    assert isinstance(continuous, TransformersBackend)
    yield static, continuous
    await static.close()
    await continuous.close()


def request(b: TransformersBackend, text: str, **params: object) -> GenerateRequest:
    ids = b.tokenizer.encode_chat([{"role": "user", "content": text}])
    params = {"logprobs": True, **params}
    return GenerateRequest(prompt_token_ids=ids, params=SamplingParams(**params))  # type: ignore[arg-type]


def assert_same(got: GenerateResult, want: GenerateResult) -> None:
    assert len(got.completions) == len(want.completions)
    for g, w in zip(got.completions, want.completions, strict=True):
        assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason)
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5, rtol=0)
        assert g.top_token_ids == w.top_token_ids
        for tg, tw in zip(g.top_logprobs, w.top_logprobs, strict=True):
            np.testing.assert_allclose(tg, tw, atol=1e-5, rtol=0)


def after(tokens: int, event: asyncio.Event) -> Callable[[int, Completion], None]:
    """A token sink that sets ``event`` once ``tokens`` tokens have streamed."""
    streamed: list[int] = []

    def sink(index: int, delta: Completion) -> None:
        streamed.extend(delta.token_ids)
        if len(streamed) >= tokens:
            event.set()

    return sink


async def test_requests_joining_a_running_batch_decode_as_in_a_static_batch(
    backends: tuple[TransformersBackend, TransformersBackend],
) -> None:
    """A long constrained request runs; once it has streamed 3 tokens, requests of every
    kind (greedy, seeded sampling with top-p, n=2, a stop string, top logprobs, a choice,
    lengths 1 to 40) join it, and a second turn extends each prompt (prefix reuse). Every
    completion equals the static backend's: token ids, text, logprobs within 1e-5."""
    static, continuous = backends
    texts = ["make an offer", "say hello", "count to three", "who are you", "pick one"]

    def joiners(b: TransformersBackend, turn: str) -> list[GenerateRequest]:
        out = [
            request(b, texts[0] + turn, temperature=0, max_tokens=1),
            request(b, texts[1] + turn, temperature=1.0, top_p=0.9, seed=3, max_tokens=40),
            request(b, texts[2] + turn, temperature=0.7, seed=5, n=2, max_tokens=17),
            request(b, texts[3] + turn, temperature=0, max_tokens=24, stop=["e"]),
            request(b, texts[4] + turn, temperature=1.0, seed=9, top_logprobs=3, max_tokens=9),
        ]
        choice = request(b, "yes or no?" + turn, temperature=1.0, seed=1, max_tokens=8)
        choice.constraint = Constraint(type="choice", choices=["yes", "no", "maybe not"])
        return [*out, choice]

    for turn in ("", " and then?"):
        long = request(static, "a long one" + turn, temperature=1.0, seed=7, max_tokens=60)
        long.constraint = LONG
        want = await static.generate([long, *joiners(static, turn)])

        started = asyncio.Event()
        first = asyncio.ensure_future(continuous.generate([long], sinks=[after(3, started)]))
        await asyncio.wait_for(started.wait(), 30)
        later = [continuous.generate([r]) for r in joiners(continuous, turn)]
        got = [(await first)[0], *(r[0] for r in await asyncio.gather(*later))]
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    sched = continuous._sched
    assert sched is not None
    assert sched.stats.max_rows >= 2  # they did join the running request
    assert continuous.prefix_cache.stats.hit_rate > 0  # the second turn reused the first


async def test_rows_decode_as_in_a_static_batch_past_the_cache_spare_columns(
    backends: tuple[TransformersBackend, TransformersBackend],
) -> None:
    """A request of 200 tokens outlives several refills of the running cache's spare
    columns (64 each); requests join after its 3rd and its 100th token, and leave before
    it (the cache trims and selects rows in between). Every completion equals the static
    backend's."""
    static, continuous = backends
    long = request(static, "a long one", temperature=1.0, seed=7, max_tokens=200)
    long.constraint = LONG

    def joiners(b: TransformersBackend, tag: str) -> list[GenerateRequest]:
        return [
            request(b, f"{tag} greedy", temperature=0, max_tokens=90),
            request(b, f"{tag} sampled", temperature=1.0, top_p=0.9, seed=3, max_tokens=70),
            request(b, f"{tag} pair", temperature=0.7, seed=5, n=2, max_tokens=5),
        ]

    want = await static.generate([long, *joiners(static, "early"), *joiners(static, "late")])
    early, late = asyncio.Event(), asyncio.Event()
    streamed: list[int] = []

    def sink(index: int, delta: Completion) -> None:
        streamed.extend(delta.token_ids)
        if len(streamed) >= 3:
            early.set()
        if len(streamed) >= 100:
            late.set()

    sinks = [sink]
    first = asyncio.ensure_future(continuous.generate([long], sinks=sinks))
    await asyncio.wait_for(early.wait(), 30)
    joined = [continuous.generate([r]) for r in joiners(continuous, "early")]
    await asyncio.wait_for(late.wait(), 30)
    joined += [continuous.generate([r]) for r in joiners(continuous, "late")]
    got = [(await first)[0], *(r[0] for r in await asyncio.gather(*joined))]
    assert len(got[0].completions[0].token_ids) == 200
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)


async def test_a_costly_client_delays_only_itself(
    backends: tuple[TransformersBackend, TransformersBackend],
) -> None:
    """One client runs n=16 under a costly regex for 160 tokens; another client sends
    8-token requests one after the other through the pool meanwhile. Each of them is
    answered before the costly request ends, and the decoding steps each waited from its
    submission to its answer keep their p99 within 2x of the same requests alone (a work
    count: load on the machine changes neither). With static batching they all waited for
    the costly batch to end."""
    _, continuous = backends
    sched = continuous._sched
    assert sched is not None
    shorts = [request(continuous, f"turn {i}: your move", max_tokens=8, seed=i) for i in range(8)]
    costly = request(continuous, "write a long word", temperature=1.0, seed=0, n=16)
    costly.params.max_tokens = 160
    costly.constraint = LONG

    async with InferencePool({"default": continuous}, PoolConfig(), owns_backends=False) as pool:
        for r in shorts:
            await pool.generate(r)
        baseline = sorted(sched.stats.waited)
        sched.stats.waited.clear()

        running = asyncio.Event()
        big = asyncio.ensure_future(pool.generate(costly, on_tokens=after(1, running)))
        await asyncio.wait_for(running.wait(), 30)
        done_before_costly = []
        for r in shorts:
            await pool.generate(r)
            done_before_costly.append(not big.done())
        result = await big
    with_neighbour = sorted(sched.stats.waited)[:-1]  # the costly request's own wait last
    assert [len(c.token_ids) for c in result.completions] == [160] * 16
    assert all(done_before_costly)
    assert len(with_neighbour) == len(baseline) == 8
    assert np.percentile(with_neighbour, 99) <= 2 * np.percentile(baseline, 99)


async def test_batching_is_static_or_continuous(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="static' or 'continuous"):
        await load_backend("transformers", str(tiny_model_dir), batching="dynamic")


async def test_weight_update_waits_for_live_rows_and_cancelled_rows_leave(
    backends: tuple[TransformersBackend, TransformersBackend],
) -> None:
    """A weight update while a request decodes: the running request finishes on the old
    weights (the static backend's tokens, version 0) and one submitted during the update
    runs on the new (version 1). A cancelled request's rows leave the batch at the next
    step, and the requests after it are answered."""
    static, continuous = backends
    long = request(static, "a long one", temperature=1.0, seed=7, max_tokens=40)
    long.constraint = LONG
    want = (await static.generate([long]))[0]
    name, weight = next(
        (k, v) for k, v in continuous.model.state_dict().items() if k.endswith("k_proj.weight")
    )
    update = WeightUpdate(policy="default", version=1, tensors={name: (weight * 1.5).numpy()})

    started = asyncio.Event()
    first = asyncio.ensure_future(continuous.generate([long], sinks=[after(3, started)]))
    await asyncio.wait_for(started.wait(), 30)
    updating = asyncio.ensure_future(continuous.update_weights(update))
    await asyncio.sleep(0)  # the update has drained the scheduler: later requests wait
    late = await continuous.generate([request(continuous, "after", max_tokens=4, seed=1)])
    await updating
    got = (await first)[0]
    assert got.policy_version == 0
    assert late[0].policy_version == 1
    assert_same(got, want)

    started, streamed = asyncio.Event(), []
    endless = request(continuous, "a long one", temperature=1.0, seed=7, max_tokens=1000)
    endless.constraint = LONG  # 1000 steps: the cancel reaches the thread long before
    doomed = asyncio.ensure_future(
        continuous.generate([endless], sinks=[lambda i, d: (streamed.append(d), started.set())])
    )
    await asyncio.wait_for(started.wait(), 30)
    doomed.cancel()
    short = request(continuous, "still here", max_tokens=4, seed=2, temperature=0)
    assert len((await continuous.generate([short]))[0].completions[0].token_ids) <= 4
    # Tasks run in order on the torch thread: this one once the scheduler's loop has ended.
    await asyncio.get_running_loop().run_in_executor(continuous._executor, lambda: None)
    sched = continuous._sched
    assert sched is not None
    assert sched._live == []
    assert len(streamed) < 1000  # the cancelled row left before its 1000 tokens


def test_bench_pool_measures_continuous_beside_static(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``parley bench pool --mixed-rounds R``: both arms in one run, the ratio in --json."""
    from parley.arena.cli import main

    status = main(
        [
            *("bench", "pool", "--json", "--model", str(tiny_model_dir), "--agents", "4"),
            *("--max-tokens", "2", "--rounds", "1", "--repeat", "1", "--adapters", "0"),
            *("--sequential-requests", "1", "--batching", "continuous"),
            *("--mixed-rounds", "2", "--mixed-max", "16", "--mixed-slots", "2"),
        ]
    )
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert result["batching"] == "continuous"
    assert (result["mixed_rounds"], result["mixed_slots"]) == (2, 2)
    assert result["static_mixed_tokens_per_s"] > 0
    assert result["continuous_mixed_tokens_per_s"] > 0
    assert result["continuous_ratio_vs_static"] > 0
    assert result["targets"]["continuous_ratio_vs_static"] == ">= 1.5"


def test_growing_cache_layer_joins_moves_and_trims_rows_as_stacking_would() -> None:
    """The running batch's cache layer against plain left-padded stacking: rows join
    narrower and wider than the live ones (wider ones need positions in front: taken from
    trimmed ones, or a new buffer), leave (the last rows take their places), decode past
    the spare columns and the spare rows. At every real position the live view equals the
    stacked rows, exactly; the positions the mask hides are finite (stale or zero)."""
    from parley.arena.inference.backends.transformers_sched import _growing_layer, _swap_order

    gen = torch.Generator().manual_seed(0)

    def kv(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(torch.randn(rows, 2, width, 3, generator=gen) for _ in "kv")  # type: ignore[return-value]

    def pad(x: torch.Tensor, width: int) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0,) * (2 * (x.dim() - 3)) + (width - x.shape[2], 0))

    keys, values = kv(2, 5)
    layer = _growing_layer()(keys, values, 6)
    want_k, want_v, real = keys, values, torch.ones(2, 1, 5, 1, dtype=torch.bool)

    def check() -> None:
        assert layer.keys.shape == want_k.shape
        assert torch.equal(torch.where(real, layer.keys, 0), want_k)
        assert torch.equal(torch.where(real, layer.values, 0), want_v)
        assert torch.isfinite(layer._k).all()
        assert torch.isfinite(layer._v).all()

    def join(rows: int, width: int) -> None:
        nonlocal want_k, want_v, real
        k, v = kv(rows, width)
        layer.join(k, v)
        w = max(want_k.shape[2], width)
        want_k = torch.cat([pad(want_k, w), pad(k, w)])
        want_v = torch.cat([pad(want_v, w), pad(v, w)])
        new = torch.ones(rows, 1, width, 1, dtype=torch.bool)
        real = torch.cat([pad(real, w), pad(new, w)])
        check()

    def step(times: int) -> None:
        nonlocal want_k, want_v, real
        for _ in range(times):
            k, v = kv(want_k.shape[0], 1)
            layer.update(k, v)
            want_k, want_v = torch.cat([want_k, k], dim=2), torch.cat([want_v, v], dim=2)
            real = torch.cat([real, torch.ones(real.shape[0], 1, 1, 1, dtype=torch.bool)], 2)
        check()

    def leave(keep: list[int], trim: int) -> None:
        nonlocal want_k, want_v, real
        order, holes, tails = _swap_order(keep)
        assert sorted(order) == keep
        layer.move(holes, tails, len(keep))
        layer.trim(trim)
        want_k, want_v = want_k[order][:, :, trim:], want_v[order][:, :, trim:]
        real = real[order][:, :, trim:]
        check()

    join(1, 3)  # narrower
    step(3)
    join(2, 12)  # wider, more rows than the buffer had: a new buffer
    step(70)  # past the spare columns
    leave([1, 3, 4], trim=10)
    join(2, 80)  # wider by less than the trimmed positions: no new buffer
    leave([0, 2, 3], trim=0)
    join(3, 4)  # up to max_rows
    step(2)
    leave([5], trim=0)


async def test_rows_that_join_and_leave_a_small_batch_decode_as_alone(
    tiny_model_dir: Path,
) -> None:
    """Twelve requests of 1 to 60 tokens, prompts of different lengths, through a
    continuous backend of 3 rows at most (rows of different ages side by side, leaving
    places that joining rows take, the batch trimmed and widened): each completion equals
    the static backend's for that request alone."""
    static = await load_backend("transformers", str(tiny_model_dir), prefix_cache_bytes=0)
    continuous = await load_backend(
        "transformers", str(tiny_model_dir), batching="continuous", max_batch_rows=3
    )
    assert isinstance(static, TransformersBackend)
    assert isinstance(continuous, TransformersBackend)
    try:
        rng = np.random.default_rng(0)
        requests = [
            request(
                static,
                "offer " * int(rng.integers(1, 30)),
                temperature=1.0,
                seed=k,
                max_tokens=int(rng.integers(1, 61)),
            )
            for k in range(12)
        ]
        want = [(await static.generate([r]))[0] for r in requests]
        got = await asyncio.gather(*(continuous.generate([r]) for r in requests))
        for g, w in zip(got, want, strict=True):
            assert_same(g[0], w)
        sched = continuous._sched
        assert sched is not None
        assert sched.stats.max_rows == 3
    finally:
        await static.close()
        await continuous.close()
