"""``LLMAgentConfig.fold_to``: over its token budget a chat folds whole old turns in a
block (down to half the budget by default), so its beginning changes only every few turns;
a chat within the budget is sent the same whatever the folding."""

from __future__ import annotations

from itertools import pairwise

import pytest

from parley.agents.llm import LLMAgent, LLMAgentConfig
from parley.arena.inference.backends.tokenizer import HFChatTokenizer
from parley.protocols.messages import Observation
from tests.agents.test_llm_token_ids import SYSTEM, Scripted, prompts, words

pytestmark = pytest.mark.timeout(120)


def test_the_default_folds_in_blocks() -> None:
    from parley.arena.bench.llm_episodes import FOLD_TO

    assert LLMAgentConfig().fold_to == 0.5 == FOLD_TO


@pytest.mark.parametrize("keep_token_ids", [False, True])
async def test_a_chat_within_budget_is_sent_the_same(
    tok: HFChatTokenizer, keep_token_ids: bool
) -> None:
    reply = words(tok, "offer two hats and a book")
    sent = {
        fold_to: await prompts(tok, [reply] * 8, keep_token_ids=keep_token_ids, fold_to=fold_to)
        for fold_to in (1.0, 0.5, 0.25)
    }
    assert sent[1.0] == sent[0.5] == sent[0.25]
    assert max(len(p) for p in sent[1.0]) < LLMAgentConfig().max_prompt_tokens


@pytest.mark.parametrize("keep_token_ids", [False, True])
async def test_folding_changes_the_beginning_rarely(
    tok: HFChatTokenizer, keep_token_ids: bool
) -> None:
    reply = words(tok, "offer two hats and a book")
    budget = 200

    def beginnings(sent: list[list[int]]) -> int:
        """Turns whose prompt does not extend the previous prompt (folds)."""
        return sum(b[: len(a)] != a for a, b in pairwise(sent))

    blocks = await prompts(
        tok, [reply] * 24, keep_token_ids=keep_token_ids, max_prompt_tokens=budget
    )
    every = await prompts(
        tok, [reply] * 24, keep_token_ids=keep_token_ids, max_prompt_tokens=budget, fold_to=1.0
    )
    assert all(len(p) <= budget for p in blocks + every)
    assert all(SYSTEM in tok.decode(p) for p in blocks)  # the system prompt stays
    assert beginnings(every) >= 12  # at its budget, folding just enough folds every turn
    assert 2 <= beginnings(blocks) <= beginnings(every) // 3
    # A fold goes down to half the budget, then the chat grows back turn by turn.
    folds = [b for a, b in pairwise(blocks) if b[: len(a)] != a]
    assert all(len(p) <= budget // 2 for p in folds)


async def test_the_unfolded_chat_is_counted(tok: HFChatTokenizer) -> None:
    reply = words(tok, "offer two hats and a book")
    client = Scripted(tok, [reply] * 12, {})
    agent = LLMAgent(
        client, tok, system_prompt=SYSTEM, config=LLMAgentConfig(max_prompt_tokens=150)
    )
    agent.reset(seed=0)
    assert agent.unfolded_prompt_tokens() == 0
    await agent.act(Observation(agent="player_0", text="offer 0: two hats"))
    assert agent.folded == 0
    assert agent.unfolded_prompt_tokens() == len(client.requests[0].prompt_token_ids)
    for i in range(1, 12):
        await agent.act(Observation(agent="player_0", text=f"offer {i}: two hats"))
    assert agent.folded > 0
    assert (
        agent.unfolded_prompt_tokens()
        > 150
        >= max(len(r.prompt_token_ids) for r in client.requests)
    )
