"""``LLMAgentConfig.keep_token_ids``: each prompt extends the previous one with the ids the
model generated, so a multi-turn chat is a prefix hit up to its newest observation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path

import pytest

from parley.agents.llm import LLMAgent, LLMAgentConfig
from parley.arena.inference.backends.tokenizer import HFChatTokenizer
from parley.protocols.messages import (
    Completion,
    GenerateRequest,
    GenerateResult,
    Observation,
    SamplingParams,
)

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend
from parley.arena.inference.pool import InferencePool, PoolConfig

pytestmark = pytest.mark.timeout(120)

SYSTEM = "You trade hats."


class Scripted:
    """A pool client answering the k-th request with ``replies[k]`` (token ids, with the
    text they decode to unless ``texts`` gives it); records the requests."""

    def __init__(
        self, tokenizer: HFChatTokenizer, replies: list[list[int]], texts: dict[int, str]
    ) -> None:
        self.tokenizer, self.replies, self.texts = tokenizer, replies, texts
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        k = len(self.requests)
        self.requests.append(request)
        ids = self.replies[k]
        eos = self.tokenizer.eos_token_id
        completion = Completion(
            text=self.texts.get(k, self.tokenizer.decode(ids)),
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            finish_reason="stop" if ids[-1] == eos else "length",
        )
        return GenerateResult(
            policy="default",
            policy_version=0,
            prompt_token_ids=request.prompt_token_ids,
            completions=[completion],
        )


async def prompts(
    tok: HFChatTokenizer,
    replies: list[list[int]],
    *,
    texts: dict[int, str] | None = None,
    **config: object,
) -> list[list[int]]:
    """The prompts an agent sends over ``len(replies)`` turns of a scripted chat."""
    client = Scripted(tok, replies, texts or {})
    cfg = LLMAgentConfig(**config)  # type: ignore[arg-type]
    agent = LLMAgent(client, tok, system_prompt=SYSTEM, config=cfg)
    agent.reset(seed=0)
    for i in range(len(replies)):
        await agent.act(Observation(agent="player_0", text=f"offer {i}: two hats"))
    return [list(r.prompt_token_ids) for r in client.requests]


def words(tok: HFChatTokenizer, text: str, *, eos: bool = True) -> list[int]:
    return tok.encode(text) + ([tok.eos_token_id] if eos and tok.eos_token_id is not None else [])


async def test_replies_that_round_trip_give_the_text_chat(tok: HFChatTokenizer) -> None:
    replies = [words(tok, "offer"), words(tok, "I accept", eos=False), words(tok, "offer 2 hats")]
    kept = await prompts(tok, replies, keep_token_ids=True)
    text = await prompts(tok, replies, keep_token_ids=False)
    assert kept == text


async def test_own_ids_stay_where_the_text_does_not_round_trip(tok: HFChatTokenizer) -> None:
    # A lone byte of a multi-byte character decodes to U+FFFD, which encodes otherwise.
    byte = next(i for i in range(len(tok)) if tok.decode([i]) == "\ufffd")
    reply = [byte, *words(tok, "offer", eos=False)]
    assert tok.encode(tok.decode(reply)) != reply
    kept = await prompts(tok, [reply, reply, reply], keep_token_ids=True)
    text = await prompts(tok, [reply, reply, reply], keep_token_ids=False)
    for before, after in pairwise(kept):
        assert after[: len(before) + len(reply)] == before + reply
    assert text[1][: len(text[0]) + len(reply)] != text[0] + reply  # what it fixes


async def test_the_end_of_sequence_token_is_written_once(tok: HFChatTokenizer) -> None:
    reply = words(tok, "offer")  # ends with eos, the template's own end of turn here
    first, second = await prompts(tok, [reply, reply], keep_token_ids=True)
    assert second[: len(first) + len(reply)] == first + reply
    assert second[len(first) + len(reply)] != tok.eos_token_id


async def test_a_stop_string_cut_from_the_text_falls_back_to_it(tok: HFChatTokenizer) -> None:
    reply = words(tok, "offer 2 hats", eos=False)
    texts = {0: "offer 2"}  # the backend cut " hats" (a stop string) from the text
    kept = await prompts(tok, [reply, reply], texts=texts, keep_token_ids=True)
    text = await prompts(tok, [reply, reply], texts=texts, keep_token_ids=False)
    assert kept == text


async def test_special_tokens_in_a_reply_are_left_out(tok: HFChatTokenizer) -> None:
    special = next(i for i in range(len(tok)) if i != tok.eos_token_id and tok.decode([i]) == "")
    reply = [*words(tok, "offer", eos=False), special, *words(tok, " 2")]
    kept = await prompts(tok, [reply, reply], keep_token_ids=True)
    text = await prompts(tok, [reply, reply], keep_token_ids=False)
    assert kept == text  # as the text drops them
    # ... and the rest of the reply stays as generated where its text would not.
    byte = next(i for i in range(len(tok)) if tok.decode([i]) == "\ufffd")
    reply = [byte, special, *words(tok, "offer", eos=False)]
    first, second = await prompts(tok, [reply, reply], keep_token_ids=True)
    assert second[: len(first) + 2] == [*first, byte, *words(tok, "offer", eos=False)]


async def test_folding_still_fits_the_budget(tok: HFChatTokenizer) -> None:
    byte = next(i for i in range(len(tok)) if tok.decode([i]) == "\ufffd")
    reply = [byte, *words(tok, "offer two hats and a book", eos=False)]
    sent = await prompts(tok, [reply] * 12, keep_token_ids=True, max_prompt_tokens=150)
    assert all(len(p) <= 150 for p in sent)
    assert any("earlier messages omitted" in tok.decode(p) for p in sent)
    assert all(SYSTEM in tok.decode(p) for p in sent)
    # Between folds a prompt extends the previous one with the model's own ids.
    extended = [b[: len(a) + len(reply)] == a + reply for a, b in pairwise(sent)]
    assert extended.count(True) >= len(extended) // 2


@pytest.fixture
async def pool(tiny_model_dir: Path) -> AsyncIterator[InferencePool]:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"default": backend}, PoolConfig(max_wait=0.01)) as p:
        yield p


async def test_later_turns_prefill_only_their_new_tokens(pool: InferencePool) -> None:
    """Through the pool with prefix reuse: after the first turn, a turn prefills only the
    template's tokens of its observation and at most the previous turn's last generated
    token; the last turn equals a full recompute (cache cleared)."""
    backend = pool.backend("default")
    assert isinstance(backend, TransformersBackend)
    tokenizer = pool.tokenizer("default")
    cfg = LLMAgentConfig(max_tokens=12, keep_token_ids=True)
    agent = LLMAgent(pool, tokenizer, system_prompt=SYSTEM, config=cfg)
    agent.reset(seed=3)
    stats = backend.prefix_cache.stats
    records, prefilled = [], []
    for i in range(6):
        before = stats.prefilled_tokens
        action = await agent.act(Observation(agent="player_0", text=f"offer {i}: two hats"))
        records.append(action.tokens[0])
        prefilled.append(stats.prefilled_tokens - before)
    for prev, rec, cost in zip(records, records[1:], prefilled[1:], strict=False):
        kept = len(prev.prompt_token_ids) + len(prev.token_ids)
        assert cost <= len(rec.prompt_token_ids) - kept + 1
    last = records[-1]
    backend.prefix_cache.clear()
    replay = GenerateRequest(
        prompt_token_ids=last.prompt_token_ids,
        params=SamplingParams(max_tokens=12, seed=_seed_of(3, len(records) - 1), logprobs=True),
    )
    (direct,) = await backend.generate([replay])
    assert direct.completions[0].token_ids == last.token_ids
    assert direct.completions[0].logprobs == pytest.approx(last.logprobs, abs=1e-5)


def _seed_of(episode_seed: int, turn: int) -> int:
    """The request seed the agent draws for ``turn`` (it draws one per turn)."""
    import numpy as np

    rng = np.random.default_rng(episode_seed)
    return [int(rng.integers(2**31 - 1)) for _ in range(turn + 1)][-1]
