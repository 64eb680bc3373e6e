"""Logprobs exact by default (issue 12 §3): what the transformers backend records at
generation is what the policy-gradient trainer computes for the same tokens, with both at
their default settings (the importance weights of on-policy samples are exactly 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.protocols.messages import Constraint, GenerateRequest, SamplingParams

torch = pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402
from parley.arena.training.advantages import SampleKey  # noqa: E402
from parley.arena.training.pg import PGConfig, PolicyGradientTrainer, Sample  # noqa: E402

pytestmark = pytest.mark.timeout(180)

CONSTRAINTS = [
    None,
    Constraint(type="choice", choices=["offer", "accept", "deny two hats"]),
    Constraint(
        type="json",
        json_schema=json.dumps(
            {
                "type": "object",
                "properties": {"book": {"enum": [0, 1, 2]}, "say": {"type": "string"}},
            }
        ),
    ),
]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_recorded_logprobs_are_the_trainers(tiny_model_dir: Path, temperature: float) -> None:
    from transformers import AutoModelForCausalLM

    backend = await TransformersBackend.create(str(tiny_model_dir))  # default dtype
    assert backend.dtype == "float32"
    chat = backend.tokenizer.encode_chat
    requests = [
        GenerateRequest(
            prompt_token_ids=chat([{"role": "user", "content": f"offer {i}" * (1 + i % 3)}]),
            params=SamplingParams(temperature=temperature, max_tokens=12, seed=i),
            constraint=CONSTRAINTS[i % len(CONSTRAINTS)],
        )
        for i in range(9)
    ]
    results = await backend.generate(requests)
    await backend.close()
    samples = [
        Sample(
            policy="p",
            prompt_ids=list(r.prompt_token_ids),
            token_ids=list(r.completions[0].token_ids),
            logprobs=list(r.completions[0].logprobs),
            policy_version=0,
            reward=0.0,
            key=SampleKey(role="a"),
            constraint=q.constraint,
        )
        for q, r in zip(requests, results, strict=True)
    ]
    # The trainer loads the checkpoint its own way (arena/training/loop.py: float32).
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32").eval()
    trainer = PolicyGradientTrainer(
        {"p": model}, backend.tokenizer, PGConfig(temperature=temperature), trainable=[]
    )
    with torch.no_grad():
        logp, valid = trainer.token_logprobs(model, samples)
    worst = 0.0
    for i, s in enumerate(samples):
        k = len(s.token_ids)
        trained = logp[i, logp.shape[1] - k :].tolist()
        assert valid[i].sum().item() == k
        worst = max(worst, *(abs(a - b) for a, b in zip(trained, s.logprobs, strict=True)))
    assert worst < 1e-5, f"largest generation/training logprob difference: {worst:.2e}"
