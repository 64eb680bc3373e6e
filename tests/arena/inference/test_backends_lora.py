"""Per-seat LoRA adapters in the transformers backend: mixed batches, hot swap, bad input.

Real parts throughout: the tiny model, adapters written by peft's ``save_pretrained`` with
random weights (so every adapter's greedy output differs), peft's own ``PeftModel`` as the
reference, and the real pool for the hot-swap tests.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from parley.arena.inference.backends.errors import BackendError  # noqa: E402
from parley.arena.inference.backends.lora import save_random_adapter  # noqa: E402
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402
from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError  # noqa: E402
from parley.protocols.errors import ConfigError  # noqa: E402
from parley.protocols.messages import GenerateRequest, SamplingParams, WeightUpdate  # noqa: E402

pytestmark = pytest.mark.timeout(180)

PROMPTS = ["hi", "I offer 2 books and 1 hat", "What is your name? " * 3]
NAMES = ["alice", "bob.v2", "__base__"]  # hostile-looking names are just names


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [save_random_adapter(tiny_model_dir, root / f"a{i}", seed=i) for i in range(3)]


@pytest.fixture
async def backend(tiny_model_dir: Path) -> TransformersBackend:
    b = await TransformersBackend.create(str(tiny_model_dir), max_lora_rank=16)
    yield b
    await b.close()


def request(b: TransformersBackend, i: int, policy: str, max_tokens: int = 6) -> GenerateRequest:
    ids = b.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return GenerateRequest(prompt_token_ids=ids, params=params, policy=policy)


async def greedy(b: TransformersBackend, policy: str) -> list[list[int]]:
    """Each prompt alone, greedily, with ``policy``."""
    out = []
    for i in range(len(PROMPTS)):
        (result,) = await b.generate([request(b, i, policy)])
        out.append(result.completions[0].token_ids)
    return out


async def test_mixed_batch_equals_each_adapter_alone_and_base_stays_base(
    backend: TransformersBackend, adapter_dirs: list[Path]
) -> None:
    base_before = await greedy(backend, "base")
    for name, path in zip(NAMES, adapter_dirs, strict=True):
        await backend.add_adapter(name, str(path))
    assert backend.adapters == dict.fromkeys(NAMES, 0)
    alone = {p: await greedy(backend, p) for p in [*NAMES, "base"]}
    assert alone["base"] == base_before  # adapters never leak into base rows
    # Every adapter changes the output, differently: the test can tell them apart.
    outputs = [tuple(map(tuple, alone[p])) for p in [*NAMES, "base"]]
    assert len(set(outputs)) == len(outputs)
    # One batch, rows interleaved across adapters and the base, prompts of unequal length.
    jobs = [(i, p) for i in range(len(PROMPTS)) for p in ["base", *NAMES]]
    mixed = await backend.generate([request(backend, i, p) for i, p in jobs])
    for (i, p), result in zip(jobs, mixed, strict=True):
        assert result.policy == p
        assert result.completions[0].token_ids == alone[p][i], (i, p)


async def test_adapter_logprobs_equal_peft_reference(
    backend: TransformersBackend, tiny_model_dir: Path, adapter_dirs: list[Path]
) -> None:
    await backend.add_adapter("alice", str(adapter_dirs[0]))
    await backend.add_adapter("bob", str(adapter_dirs[1]))
    jobs = [request(backend, i, "alice") for i in range(3)] + [request(backend, 0, "bob")]
    results = await backend.generate(jobs)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    reference = peft.PeftModel.from_pretrained(base, str(adapter_dirs[0])).eval()
    for job, result in zip(jobs[:3], results[:3], strict=True):
        prompt, tokens = list(job.prompt_token_ids), result.completions[0].token_ids
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([prompt + tokens])).logits[0]
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
        expected = logp.gather(1, torch.tensor(tokens)[:, None]).flatten().tolist()
        assert result.completions[0].logprobs == pytest.approx(expected, abs=1e-4)
        assert tokens == logp.argmax(-1).tolist()


async def test_hot_swap_bumps_one_adapter_and_does_not_fail_others_in_flight(
    backend: TransformersBackend, adapter_dirs: list[Path]
) -> None:
    for name, path in zip(["alice", "bob"], adapter_dirs[:2], strict=True):
        await backend.add_adapter(name, str(path))
    bob_before = await greedy(backend, "bob")
    from safetensors.torch import load_file

    bob_tensors = load_file(str(adapter_dirs[1] / "adapter_model.safetensors"))
    update = WeightUpdate(
        policy="alice", version=7, tensors={k: v.numpy() for k, v in bob_tensors.items()}
    )
    async with InferencePool({"base": backend}, PoolConfig(max_wait=0.05)) as pool:
        for name in ("alice", "bob"):
            pool.add_policy(name, backend)
        # A long batch of bob and base requests is decoding when alice's update arrives.
        running = [
            asyncio.ensure_future(pool.generate(request(backend, i, p, max_tokens=48)))
            for i in range(3)
            for p in ("bob", "base")
        ]
        while pool.stats.batches == 0:  # noqa: ASYNC110 (the pool signals no batch start)
            await asyncio.sleep(0.005)
        swap = asyncio.ensure_future(pool.update_weights(update))
        await asyncio.sleep(0)
        assert not any(r.done() for r in running)  # the update came mid-batch
        later = asyncio.ensure_future(pool.generate(request(backend, 0, "bob")))
        first = await asyncio.gather(*running)
        assert await swap == 7
        after = await later
        alice_after = [(await pool.generate(request(backend, i, "alice"))) for i in range(3)]
        assert pool.policies == {"base": 0, "alice": 7, "bob": 0}
    assert [r.policy_version for r in first] == [0] * 6  # finished on the old weights
    assert all(r.completions[0].finish_reason in ("stop", "length") for r in first)
    assert after.policy_version == 0  # bob was not touched
    assert after.completions[0].token_ids == bob_before[0]
    # alice now carries bob's tensors: she answers exactly as bob does, at version 7.
    assert [r.completions[0].token_ids for r in alice_after] == bob_before
    assert {r.policy_version for r in alice_after} == {7}
    assert pool.stats.failed == 0


async def test_update_from_an_adapter_dir_and_base_update_with_adapters(
    backend: TransformersBackend, adapter_dirs: list[Path], tiny_model_dir: Path
) -> None:
    await backend.add_adapter("alice", str(adapter_dirs[0]))
    await backend.add_adapter("bob", str(adapter_dirs[1]))
    bob = await greedy(backend, "bob")
    await backend.update_weights(WeightUpdate(policy="alice", version=1, path=str(adapter_dirs[1])))
    assert await greedy(backend, "alice") == bob
    assert backend.version_of("alice") == 1
    # A base update names the plain model's tensors, also those peft wrapped (q_proj).
    hidden = backend.model.config.hidden_size
    q = np.zeros((hidden, hidden), "f4")
    norm = np.zeros(hidden, "f4")
    tensors = {"model.layers.0.self_attn.q_proj.weight": q, "model.norm.weight": norm}
    await backend.update_weights(WeightUpdate(policy="base", version=3, tensors=tensors))
    assert (backend.policy_version, backend.adapters) == (3, {"alice": 1, "bob": 0})
    (result,) = await backend.generate([request(backend, 0, "bob")])
    vocab = backend.model.config.vocab_size
    # A zero final norm makes every logit 0: adapters sit on the updated base.
    assert result.completions[0].logprobs == pytest.approx([-np.log(vocab)] * 6, abs=1e-4)
    assert result.policy_version == 0


def _write_adapter(src: Path, dst: Path, *, config: dict | None = None, tensors=None) -> Path:
    """A copy of adapter ``src`` with its config fields / tensors changed."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    raw = json.loads((src / "adapter_config.json").read_text())
    raw.update(config or {})
    (dst / "adapter_config.json").write_text(json.dumps(raw))
    state = load_file(str(src / "adapter_model.safetensors"))
    if tensors is not None:
        state = tensors(state)
    save_file(state, str(dst / "adapter_model.safetensors"))
    return dst


def _other_base_adapter(dst: Path) -> Path:
    """An adapter made for a different Llama (hidden 64): same names, other shapes."""
    config = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"])
    peft.get_peft_model(model, lora).save_pretrained(str(dst))
    return dst


def _bad_adapters(src: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (adapter dir, a phrase the error must contain)."""
    first = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"

    def nan(state: dict) -> dict:
        state[first] = state[first].clone().fill_(float("nan"))
        return state

    def extra(state: dict) -> dict:
        state["base_model.model.lm_head.lora_A.weight"] = torch.zeros(8, 128)
        return state

    def missing(state: dict) -> dict:
        del state[first]
        return state

    def wrong_shape(state: dict) -> dict:
        state[first] = torch.zeros(8, 64)
        return state

    corrupt = _write_adapter(src, root / "corrupt")
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x00" * 40)
    no_json = _write_adapter(src, root / "no_json")
    (no_json / "adapter_config.json").write_text("{not json")
    return {
        "missing dir": (root / "nowhere", "no PEFT adapter"),
        "other base": (_other_base_adapter(root / "other_base"), "another base"),
        "wrong shape": (_write_adapter(src, root / "shape", tensors=wrong_shape), "(8, 64)"),
        "NaN": (_write_adapter(src, root / "nan", tensors=nan), "NaN"),
        "unknown key": (_write_adapter(src, root / "extra", tensors=extra), "lm_head"),
        "missing key": (_write_adapter(src, root / "missing", tensors=missing), "lacks 1"),
        "rank": (_write_adapter(src, root / "rank", config={"r": 32}), "ranks 1..16"),
        "targets": (
            _write_adapter(src, root / "targets", config={"target_modules": ["nope"]}),
            "does not fit",
        ),
        "dora": (_write_adapter(src, root / "dora", config={"use_dora": True}), "use_dora"),
        "prefix tuning": (
            _write_adapter(src, root / "prefix", config={"peft_type": "PREFIX_TUNING"}),
            "only LORA",
        ),
        "corrupt weights": (corrupt, "cannot read adapter weights"),
        "bad json": (no_json, "unreadable adapter_config.json"),
    }


async def test_bad_adapters_are_refused_and_nothing_changes(
    backend: TransformersBackend, adapter_dirs: list[Path], tmp_path: Path
) -> None:
    await backend.add_adapter("alice", str(adapter_dirs[0]))
    alice, base = await greedy(backend, "alice"), await greedy(backend, "base")
    for case, (path, phrase) in _bad_adapters(adapter_dirs[0], tmp_path).items():
        with pytest.raises(ConfigError) as err:
            await backend.add_adapter("mallory", str(path))
        assert phrase in str(err.value), (case, str(err.value))
        assert backend.adapters == {"alice": 0}, case
    with pytest.raises(ConfigError, match="served already"):
        await backend.add_adapter("alice", str(adapter_dirs[1]))
    assert await greedy(backend, "alice") == alice
    assert await greedy(backend, "base") == base
    assert await greedy(backend, "mallory") == base  # never loaded: served by the base


async def test_bad_updates_are_refused_and_the_adapter_is_unchanged(
    backend: TransformersBackend, adapter_dirs: list[Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    await backend.add_adapter("alice", str(adapter_dirs[0]))
    before = await greedy(backend, "alice")
    state = load_file(str(adapter_dirs[1] / "adapter_model.safetensors"))
    good = {k: v.numpy() for k, v in state.items()}
    first = next(iter(good))
    bad_updates = {
        "NaN": ({**good, first: np.full_like(good[first], np.nan)}, "NaN"),
        "inf": ({**good, first: np.full_like(good[first], np.inf)}, "infinite"),
        "wrong shape": ({**good, first: np.zeros((3, 3), "f4")}, "(3, 3)"),
        "unknown key": ({**good, "base_model.model.x.lora_A.weight": good[first]}, "unknown"),
        "adapter-named key": ({first.replace("lora_A.", "lora_A.alice."): good[first]}, "unknown"),
        "empty": ({}, "no tensors"),
    }
    async with InferencePool({"base": backend}, owns_backends=False) as pool:
        pool.add_policy("alice", backend)
        for case, (tensors, phrase) in bad_updates.items():
            update = WeightUpdate(policy="alice", version=1, tensors=tensors)
            with pytest.raises(PoolError) as err:
                await pool.update_weights(update)
            assert err.value.code == "bad_request", case  # the update is at fault
            assert phrase in err.value.message, (case, err.value.message)
        rank = str(_write_adapter(adapter_dirs[0], tmp_path / "r4", config={"r": 4}))
        with pytest.raises(PoolError, match="keeps the adapter's shape"):
            await pool.update_weights(WeightUpdate(policy="alice", version=1, path=rank))
        assert pool.policies == {"base": 0, "alice": 0}
    assert await greedy(backend, "alice") == before
    # A partial update (a subset of the adapter's tensors) is allowed and applied.
    await backend.update_weights(
        WeightUpdate(policy="alice", version=2, tensors={first: good[first]})
    )
    assert backend.version_of("alice") == 2
    nan = {"model.norm.weight": np.full(backend.model.config.hidden_size, np.nan, "f4")}
    with pytest.raises(BackendError, match="NaN"):
        await backend.update_weights(WeightUpdate(policy="base", version=1, tensors=nan))
    assert backend.policy_version == 0


async def test_embedding_lora_takes_peft_mixed_path_and_matches_reference(
    backend: TransformersBackend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An adapter on the embeddings (peft's own mixed-batch path) beside a Linear-only one."""
    emb = save_random_adapter(
        tiny_model_dir, tmp_path / "emb", seed=5, targets=("embed_tokens", "v_proj")
    )
    lin = save_random_adapter(tiny_model_dir, tmp_path / "lin", seed=6)
    await backend.add_adapter("emb", str(emb))
    await backend.add_adapter("lin", str(lin))
    alone = {p: await greedy(backend, p) for p in ("emb", "lin", "base")}
    assert alone["emb"] != alone["base"]
    jobs = [(i, p) for i in range(len(PROMPTS)) for p in ("lin", "emb", "base")]
    mixed = await backend.generate([request(backend, i, p) for i, p in jobs])
    assert [r.completions[0].token_ids for r in mixed] == [alone[p][i] for i, p in jobs]
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    reference = peft.PeftModel.from_pretrained(base, str(emb)).eval()
    prompt = list(request(backend, 0, "emb").prompt_token_ids)
    tokens = alone["emb"][0]
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([prompt + tokens])).logits[0]
    assert tokens == logits[len(prompt) - 1 : -1].argmax(-1).tolist()


async def test_an_adapter_cannot_change_the_shared_base(
    backend: TransformersBackend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """peft saves the embedding matrix with an embedding adapter: it must be the base's."""
    emb = save_random_adapter(tiny_model_dir, tmp_path / "emb", seed=5, targets=("embed_tokens",))
    key = "base_model.model.model.embed_tokens.base_layer.weight"

    def poison(state: dict) -> dict:
        assert key in state  # what peft writes (save_embedding_layers)
        state[key] = state[key] + 1.0
        return state

    bad = _write_adapter(emb, tmp_path / "poisoned", tensors=poison)
    base = await greedy(backend, "base")
    with pytest.raises(ConfigError, match="differs from the served base"):
        await backend.add_adapter("mallory", str(bad))
    await backend.add_adapter("emb", str(emb))
    assert await greedy(backend, "base") == base
    from safetensors.torch import load_file

    state = load_file(str(bad / "adapter_model.safetensors"))
    update = WeightUpdate(policy="emb", version=1, tensors={key: state[key].numpy()})
    with pytest.raises(BackendError, match="differs from the served base"):
        await backend.update_weights(update)
    assert await greedy(backend, "base") == base
    assert backend.adapters == {"emb": 0}


async def test_seeded_sampling_with_n_is_the_same_alone_and_in_a_mixed_batch(
    backend: TransformersBackend, adapter_dirs: list[Path]
) -> None:
    await backend.add_adapter("alice", str(adapter_dirs[0]))
    await backend.add_adapter("bob", str(adapter_dirs[1]))
    ids = backend.tokenizer.encode_chat([{"role": "user", "content": "offer"}])

    def sampled(policy: str, seed: int) -> GenerateRequest:
        params = SamplingParams(temperature=1.0, max_tokens=8, n=2, seed=seed)
        return GenerateRequest(prompt_token_ids=ids, params=params, policy=policy)

    jobs = [("alice", 1), ("bob", 1), ("base", 1), ("alice", 2)]
    alone = [(await backend.generate([sampled(p, s)]))[0] for p, s in jobs]
    mixed = await backend.generate([sampled(p, s) for p, s in jobs])
    for a, m in zip(alone, mixed, strict=True):
        assert [c.token_ids for c in a.completions] == [c.token_ids for c in m.completions]
        for ca, cm in zip(a.completions, m.completions, strict=True):
            assert ca.logprobs == pytest.approx(cm.logprobs, abs=1e-4)
    # Same seed, different adapters: different samples (the adapter shapes the distribution).
    assert alone[0].completions[0].token_ids != alone[1].completions[0].token_ids


async def test_poisoned_adapters_and_updates_leave_base_and_other_adapters_unchanged(
    backend: TransformersBackend, adapter_dirs: list[Path], tmp_path: Path
) -> None:
    """NaN, +-inf and huge (x1e8) tensors, as a new adapter, as a hot swap (inline and as a
    directory) and as a full-weight update (inline and as a file), are each refused with
    the tensor's name; the base and both adapters decode as before, alone and mixed."""
    from tests.arena.inference.poison import push_poison

    await backend.add_adapter("alice", str(adapter_dirs[0]))
    await backend.add_adapter("bob", str(adapter_dirs[1]))
    policies = ["base", "alice", "bob"]
    before = {p: await greedy(backend, p) for p in policies}
    hidden = backend.model.config.hidden_size
    await push_poison(backend, adapter_dirs[2], "alice", "base", hidden, tmp_path)
    assert backend.adapters == {"alice": 0, "bob": 0}
    assert backend.policy_version == 0
    assert {p: await greedy(backend, p) for p in policies} == before
    jobs = [(i, p) for i in range(len(PROMPTS)) for p in policies]
    mixed = await backend.generate([request(backend, i, p) for i, p in jobs])
    for (i, p), result in zip(jobs, mixed, strict=True):
        assert result.completions[0].token_ids == before[p][i], (i, p)
