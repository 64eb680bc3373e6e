"""PPO-style epochs and minibatches on the tiny model: the ratio leaves 1 and the clip acts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from parley.arena.training.advantages import SampleKey  # noqa: E402
from parley.arena.training.pg import PGConfig, PolicyGradientTrainer, Sample  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from parley.arena.inference.backends.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32")
    return model, load_tokenizer(str(tiny_model_dir)).hf


def _samples(model: Any, hf: Any, shift: float = 0.0) -> list[Sample]:
    """16 decisions with rewards 0/1, their logprobs those of ``model`` plus ``shift``."""
    rng = np.random.default_rng(0)
    samples = [
        Sample(
            policy="p",
            prompt_ids=rng.integers(5, 1000, size=int(rng.integers(3, 8))).tolist(),
            token_ids=rng.integers(5, 1000, size=int(rng.integers(1, 5))).tolist(),
            logprobs=[],
            policy_version=0,
            reward=float(i % 2),
            key=SampleKey("a", prompt=str(i)),
        )
        for i in range(16)
    ]
    scorer = PolicyGradientTrainer({"p": model}, hf, PGConfig(), trainable=[])
    with torch.no_grad():
        logp, _ = scorer.token_logprobs(model, samples)  # (n, T)
    for i, s in enumerate(samples):
        s.logprobs = [v + shift for v in logp[i, logp.shape[1] - len(s.token_ids) :].tolist()]
    return samples


@pytest.mark.timeout(120)
def test_one_epoch_on_policy_has_ratio_one_and_no_clipping(tiny: tuple[Any, Any]) -> None:
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    trainer = PolicyGradientTrainer({"p": model}, hf, PGConfig(lr=1e-2))
    metrics = trainer.step(_samples(model, hf))
    assert metrics["optimizer_steps"] == 1
    assert metrics["ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_frac"] == 0.0
    assert trainer.version == 1


@pytest.mark.timeout(120)
def test_epochs_and_minibatches_move_the_ratio_and_the_clip_acts(tiny: tuple[Any, Any]) -> None:
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    config = PGConfig(lr=1e-2, epochs=3, minibatches=2, seed=1)
    trainer = PolicyGradientTrainer({"p": model}, hf, config)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = trainer.step(_samples(model, hf))
    assert metrics["optimizer_steps"] == 6
    assert trainer.version == 1  # one published version per batch, whatever the steps
    assert metrics["ratio_max"] - metrics["ratio_min"] > 0.05, metrics
    assert metrics["clip_frac"] > 0.0, metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.timeout(120)
def test_stale_samples_are_clipped_on_the_first_step(tiny: tuple[Any, Any]) -> None:
    """Samples whose recorded logprobs are 0.5 lower (an older policy liked them less):
    ratio e^0.5 = 1.65 per token, so every token with A > 0 sits on its clipped side."""
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    trainer = PolicyGradientTrainer({"p": model}, hf, PGConfig(estimator="dr_grpo"))
    metrics = trainer.step(_samples(model, hf, shift=-0.5))
    assert metrics["ratio_mean"] == pytest.approx(np.exp(0.5), rel=1e-3)
    tokens_a_positive = 0.5  # rewards alternate 0/1: half the sequences have A > 0
    assert metrics["clip_frac"] == pytest.approx(tokens_a_positive, abs=0.25)
    assert metrics["clip_frac"] > 0.0


def test_samples_without_their_logprobs_are_refused(tiny: tuple[Any, Any]) -> None:
    model, hf = tiny
    trainer = PolicyGradientTrainer({"p": model}, hf, PGConfig())
    samples = _samples(model, hf)
    samples[3].logprobs = []
    with pytest.raises(ValueError, match="logprobs=True"):
        trainer.step(samples)
    assert trainer.version == 0


def _tagged(model: Any, hf: Any, version: int) -> list[Sample]:
    samples = _samples(model, hf)
    for s in samples:
        s.policy_version = version
    return samples


@pytest.mark.timeout(180)
@pytest.mark.parametrize("max_age", [None, 1])
def test_replayed_samples_are_no_older_than_replay_max_age(
    tiny: tuple[Any, Any], max_age: int | None
) -> None:
    """Found by review: with a replay buffer the age of trained samples grew without bound
    (0, 1, ..., 7 versions over 8 updates at S = 0), and no metric said so. Fresh samples are
    always on-policy here; ``replay_age_max`` reports the replayed ones' age."""
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    config = PGConfig(lr=1e-3, replay=1000, replay_fraction=0.5, replay_max_age=max_age)
    trainer = PolicyGradientTrainer({"p": model}, hf, config)
    ages = []
    for _ in range(5):
        metrics = trainer.step(_tagged(model, hf, trainer.version))
        ages.append(metrics["replay_age_max"])
        if trainer.version > 1:
            assert metrics["replayed"] > 0
    if max_age is None:
        assert ages[-1] >= 3  # the unbounded buffer: what the bound is for
    else:
        assert max(ages) <= max_age, ages
