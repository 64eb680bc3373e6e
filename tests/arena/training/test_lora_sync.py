"""Weight sync of LoRA adapters: only the adapter travels, in-process and over the bus, and
the pool then serves exactly the trainer's adapter for that policy and nothing else moves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import zmq.asyncio  # noqa: E402

from parley.arena.inference.pool import InferencePool  # noqa: E402
from parley.arena.training.advantages import SampleKey  # noqa: E402
from parley.arena.training.config import RunSeeds, load_train_config  # noqa: E402
from parley.arena.training.models import Policies, load_policies  # noqa: E402
from parley.arena.training.pg import PGConfig, PolicyGradientTrainer, Sample  # noqa: E402
from parley.arena.training.sync import BusSync, InProcessSync, WeightSync  # noqa: E402
from parley.protocols.bus import Endpoint  # noqa: E402
from parley.protocols.messages import GenerateRequest, SamplingParams  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _policies(tiny_model_dir: Path, out: Path) -> Policies:
    config = load_train_config(
        data={
            "scenario": "collaboration/referential-v0",
            "model": str(tiny_model_dir),
            "policies": ["a", "b"],
            "lora": {"r": 4},
            "out": str(out),
            "stages": [{"name": "s", "train": ["a"], "agents": {"speaker": "scripted"}}],
        }
    )
    dirs = dict.fromkeys(config.policies, tiny_model_dir)
    return load_policies(config, RunSeeds.from_config(config), dirs, out)


async def _generate(pool: InferencePool, tokenizer: Any, policy: str) -> Any:
    ids = tokenizer.encode_chat([{"role": "user", "content": "Pick 1-2: red or blue"}])
    request = GenerateRequest(
        prompt_token_ids=ids, params=SamplingParams(max_tokens=6, seed=3), policy=policy
    )
    return await pool.generate(request)


def _trainer_logprobs(policies: Policies, policy: str, result: Any, prompt: list[int]) -> Any:
    completion = result.completions[0]
    sample = Sample(
        policy=policy,
        prompt_ids=prompt,
        token_ids=list(completion.token_ids),
        logprobs=list(completion.logprobs),
        policy_version=0,
        reward=0.0,
        key=SampleKey(policy),
    )
    trainer = PolicyGradientTrainer(
        policies.weights, policies.tokenizer.hf, PGConfig(), trainable=[]
    )
    with torch.no_grad(), policies.weights[policy].selected() as model:
        logp, _ = trainer.token_logprobs(model.eval(), [sample])
    return logp[0]


async def _check_push(policies: Policies, pool: InferencePool, sync: WeightSync) -> None:
    tokenizer = policies.tokenizer
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Pick 1-2: red or blue"}])
    before_b = await _generate(pool, tokenizer, "b")
    # A new adapter for "a" (as after training): random A and B, a change nobody can miss.
    with torch.no_grad():
        for p in policies.weights["a"].parameters():
            p.normal_(0, 0.2)
    tensors = policies.weights["a"].state_tensors()
    assert all("lora_" in k for k in tensors)  # only the adapter travels
    await sync.push("a", 1, tensors)
    assert pool.policies == {"_base0": 0, "a": 1, "b": 0}
    after_a = await _generate(pool, tokenizer, "a")
    after_b = await _generate(pool, tokenizer, "b")
    assert after_a.policy_version == 1
    assert after_b.policy_version == 0
    assert after_b.completions[0].token_ids == before_b.completions[0].token_ids
    assert after_b.completions[0].logprobs == pytest.approx(before_b.completions[0].logprobs)
    # The pool serves exactly the trainer's adapter: same logprobs for what it generated.
    want = _trainer_logprobs(policies, "a", after_a, prompt)
    got = torch.tensor(after_a.completions[0].logprobs)
    torch.testing.assert_close(got, want[want.shape[0] - got.shape[0] :], rtol=0, atol=1e-4)
    assert after_a.completions[0].token_ids != before_b.completions[0].token_ids


async def test_in_process_sync_replaces_one_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    policies = _policies(tiny_model_dir, tmp_path)
    async with await InferencePool(policies.served).start() as pool:
        await policies.attach(pool)
        await _check_push(policies, pool, InProcessSync(pool))


async def test_bus_sync_ships_only_the_adapter_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    policies = _policies(tiny_model_dir, tmp_path)
    context = zmq.asyncio.Context()
    pool_endpoint = Endpoint("pool", context=context)
    trainer_endpoint = Endpoint("trainer", context=context)
    try:
        async with await InferencePool(policies.served).start() as pool:
            await policies.attach(pool)
            pool.serve(pool_endpoint)
            address = await pool_endpoint.bind("inproc://lora-sync-test")
            await trainer_endpoint.connect(address, timeout=10)
            sync = BusSync(trainer_endpoint, tmp_path / "weights", keep=2)
            await _check_push(policies, pool, sync)
            shipped = load_file(str(tmp_path / "weights" / "a-v1.safetensors"))
            assert sorted(shipped) == sorted(policies.weights["a"].state_tensors())
            size = (tmp_path / "weights" / "a-v1.safetensors").stat().st_size
            base = sum(p.numel() * 4 for p in policies.served["_base0"].model.parameters())
            assert size < base / 10, (size, base)
    finally:
        await trainer_endpoint.close()
        await pool_endpoint.close()
        context.destroy(linger=0)
