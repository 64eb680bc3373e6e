"""The entropy bonus (pg.entropy_coef): the reported entropy is the hand-computed mean
per-token entropy, and with no reward signal at all the update raises it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from parley.arena.training.pg import PGConfig, PolicyGradientTrainer  # noqa: E402
from parley.protocols.errors import ConfigError  # noqa: E402
from tests.arena.training.test_pg_epochs import _samples  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from parley.arena.inference.backends.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32")
    return model, load_tokenizer(str(tiny_model_dir)).hf


def _mean_entropy(model: Any, samples: list[Any]) -> float:
    """Mean entropy of the next-token distribution at each generated token, one row at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.token_ids])
            logits = model(input_ids=ids).logits[0].float()  # (L, V)
            k = len(s.token_ids)
            logp = torch.log_softmax(logits[-k - 1 : -1], dim=-1)  # (k, V)
            total += float(-(logp.exp() * logp).sum())
            count += k
    return total / count


@pytest.mark.timeout(120)
def test_entropy_bonus_alone_raises_the_entropy_it_reports(tiny: tuple[Any, Any]) -> None:
    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    samples = _samples(model, hf)
    for s in samples:
        s.reward = 1.0  # every advantage is 0: only the bonus moves the weights
    before = _mean_entropy(model, samples)
    config = PGConfig(lr=3e-2, entropy_coef=1.0, max_grad_norm=100.0)
    trainer = PolicyGradientTrainer({"p": model}, hf, config)
    metrics = trainer.step(samples)
    assert metrics["entropy"] == pytest.approx(before, rel=1e-3)
    after = _mean_entropy(model, samples)
    assert after > before + 1e-3


def test_entropy_coef_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="entropy_coef"):
        PGConfig(entropy_coef=-0.1)


@pytest.mark.timeout(120)
def test_entropy_bonus_under_a_constraint_keeps_the_weights_finite(
    tiny: tuple[Any, Any],
) -> None:
    """Masked tokens have logprob -inf: the bonus must not turn 0 * -inf into NaN gradients
    (a first version did, and every weight became NaN after one update)."""
    from parley.protocols.messages import Constraint

    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    choice = Constraint(type="choice", choices=["red", "blue", "green"])
    samples = _samples(model, hf)
    for i, s in enumerate(samples):
        s.token_ids = hf.encode(choice.choices[i % 3], add_special_tokens=False)
        s.constraint = choice
    trainer = PolicyGradientTrainer({"p": model}, hf, PGConfig(lr=1e-2, entropy_coef=0.01))
    with torch.no_grad():
        logp, _ = trainer.token_logprobs(model, samples)  # (n, T), under the constraint
    for i, s in enumerate(samples):
        s.logprobs = logp[i, logp.shape[1] - len(s.token_ids) :].tolist()
    metrics = trainer.step(samples)
    assert 0.0 < metrics["entropy"] < 2.0  # at most log 3 over three legal first tokens
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert trainer.step(samples)["reward_mean"] == pytest.approx(0.5)
