"""Export of an LLM agent's turns with ``keep_token_ids`` on and off: every exported
decision carries exactly the prompt ids the model was sent, and its chat is the one the
agent sent (system, folding), exact where the template of its text gives those ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.agents.llm import LLMAgent, LLMAgentConfig
from parley.arena.inference.backends.tokenizer import HFChatTokenizer, load_tokenizer
from parley.arena.training.export import decisions
from parley.protocols.messages import Observation, Trajectory, TurnRecord
from tests.agents.test_llm_token_ids import SYSTEM, Scripted, words

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> HFChatTokenizer:
    return load_tokenizer(str(tiny_model_dir))


async def episode(tok: HFChatTokenizer, keep_token_ids: bool) -> tuple[Trajectory, Scripted]:
    """12 turns at a budget that folds, every other reply with a byte token whose text
    (U+FFFD) does not encode back to it."""
    byte = next(i for i in range(len(tok)) if tok.decode([i]) == "\ufffd")
    plain = words(tok, "offer two hats and a book")
    replies = [[byte, *plain] if i % 2 else plain for i in range(12)]
    client = Scripted(tok, replies, {})
    config = LLMAgentConfig(max_prompt_tokens=160, keep_token_ids=keep_token_ids)
    agent = LLMAgent(client, tok, system_prompt=SYSTEM, config=config)
    agent.reset(seed=0)
    turns = []
    for i in range(len(replies)):
        text = f"offer {i}: two hats"
        action = await agent.act(Observation(agent="player_0", text=text))
        turns.append(TurnRecord(turn=i, observation=text, action=action.text, tokens=action.tokens))
    trajectory = Trajectory(episode="e0", scenario="none/none-v0", agent="player_0", turns=turns)
    return trajectory, client


@pytest.mark.parametrize("keep_token_ids", [False, True])
async def test_exported_prompt_ids_are_what_the_model_saw(
    tok: HFChatTokenizer, keep_token_ids: bool
) -> None:
    trajectory, client = await episode(tok, keep_token_ids)
    rows = list(decisions([trajectory], tokenizer=tok, system_prompts={"*": SYSTEM}))
    sent = [list(r.prompt_token_ids) for r in client.requests]
    assert [r["prompt_token_ids"] for r in rows] == sent
    for row, ids in zip(rows, sent, strict=True):
        templated = tok.encode_chat(row["messages"])
        assert row["chat_exact"] is (templated == ids)
        assert tok.decode(templated) == tok.decode(ids)  # the chat the agent sent
        assert row["messages"][0] == {"role": "system", "content": SYSTEM}
    assert any("earlier messages omitted" in r["messages"][1]["content"] for r in rows)
    exact = [r["chat_exact"] for r in rows]
    if keep_token_ids:  # the model saw its byte tokens, which no text gives back
        assert not all(exact)
    else:
        assert all(exact)
