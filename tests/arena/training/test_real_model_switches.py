"""Real-model switches on the tiny model: micro-batches by token budget, mixed precision,
gradient checkpointing, and how a run's models are loaded (full models or shared bases)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from parley.arena.training.adapters import LoraConfig, attach_adapters  # noqa: E402
from parley.arena.training.advantages import SampleKey  # noqa: E402
from parley.arena.training.config import RunSeeds, load_train_config  # noqa: E402
from parley.arena.training.models import load_policies  # noqa: E402
from parley.arena.training.pg import PGConfig, PolicyGradientTrainer, Sample  # noqa: E402
from parley.arena.training.precision import check_precision  # noqa: E402
from parley.protocols.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from parley.arena.inference.backends.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32")
    return model.train(), load_tokenizer(str(tiny_model_dir)).hf


def _samples(n: int = 20, seed: int = 0, long_one: int = 0) -> list[Sample]:
    """Decisions of very different lengths with advantages set (``long_one``: the length
    of one extra, much longer prompt)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n + (1 if long_one else 0)):
        prompt = int(rng.integers(2, 30)) if i < n else long_one
        tokens = rng.integers(6, 1000, size=int(rng.integers(1, 7))).tolist()
        out.append(
            Sample(
                policy="p",
                prompt_ids=rng.integers(6, 1000, size=prompt).tolist(),
                token_ids=tokens,
                logprobs=(-rng.random(len(tokens)) * 3).tolist(),  # ratios != 1: clip active
                policy_version=0,
                reward=float(i % 2),
                key=SampleKey("p", prompt=str(i)),
                advantage=float(rng.normal()),
            )
        )
    return out


def _grads(trainer: PolicyGradientTrainer, samples: list[Sample]) -> list[Any]:
    trainer.accumulate_gradients("p", samples)
    return [
        p.grad.detach().clone() if p.grad is not None else None
        for p in trainer.weights["p"].parameters()
    ]


@pytest.mark.parametrize("objective", ["grpo", "dapo", "rloo"])
@pytest.mark.parametrize("lora", [False, True])
def test_token_budget_micro_batches_give_the_one_batch_gradient(
    tiny: tuple[Any, Any], objective: str, lora: bool
) -> None:
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    policy: Any = model
    if lora:
        policy = attach_adapters(model, ["p"], LoraConfig(r=4), {"p": 3})["p"]
        with torch.no_grad():  # B = 0 would leave A without gradient: make both live
            for p in policy.parameters():
                p.normal_(0, 0.05)
    settings = {"objective": objective, "length_norm": 8, "entropy_coef": 0.01}
    samples = _samples(12, long_one=100)
    whole = PolicyGradientTrainer({"p": policy}, hf, PGConfig(micro_batch=1000, **settings))
    budget = 80
    split = PolicyGradientTrainer(
        {"p": policy}, hf, PGConfig(micro_batch=1000, token_budget=budget, **settings)
    )
    parts = split.micro_batches(samples)
    assert len(parts) > 3  # the budget really splits the batch
    assert sorted(id(s) for part in parts for s in part) == sorted(id(s) for s in samples)
    for part in parts:
        padded = len(part) * max(len(s.prompt_ids) + len(s.token_ids) for s in part)
        assert padded <= budget or len(part) == 1, (len(part), padded)
    totals = dict.fromkeys(
        ("loss", "micro_batches", "over_budget", "tokens", "sequences", "ratio_sum"), 0.0
    )
    totals |= {"clipped": 0.0, "is_weight_sum": 0.0, "kl_sum": 0.0, "entropy_sum": 0.0}
    totals |= {"gap_sum": 0.0, "gap_tokens": 0.0, "ratio_min": 9.0, "ratio_max": 0.0}
    reference = _grads(whole, samples)
    split.accumulate_gradients("p", samples, totals)
    got = [p.grad for p in split.weights["p"].parameters()]
    assert totals["micro_batches"] == len(parts)
    assert totals["over_budget"] == 1  # the 100-token prompt went alone, over the budget
    assert sum(g is not None for g in reference) > 0
    for want, have in zip(reference, got, strict=True):
        if want is None:
            assert have is None
            continue
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-6)


def test_token_budget_is_validated_and_micro_batch_still_caps() -> None:
    with pytest.raises(ConfigError, match="token_budget"):
        PGConfig(token_budget=-1)
    trainer = PolicyGradientTrainer({}, None, PGConfig(micro_batch=3, token_budget=10_000))
    parts = trainer.micro_batches(_samples(10))
    assert [len(p) for p in parts] == [3, 3, 3, 1]


def test_precision_is_checked_against_the_device() -> None:
    check_precision("fp32", "cpu")
    check_precision("bf16", "cpu")
    with pytest.raises(ConfigError, match="choose one of"):
        check_precision("fp8", "cpu")
    with pytest.raises(ConfigError, match="use fp32"):
        check_precision("bf16", "meta")  # torch has no autocast there
    with pytest.raises(ConfigError, match="precision"):
        load_train_config(
            data={
                "scenario": "collaboration/referential-v0",
                "precision": "half",
                "stages": [{"name": "s", "train": [], "agents": {"speaker": "scripted"}}],
            }
        )


def _on_policy(model: Any, hf: Any, seed: int = 0) -> list[Sample]:
    """Samples whose recorded logprobs are ``model``'s in its own dtype (as served)."""
    samples = _samples(8, seed=seed)
    scorer = PolicyGradientTrainer({"p": model}, hf, PGConfig(), trainable=[])
    with torch.no_grad():
        logp, _ = scorer.token_logprobs(model, samples)
    for i, s in enumerate(samples):
        s.logprobs = logp[i, logp.shape[1] - len(s.token_ids) :].float().tolist()
    return samples


def test_bf16_autocast_trains_and_logp_gap_reports_a_dtype_mismatch(tiny: tuple[Any, Any]) -> None:
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    served_fp32 = _on_policy(model, hf)
    served_bf16 = _on_policy(copy.deepcopy(model).to(torch.bfloat16), hf)
    fp32 = PolicyGradientTrainer({"p": copy.deepcopy(model)}, hf, PGConfig(lr=1e-3))
    assert fp32.step(served_fp32)["logp_gap"] < 1e-5  # same dtype, same code: no gap
    # bf16 autocast scores differently from fp32 generation, and from a bf16 model too
    # (autocast keeps norms and residuals in float32): the metric shows by how much.
    # Measured on the tiny model: ~0.010 and ~0.015 nats per token.
    gaps = []
    for served in (served_fp32, served_bf16):
        trainer = PolicyGradientTrainer(
            {"p": copy.deepcopy(model)}, hf, PGConfig(lr=1e-3), precision="bf16"
        )
        gaps.append(trainer.step(served)["logp_gap"])
    assert all(1e-4 < gap < 0.1 for gap in gaps), gaps
    bf16 = PolicyGradientTrainer({"p": model}, hf, PGConfig(lr=1e-3), precision="bf16")
    before = [p.detach().clone() for p in model.parameters()]
    assert np.isfinite(bf16.step(served_bf16)["loss"])
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_fp16_trains_with_a_grad_scaler(tiny: tuple[Any, Any]) -> None:
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    trainer = PolicyGradientTrainer({"p": model}, hf, PGConfig(lr=1e-3), precision="fp16")
    assert trainer._scalers["p"] is not None
    before = [p.detach().clone() for p in model.parameters()]
    metrics = trainer.step(_on_policy(model, hf))
    assert np.isfinite(metrics["loss"])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_gradient(tiny: tuple[Any, Any], lora: bool) -> None:
    samples = _samples(8)
    grads = []
    for checkpointing in (False, True):
        model = copy.deepcopy(tiny[0])
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        policy: Any = model.train()
        if lora:
            policy = attach_adapters(model, ["p"], LoraConfig(r=4), {"p": 0})["p"]
            with torch.no_grad():
                for p in policy.parameters():
                    p.fill_(0.01)
        assert model.is_gradient_checkpointing == checkpointing
        calls: list[int] = []
        mlp = model.model.layers[0].mlp
        forward = mlp.forward  # wrapped (a forward hook does not see the recomputation)
        mlp.forward = lambda *a, f=forward, c=calls, **k: (c.append(1), f(*a, **k))[1]
        trainer = PolicyGradientTrainer({"p": policy}, tiny[1], PGConfig())
        grads.append(_grads(trainer, samples))
        # One micro-batch: the block's MLP runs once, and once more in the backward pass
        # when its activations were not kept.
        assert len(calls) == (2 if checkpointing else 1)
    for a, b in zip(*grads, strict=True):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def _config(tiny_model_dir: Path, tmp_path: Path, **extra: Any) -> Any:
    return load_train_config(
        data={
            "scenario": "collaboration/referential-v0",
            "model": str(tiny_model_dir),
            "policies": ["speaker", "listener", "coach"],
            "out": str(tmp_path),
            "stages": [{"name": "s", "train": ["listener"], "agents": {"speaker": "scripted"}}],
            **extra,
        }
    )


def test_loading_full_models_with_precision_and_checkpointing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = _config(tiny_model_dir, tmp_path, precision="bf16", gradient_checkpointing=True)
    dirs = dict.fromkeys(config.policies, tiny_model_dir)
    policies = load_policies(config, RunSeeds.from_config(config), dirs, tmp_path)
    assert sorted(policies.served) == ["coach", "listener", "speaker"]
    assert not policies.adapters
    for name, weights in policies.weights.items():
        assert weights.module.is_gradient_checkpointing
        assert weights.module.training
        assert next(weights.module.parameters()).dtype == torch.float32
        served = policies.served[name]
        assert served.dtype == "bfloat16"  # the pool computes as the trainer's autocast
        assert not served.model.is_gradient_checkpointing
        assert served.model is not weights.module


def test_loading_adapters_shares_one_base_per_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

    other = build_tiny_model(tmp_path / "other", TinyModelConfig(seed=5))
    config = _config(tiny_model_dir, tmp_path, lora={"r": 4, "init_seed": 7})
    dirs = {"speaker": tiny_model_dir, "listener": other, "coach": tiny_model_dir}
    seeds = RunSeeds.from_config(config)
    assert seeds.lora == {"speaker": 7, "listener": 8, "coach": 9}
    policies = load_policies(config, seeds, dirs, tmp_path)
    w = policies.weights
    assert w["speaker"].module is w["coach"].module  # one base, two adapters
    assert w["listener"].module is not w["speaker"].module  # another checkpoint
    assert sorted(policies.served) == ["_base0", "_base1"]  # one served backend per base
    adapters = {policy: (base, path) for policy, base, path in policies.adapters}
    assert adapters["speaker"][0] == adapters["coach"][0] != adapters["listener"][0]
    for _, path in adapters.values():
        assert (path / "adapter_config.json").is_file()
        assert (path / "adapter_model.safetensors").is_file()


def test_the_device_is_checked_before_anything_loads() -> None:
    from parley.arena.training.models import resolve_device

    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("tpu", "gpu0", "meta"):
        with pytest.raises(ConfigError, match="device"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            resolve_device("cuda:0")
