"""Top-k logprobs (issue 12 §6): the transformers backend against a plain forward pass, under
constraints and top-p, at the door, and through the HTTP front with the ``openai`` client."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

torch = pytest.importorskip("torch")

from parley.arena.inference.backends import RequestError  # noqa: E402
from parley.arena.inference.backends.constraints import TokenMatcher  # noqa: E402
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402
from parley.arena.inference.http import serve_http  # noqa: E402
from parley.arena.inference.pool import InferencePool, PoolConfig  # noqa: E402
from parley.protocols.messages import Constraint, GenerateRequest, SamplingParams  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def backend(tiny_model_dir: Path) -> AsyncIterator[TransformersBackend]:
    b = await TransformersBackend.create(str(tiny_model_dir))
    yield b
    await b.close()


def reference(
    model_dir: Path, prompt: list[int], tokens: list[int], temperature: float = 1.0
) -> Any:
    """(T, V) log-softmax of a plain float32 forward pass (what the trainer computes)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)


def request(prompt: list[int], **params: Any) -> GenerateRequest:
    return GenerateRequest(prompt_token_ids=prompt, params=SamplingParams(**params))


async def test_top_k_is_the_forward_pass_top_k(
    backend: TransformersBackend, tiny_model_dir: Path
) -> None:
    prompt = backend.tokenizer.encode_chat([{"role": "user", "content": "Offer two hats."}])
    asks = [request(prompt, temperature=1.0, max_tokens=16, seed=s, top_logprobs=5) for s in (1, 2)]
    results = await backend.generate(asks)
    for res in results:
        c = res.completions[0]
        assert len(c.top_token_ids) == len(c.top_logprobs) == len(c.token_ids) == 16
        logp = reference(tiny_model_dir, prompt, c.token_ids)
        values, ids = logp.topk(5, dim=-1)
        assert c.top_token_ids == ids.tolist()
        worst = max(
            abs(a - b)
            for got, want in zip(c.top_logprobs, values.tolist(), strict=True)
            for a, b in zip(got, want, strict=True)
        )
        assert worst < 1e-5
        for token, lp, top_ids, top_lps in zip(
            c.token_ids, c.logprobs, c.top_token_ids, c.top_logprobs, strict=True
        ):
            assert top_lps == sorted(top_lps, reverse=True)
            if token in top_ids:  # its rank: listed with its own logprob
                assert top_lps[top_ids.index(token)] == pytest.approx(lp, abs=1e-6)
            else:  # ranked below the k listed
                assert lp <= top_lps[-1] + 1e-6


async def test_greedy_token_is_ranked_first_and_asked_k_is_per_request(
    backend: TransformersBackend,
) -> None:
    prompt = backend.tokenizer.encode("the hat is")
    greedy, none, one = await backend.generate(
        [
            request(prompt, temperature=0, max_tokens=8, top_logprobs=20),
            request(prompt, temperature=0, max_tokens=8),
            request(prompt, temperature=0.8, max_tokens=8, seed=3, top_logprobs=1),
        ]
    )
    g = greedy.completions[0]
    assert [ids[0] for ids in g.top_token_ids] == g.token_ids
    assert [lps[0] for lps in g.top_logprobs] == g.logprobs
    assert all(len(ids) == 20 for ids in g.top_token_ids)
    assert none.completions[0].top_token_ids == [] == none.completions[0].top_logprobs
    assert all(len(ids) == 1 for ids in one.completions[0].top_token_ids)


async def test_under_a_constraint_only_allowed_tokens_are_alternatives(
    backend: TransformersBackend,
) -> None:
    """Top-k under a constraint is the top-k of the masked, renormalised distribution the
    token was drawn from: tokens the constraint forbids never appear, and when it allows
    fewer than k the list is shorter and its probabilities sum to 1."""
    constraint = Constraint(type="choice", choices=["accept", "deny", "deal", "no"])
    allowed = TokenMatcher(backend._vocab, constraint).allowed()  # the first step's mask
    allowed_ids = set(allowed.nonzero()[0].tolist())
    assert 1 < len(allowed_ids) < 20
    prompt = backend.tokenizer.encode("answer:")
    asks = [
        GenerateRequest(
            prompt_token_ids=prompt,
            params=SamplingParams(temperature=t, max_tokens=8, seed=4, top_logprobs=20),
            constraint=constraint,
        )
        for t in (1.0, 0.0)
    ]
    for res in await backend.generate(asks):
        c = res.completions[0]
        assert c.text in constraint.choices
        assert set(c.top_token_ids[0]) == allowed_ids
        assert math.fsum(math.exp(v) for v in c.top_logprobs[0]) == pytest.approx(1, abs=1e-5)
        for token, lp, ids, lps in zip(
            c.token_ids, c.logprobs, c.top_token_ids, c.top_logprobs, strict=True
        ):
            assert token in ids
            assert lps[ids.index(token)] == pytest.approx(lp, abs=1e-6)
            assert all(math.isfinite(v) for v in lps)


async def test_top_p_leaves_out_what_it_cuts(backend: TransformersBackend) -> None:
    prompt = backend.tokenizer.encode("two books")
    (res,) = await backend.generate(
        [request(prompt, temperature=1.0, top_p=0.05, max_tokens=6, seed=0, top_logprobs=20)]
    )
    c = res.completions[0]
    for ids, lps in zip(c.top_token_ids, c.top_logprobs, strict=True):
        assert 1 <= len(ids) < 20
        assert math.fsum(math.exp(v) for v in lps) == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2.0}, "top_logprobs"),
        ({"top_logprobs": 3, "logprobs": False}, "top_logprobs"),
    ],
)
def test_the_door_refuses_bad_top_logprobs(
    backend: TransformersBackend, params: dict[str, Any], field: str
) -> None:
    with pytest.raises(RequestError) as bad:
        backend.validate(GenerateRequest(prompt="x", params=SamplingParams(**params)))
    assert bad.value.field == field


# --- the HTTP front, through the official client --------------------------------------


@pytest.fixture
async def client(backend: TransformersBackend) -> AsyncIterator[openai.AsyncOpenAI]:
    async with InferencePool(
        {"tiny": backend}, PoolConfig(max_wait=0.01), owns_backends=False
    ) as pool:
        runner, url = await serve_http(pool)
        try:
            async with openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as c:
                yield c
        finally:
            await runner.cleanup()


CHAT = [{"role": "user", "content": "Make an offer."}]


async def test_chat_top_logprobs_plain_and_streamed(client: openai.AsyncOpenAI) -> None:
    args: dict[str, Any] = {"model": "tiny", "messages": CHAT, "max_tokens": 10, "seed": 7, "n": 2}
    args |= {"logprobs": True, "top_logprobs": 4, "temperature": 1.0}
    plain = await client.chat.completions.create(**args)
    tops: dict[int, list[list[tuple[str, float]]]] = {}
    for choice in plain.choices:
        assert choice.logprobs is not None
        assert choice.logprobs.content
        for entry in choice.logprobs.content:
            assert len(entry.top_logprobs) == 4
            values = [t.logprob for t in entry.top_logprobs]
            assert values == sorted(values, reverse=True)
            assert entry.logprob <= values[0] + 1e-6
            assert all(t.bytes == list(t.token.encode()) for t in entry.top_logprobs)
        tops[choice.index] = [
            [(t.token, t.logprob) for t in e.top_logprobs] for e in choice.logprobs.content
        ]
    streamed: dict[int, list[list[tuple[str, float]]]] = {}
    async for chunk in await client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            for e in (choice.logprobs.content or []) if choice.logprobs else []:
                streamed.setdefault(choice.index, []).append(
                    [(t.token, t.logprob) for t in e.top_logprobs]
                )
    # The streamed call reuses the plain call's cached prompt prefix (prefix_cache.py):
    # the same tokens, logprobs equal up to float rounding.
    assert streamed.keys() == tops.keys()
    for index, steps in tops.items():
        assert [[t for t, _ in s] for s in streamed[index]] == [[t for t, _ in s] for s in steps]
        got = [v for s in streamed[index] for _, v in s]
        assert got == pytest.approx([v for s in steps for _, v in s], abs=1e-5)


async def test_completions_top_logprobs_plain_and_streamed(client: openai.AsyncOpenAI) -> None:
    args: dict[str, Any] = {"model": "tiny", "prompt": ["the hat", "a ball"], "max_tokens": 6}
    args |= {"logprobs": 3, "temperature": 0, "extra_body": {"return_tokens_as_token_ids": True}}
    plain = await client.completions.create(**args)
    assert len(plain.choices) == 2
    want: dict[int, list[dict[str, float]]] = {}
    for choice in plain.choices:
        lp = choice.logprobs
        assert lp is not None
        assert lp.tokens
        assert lp.top_logprobs
        assert lp.token_logprobs
        for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            assert len(top) == 3
            assert next(iter(top)) == token  # greedy: the token is ranked first
            assert top[token] == value
        want[choice.index] = lp.top_logprobs
    got: dict[int, list[dict[str, float]]] = {}
    async for chunk in await client.completions.create(stream=True, **args):
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.top_logprobs:
                got.setdefault(choice.index, []).extend(choice.logprobs.top_logprobs)
    # As above: the streamed call reuses the plain call's cached prefix.
    assert got.keys() == want.keys()
    for index, steps in want.items():
        assert [list(s) for s in got[index]] == [list(s) for s in steps]
        assert [v for s in got[index] for v in s.values()] == pytest.approx(
            [v for s in steps for v in s.values()], abs=1e-5
        )


async def test_http_refuses_what_it_cannot_answer(client: openai.AsyncOpenAI) -> None:
    for bad in ({"top_logprobs": 3}, {"logprobs": True, "top_logprobs": 21}):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="tiny", messages=CHAT, **bad)  # type: ignore[call-overload]
        assert refused.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.completions.create(model="tiny", prompt="x", logprobs=21)
    assert refused.value.param == "logprobs"
