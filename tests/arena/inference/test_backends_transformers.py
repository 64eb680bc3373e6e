"""The transformers backend on the tiny model, loaded through its real loading path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from parley.arena.inference.backends import BackendError, load_backend  # noqa: E402
from parley.arena.inference.backends.constraints import matches  # noqa: E402
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402
from parley.protocols.messages import (  # noqa: E402
    Constraint,
    GenerateRequest,
    SamplingParams,
    WeightUpdate,
)
from tests.arena.inference.backend_util import chat, request  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def backend(tiny_model_dir: Path) -> TransformersBackend:
    b = await load_backend("transformers", str(tiny_model_dir))
    assert isinstance(b, TransformersBackend)
    yield b
    await b.close()


PROMPTS = ["hi", "I offer 2 books and 1 hat", "deny", "What is your name? " * 4, "3", "ok ok"]


def teacher_forced_logprobs(b: TransformersBackend, prompt: list[int], tokens: list[int]):
    """(T, V) log-softmax of the model's logits at each generated position, no cache."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = b.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits


async def test_tokenizer_round_trip(backend: TransformersBackend) -> None:
    ids = chat(backend, "I offer 2 books")
    assert "I offer 2 books" in backend.tokenizer.decode(ids)
    assert backend.tokenizer.encode("I offer") == backend.tokenizer.encode("I offer")
    assert backend.policy_version == 0
    assert backend.max_context == 2048


async def test_batch_equals_single_with_greedy_decoding(backend: TransformersBackend) -> None:
    reqs = [request(chat(backend, p), temperature=0, max_tokens=16) for p in PROMPTS]
    batch = await backend.generate(reqs)
    assert len(batch) == len(reqs)
    for req, res in zip(reqs, batch, strict=True):
        alone = (await backend.generate([req]))[0]
        assert res.prompt_token_ids == req.prompt_token_ids
        assert alone.completions[0].token_ids == res.completions[0].token_ids
        assert alone.completions[0].logprobs == pytest.approx(res.completions[0].logprobs, abs=1e-4)


async def test_greedy_logprobs_are_the_maximum_of_the_model_distribution(
    backend: TransformersBackend,
) -> None:
    prompt = chat(backend, PROMPTS[1])
    (res,) = await backend.generate([request(prompt, temperature=0, max_tokens=12)])
    c = res.completions[0]
    logp = torch.log_softmax(teacher_forced_logprobs(backend, prompt, c.token_ids), dim=-1)
    assert c.token_ids == logp.argmax(-1).tolist()
    assert c.logprobs == pytest.approx(logp.max(-1).values.tolist(), abs=1e-4)


async def test_sampled_logprobs_match_the_tempered_distribution(
    backend: TransformersBackend,
) -> None:
    prompt = chat(backend, PROMPTS[0])
    (res,) = await backend.generate([request(prompt, temperature=0.7, max_tokens=12, seed=1)])
    c = res.completions[0]
    logits = teacher_forced_logprobs(backend, prompt, c.token_ids)
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(c.token_ids)[:, None])
    assert all(lp <= 0 for lp in c.logprobs)
    assert c.logprobs == pytest.approx(expected.flatten().tolist(), abs=1e-4)


async def test_top_p_keeps_samples_inside_the_nucleus(backend: TransformersBackend) -> None:
    prompt = chat(backend, PROMPTS[2])
    (res,) = await backend.generate(
        [request(prompt, temperature=1.0, top_p=0.3, max_tokens=8, n=4, seed=2)]
    )
    for c in res.completions:
        logp = torch.log_softmax(teacher_forced_logprobs(backend, prompt, c.token_ids), dim=-1)
        for pos, tok in enumerate(c.token_ids):
            probs, order = logp[pos].exp().sort(descending=True)
            rank = (order == tok).nonzero().item()
            assert probs[:rank].sum() < 0.3  # the mass above the token is below top_p
        # renormalised over the nucleus: each logprob is at least the unrestricted one
        full = logp.gather(1, torch.tensor(c.token_ids)[:, None]).flatten().tolist()
        assert all(a >= b - 1e-5 for a, b in zip(c.logprobs, full, strict=True))


async def test_seeded_requests_are_reproducible_whatever_shares_the_batch(
    backend: TransformersBackend,
) -> None:
    seeded = request(chat(backend, PROMPTS[3]), temperature=1.0, max_tokens=10, seed=7, n=3)
    (alone,) = await backend.generate([seeded])
    others = [request(chat(backend, p), temperature=1.0, max_tokens=20) for p in PROMPTS]
    together = await backend.generate([*others[:3], seeded, *others[3:]])
    assert [c.token_ids for c in together[3].completions] == [
        c.token_ids for c in alone.completions
    ]
    assert len({tuple(c.token_ids) for c in alone.completions}) > 1  # n draws differ


async def test_each_row_keeps_its_own_parameters(backend: TransformersBackend) -> None:
    reqs = [
        request(chat(backend, PROMPTS[0]), temperature=0, max_tokens=3),
        request(chat(backend, PROMPTS[1]), temperature=1.5, max_tokens=17, seed=3),
        request(chat(backend, PROMPTS[2]), temperature=0, max_tokens=9, n=2),
    ]
    out = await backend.generate(reqs)
    assert [len(r.completions) for r in out] == [1, 1, 2]
    for req, res in zip(reqs, out, strict=True):
        for c in res.completions:
            assert len(c.token_ids) == len(c.logprobs) <= req.params.max_tokens
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert len(c.token_ids) == req.params.max_tokens
    greedy_alone = await backend.generate([reqs[0], reqs[2]])
    assert greedy_alone[0].completions[0].token_ids == out[0].completions[0].token_ids
    assert out[2].completions[0].token_ids == out[2].completions[1].token_ids  # greedy n=2


async def test_stop_strings_cut_the_text(backend: TransformersBackend) -> None:
    prompt = chat(backend, PROMPTS[1])
    (free,) = await backend.generate([request(prompt, temperature=0, max_tokens=24)])
    text = free.completions[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop, "the greedy continuation is long enough to hold a stop string"
    (cut,) = await backend.generate([request(prompt, temperature=0, max_tokens=24, stop=[stop])])
    c = cut.completions[0]
    assert c.finish_reason == "stop"
    assert c.text == text[: text.find(stop)]
    assert c.token_ids == free.completions[0].token_ids[: len(c.token_ids)]


CONSTRAINTS = [
    Constraint(type="choice", choices=["offer", "accept", "deny", "book=2 hat=1"]),
    Constraint(type="regex", pattern=r"book=[0-4] hat=[0-4] ball=[0-4]"),
    Constraint(type="regex", pattern=r"(yes|no), [a-z]{1,6}\."),
    Constraint(
        type="json",
        json_schema=json.dumps(
            {
                "type": "object",
                "properties": {
                    "action": {"enum": ["offer", "accept", "deny"]},
                    "book": {"type": "integer"},
                    "ok": {"type": "boolean"},
                },
            }
        ),
    ),
]


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda c: c.type)
async def test_constrained_completions_are_always_valid(
    backend: TransformersBackend, constraint: Constraint
) -> None:
    prompt = chat(backend, "make your move")
    reqs = [
        GenerateRequest(
            prompt_token_ids=prompt,
            params=SamplingParams(temperature=t, max_tokens=48, n=4, seed=s),
            constraint=constraint,
        )
        for s, t in ((0, 1.0), (1, 1.5), (2, 0.0))
    ]
    for res in await backend.generate(reqs):
        for c in res.completions:
            if c.finish_reason == "length":  # an unbounded integer may run to max_tokens
                assert constraint.type == "json"
                continue
            assert c.finish_reason == "stop", c
            assert matches(constraint, c.text), c.text
            assert c.token_ids[-1] == backend.tokenizer.eos_token_id
            assert all(lp <= 0 for lp in c.logprobs)


async def test_weight_updates_change_outputs_and_bump_the_version(
    backend: TransformersBackend, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    prompt = chat(backend, PROMPTS[1])
    greedy = request(prompt, temperature=0, max_tokens=12)
    (before,) = await backend.generate([greedy])
    gen = torch.Generator().manual_seed(0)
    state = {
        name: p.detach() + 0.3 * torch.randn(p.shape, generator=gen)
        for name, p in backend.model.named_parameters()
    }
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    await backend.update_weights(WeightUpdate(policy="default", version=1, path=str(tmp_path)))
    (after,) = await backend.generate([greedy])
    assert backend.policy_version == after.policy_version == 1
    assert before.policy_version == 0
    assert after.completions[0].token_ids != before.completions[0].token_ids

    name = "model.norm.weight"
    inline = {name: (backend.model.get_parameter(name).detach() * 0).numpy()}
    await backend.update_weights(WeightUpdate(policy="default", version=2, tensors=inline))
    assert backend.policy_version == 2
    assert float(backend.model.get_parameter(name).detach().abs().sum()) == 0.0


async def test_bad_weight_updates_change_nothing(backend: TransformersBackend) -> None:
    import numpy as np

    with pytest.raises(BackendError, match="unknown tensor"):
        await backend.update_weights(
            WeightUpdate(policy="default", version=5, tensors={"nope": np.zeros(3)})
        )
    with pytest.raises(BackendError, match="shape"):
        await backend.update_weights(
            WeightUpdate(policy="default", version=5, tensors={"model.norm.weight": np.zeros(3)})
        )
    assert backend.policy_version == 0


@pytest.mark.parametrize(
    "bad",
    [
        GenerateRequest(),
        GenerateRequest(prompt="x", params=SamplingParams(n=0)),
        GenerateRequest(prompt="x", params=SamplingParams(top_p=0)),
        GenerateRequest(prompt_token_ids=[10**6]),
        GenerateRequest(prompt="hat " * 3000),  # longer than the 2048-token context
        GenerateRequest(prompt="x", constraint=Constraint(type="choice")),
        GenerateRequest(prompt="x", constraint=Constraint(type="regex", pattern="(")),
        GenerateRequest(
            prompt="x", constraint=Constraint(type="json", json_schema='{"$ref": "#"}')
        ),
    ],
)
async def test_invalid_requests_are_rejected_before_any_work(
    backend: TransformersBackend, bad: GenerateRequest
) -> None:
    with pytest.raises(BackendError):
        backend.validate(bad)
    with pytest.raises(BackendError):
        await backend.generate([GenerateRequest(prompt="fine"), bad])


async def test_cancelling_a_generate_call_leaves_the_backend_usable(
    backend: TransformersBackend,
) -> None:
    long = request(chat(backend, "go"), temperature=1.0, max_tokens=1500, n=8, seed=0)
    task = asyncio.create_task(backend.generate([long]))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (res,) = await asyncio.wait_for(backend.generate([request([5, 6, 7], max_tokens=3)]), 30)
    assert len(res.completions[0].token_ids) <= 3


async def test_text_prompts_and_the_event_loop_stays_free(backend: TransformersBackend) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    t = asyncio.create_task(ticker())
    res = await backend.generate(
        [GenerateRequest(prompt="hello", params=SamplingParams(max_tokens=64, n=16, seed=0))]
    )
    t.cancel()
    assert res[0].prompt_token_ids == backend.tokenizer.encode("hello")
    assert ticks > 0


async def test_grouped_query_attention_gives_transformers_sdpa_outputs(
    backend: TransformersBackend,
) -> None:
    """On the CPU the backend's model shares each key/value head among its query heads
    in ``scaled_dot_product_attention`` instead of transformers' copying them per step
    (the tiny model has 4 query heads on 2 key/value heads): a padded batch with prefix
    reuse decodes the same tokens and logprobs (within 1e-5) as with stock ``sdpa``, and
    as with the decoding steps' masks built by transformers (the backend hands them over
    built); a forward with gradients (training) is stock ``sdpa``'s."""
    assert backend.model.model.layers[0].self_attn.num_key_value_groups == 2
    assert backend.model.config._attn_implementation == "parley_sdpa"
    assert backend._step_mask_4d
    turns = [[chat(backend, p) for p in PROMPTS]]
    turns.append([ids + ids[-3:] for ids in turns[0]])  # second turns: prefix reuse
    params = {"temperature": 0.9, "seed": 5, "max_tokens": 12, "logprobs": True}

    async def decode() -> list[tuple[list[int], list[float]]]:
        backend.prefix_cache.clear()
        out = []
        for prompts in turns:
            results = await backend.generate([request(ids, **params) for ids in prompts])
            out += [(c.token_ids, c.logprobs) for r in results for c in r.completions]
        return out

    grouped = await decode()
    assert backend.prefix_cache.stats.hit_rate > 0
    ids = torch.tensor([turns[0][3]])
    with torch.enable_grad():
        train_grouped = backend.model(input_ids=ids).logits
    backend.model.config._attn_implementation = "sdpa"
    stock = await decode()
    with torch.enable_grad():
        train_stock = backend.model(input_ids=ids).logits
    backend._step_mask_4d = False
    built = await decode()
    for other in (stock, built):
        assert [t for t, _ in grouped] == [t for t, _ in other]
        for (_, got), (_, want) in zip(grouped, other, strict=True):
            assert got == pytest.approx(want, abs=1e-5)
    assert torch.equal(train_grouped, train_stock)
