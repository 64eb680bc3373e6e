"""The trainer with LoRA adapters: one frozen base, one adapter and optimizer per policy.

Real parts: the tiny Llama, ``peft`` adapters, the real PolicyGradientTrainer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from parley.arena.training.adapters import LoraConfig, attach_adapters  # noqa: E402
from parley.arena.training.advantages import SampleKey  # noqa: E402
from parley.arena.training.pg import PGConfig, PolicyGradientTrainer, Sample  # noqa: E402
from parley.protocols.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _base(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32").train()


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    return load_tokenizer(str(tiny_model_dir)).hf


def _samples(policy: str, n: int = 12, seed: int = 0) -> list[Sample]:
    """Decisions with rewards 0/1 and placeholder logprobs (set by _score)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tokens = rng.integers(6, 1000, size=int(rng.integers(1, 5))).tolist()
        out.append(
            Sample(
                policy=policy,
                prompt_ids=rng.integers(6, 1000, size=int(rng.integers(3, 9))).tolist(),
                token_ids=tokens,
                logprobs=[0.0] * len(tokens),
                policy_version=0,
                reward=float(i % 2),
                key=SampleKey(policy, prompt=str(i)),
            )
        )
    return out


def _score(trainer: PolicyGradientTrainer, samples: list[Sample]) -> None:
    """Record each sample's logprobs under its policy as it is now (on-policy samples)."""
    for s in samples:
        with torch.no_grad(), trainer.weights[s.policy].selected() as model:
            logp, _ = trainer.token_logprobs(model, [s])
        s.logprobs = logp[0, logp.shape[1] - len(s.token_ids) :].tolist()


def _split(model: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(base tensors, per adapter its tensors), cloned."""
    base: dict[str, Any] = {}
    adapters: dict[str, dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            adapter = name.split(".")[-2]
            adapters.setdefault(adapter, {})[name] = p.detach().clone()
        else:
            base[name] = p.detach().clone()
    return base, adapters


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_only_the_learning_policys_adapter_moves_and_the_base_stays_bit_identical(
    tiny_model_dir: Path, hf: Any
) -> None:
    weights = attach_adapters(_base(tiny_model_dir), ["a", "b"], LoraConfig(r=4), {"a": 1, "b": 2})
    model = weights["a"].module
    assert weights["b"].module is model  # one base for both policies
    trainer = PolicyGradientTrainer(weights, hf, PGConfig(lr=1e-2), trainable=["a"])
    # Each optimizer holds exactly its own adapter's parameters.
    for name in ("a", "b"):
        trainer.set_trainable([name])
        held = {id(p) for g in trainer._optims[name].param_groups for p in g["params"]}
        assert held == {id(p) for p in weights[name].parameters()}
    base0, adapters0 = _split(model)
    # Stage 1: a learns, b plays frozen (its samples only update baselines).
    trainer.set_trainable(["a"])
    samples = _samples("a") + _samples("b", seed=1)
    _score(trainer, samples)
    trainer.step(samples)
    base1, adapters1 = _split(model)
    assert _same(base0, base1), "the base changed"
    assert not _same(adapters0["policy0"], adapters1["policy0"]), "a's adapter did not learn"
    assert _same(adapters0["policy1"], adapters1["policy1"]), "b's adapter moved while frozen"
    # Stage 2: b learns, a is frozen.
    trainer.set_trainable(["b"])
    samples = _samples("a", seed=2) + _samples("b", seed=3)
    _score(trainer, samples)
    trainer.step(samples)
    base2, adapters2 = _split(model)
    assert _same(base0, base2), "the base changed"
    assert _same(adapters1["policy0"], adapters2["policy0"]), "a's adapter moved while frozen"
    assert not _same(adapters1["policy1"], adapters2["policy1"]), "b's adapter did not learn"


def test_a_weight_update_ships_only_the_adapter_named_as_peft_names_it(
    tiny_model_dir: Path, hf: Any
) -> None:
    base = _base(tiny_model_dir)
    base_numel = sum(p.numel() for p in base.parameters())
    weights = attach_adapters(base, ["listener", "a"], LoraConfig(r=4), {"listener": 0, "a": 0})
    trainer = PolicyGradientTrainer(weights, hf, PGConfig(), trainable=["listener"])
    tensors = trainer.state_tensors("listener")
    expected = peft.get_peft_model_state_dict(weights["listener"].module, adapter_name="policy0")
    assert sorted(tensors) == sorted(expected)
    assert all("lora_A" in k or "lora_B" in k for k in tensors)
    assert not any("policy0" in k or "listener" in k for k in tensors)  # no adapter name
    # 7 linear layers x 2 blocks, an A and a B each
    assert len(tensors) == 28
    shipped = sum(v.size for v in tensors.values())
    assert shipped == weights["listener"].trainable_numel()
    assert shipped < base_numel / 10, (shipped, base_numel)
    # The same seed draws the same initial adapter (B = 0: the policy is the base).
    other = trainer.state_tensors("a")
    assert all(np.array_equal(tensors[k], other[k]) for k in tensors)
    assert all(not v.any() for k, v in tensors.items() if "lora_B" in k)


def test_the_kl_reference_is_the_base_with_adapters_off(tiny_model_dir: Path, hf: Any) -> None:
    plain = _base(tiny_model_dir).eval()
    weights = attach_adapters(_base(tiny_model_dir), ["a"], LoraConfig(r=4), {"a": 0})
    trainer = PolicyGradientTrainer(weights, hf, PGConfig(lr=3e-2, kl_coef=0.1))
    samples = _samples("a")
    _score(trainer, samples)
    first = trainer.step(samples)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # a fresh adapter (B = 0) is the base
    for seed in range(1, 4):
        batch = _samples("a", seed=seed)
        _score(trainer, batch)
        last = trainer.step(batch)
    assert last["kl"] > 1e-6, "the adapter learned, so the policy left the reference"
    with torch.no_grad(), weights["a"].reference() as ref:
        assert ref is weights["a"].module  # the shared model itself, not a copy
        ref_logp, _ = trainer.token_logprobs(ref, samples)
    with torch.no_grad():
        base_logp, _ = trainer.token_logprobs(plain, samples)
        own_logp, _ = trainer.token_logprobs(weights["a"].module, samples)
    # The tiny model has no dropout: the reference is the base, to float error.
    torch.testing.assert_close(ref_logp, base_logp, rtol=0, atol=1e-5)
    assert (own_logp - base_logp).abs().max() > 1e-4  # outside the block the adapter is on


def test_a_checkpoint_is_a_peft_adapter_dir_that_peft_loads(
    tiny_model_dir: Path, hf: Any, tmp_path: Path
) -> None:
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    weights = attach_adapters(
        _base(tiny_model_dir),
        ["a", "b"],
        LoraConfig(r=4, alpha=8),
        {"a": 0, "b": 1},
        base_path=str(tiny_model_dir),
    )
    trainer = PolicyGradientTrainer(weights, hf, PGConfig(lr=3e-2), trainable=["b"])
    samples = _samples("b")
    _score(trainer, samples)
    trainer.step(samples)
    weights["b"].save(tmp_path / "b", load_tokenizer(str(tiny_model_dir)))
    assert {p.name for p in (tmp_path / "b").iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    config = json.loads((tmp_path / "b" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    loaded = peft.PeftModel.from_pretrained(_base(tiny_model_dir).eval(), str(tmp_path / "b"))
    with torch.no_grad():
        want, _ = trainer.token_logprobs(weights["b"].module.eval(), samples)
        got, _ = trainer.token_logprobs(loaded, samples)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_bad_lora_settings_are_config_errors(tiny_model_dir: Path) -> None:
    for bad in ({"r": 0}, {"alpha": 0}, {"dropout": 1.0}, {"target_modules": []}):
        with pytest.raises(ConfigError):
            LoraConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lora"):
        attach_adapters(
            _base(tiny_model_dir), ["a"], LoraConfig(target_modules=["no_such_proj"]), {"a": 0}
        )


def test_policy_names_peft_would_refuse_or_misload_still_work(
    tiny_model_dir: Path, hf: Any, tmp_path: Path
) -> None:
    """Dots are illegal in PEFT adapter names and names inside its ``lora_`` prefix are
    mis-loaded; policy names are free text, so the adapters are named internally."""
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    names = ["a", "team.lora_A", "lora weights"]
    weights = attach_adapters(
        _base(tiny_model_dir), names, LoraConfig(r=2), {n: i for i, n in enumerate(names)}
    )
    trainer = PolicyGradientTrainer(weights, hf, PGConfig(lr=3e-2), trainable=names)
    samples = [s for i, n in enumerate(names) for s in _samples(n, n=3, seed=i)]
    _score(trainer, samples)
    trainer.step(samples)
    for name in names:
        tensors = trainer.state_tensors(name)
        assert len(tensors) == 28
        assert any(v.any() for k, v in tensors.items() if "lora_B" in k), name
        weights[name].save(tmp_path / name.replace(" ", "_"), load_tokenizer(str(tiny_model_dir)))
        loaded = peft.PeftModel.from_pretrained(
            _base(tiny_model_dir).eval(), str(tmp_path / name.replace(" ", "_"))
        )
        with torch.no_grad(), weights[name].selected() as model:  # this policy's adapter on
            want, _ = trainer.token_logprobs(model.eval(), samples[:2])
            got, _ = trainer.token_logprobs(loaded, samples[:2])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_an_fp16_overflow_skips_the_step_and_never_writes_inf(
    tiny_model_dir: Path, hf: Any
) -> None:
    weights = attach_adapters(_base(tiny_model_dir), ["a"], LoraConfig(r=4), {"a": 0})
    trainer = PolicyGradientTrainer(
        weights, hf, PGConfig(lr=1e-2, objective="reinforce"), precision="fp16"
    )
    before = [p.detach().clone() for p in weights["a"].parameters()]
    samples = _samples("a", n=6)
    _score(trainer, samples)
    for s in samples:
        s.reward = 1e38 if s.reward else -1e38  # advantages that overflow any fp16 gradient
    metrics = trainer.step(samples)
    after = list(weights["a"].parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # skipped
    assert metrics["optimizer_steps"] == 1
    # The next, sane batch trains normally.
    samples = _samples("a", n=6, seed=5)
    _score(trainer, samples)
    trainer.step(samples)
    trainer.step(samples)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
