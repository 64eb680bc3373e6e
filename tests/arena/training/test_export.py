"""Trajectory export: the chat the model saw, per turn and per conversation, in each format.

The formats are checked against what the libraries document: TRL 1.16 (conversational
prompt-completion rows for GRPO/KTO, ``messages`` rows for SFT) and NeMo RL's
``ResponseDataset`` (``nemo_rl/data/datasets/response_datasets/response_dataset.py``: a
``messages`` column is used as is and ``task_name`` is added by the dataset, so a row must
not carry one).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from parley.arena.training.export import (
    CONVERSATION_FORMATS,
    FORMATS,
    conversations,
    decisions,
    export,
    read_trajectories,
)
from parley.protocols.messages import TokenRecord, Trajectory, TurnRecord

SYSTEM = {"*": "You are a trader."}


def _trajectory(failed: str = "") -> Trajectory:
    tokens = TokenRecord(
        policy="p",
        policy_version=3,
        prompt_token_ids=[1, 2],
        token_ids=[5, 6],
        logprobs=[-0.1, -0.2],
    )
    return Trajectory(
        episode="t00001-r00",
        scenario="negotiation/simple-trade-v0",
        agent="player_0",
        seed=7,
        turns=[
            TurnRecord(turn=0, observation="o0", action="a0", reward=0.5, tokens=[tokens]),
            TurnRecord(turn=2, observation="o2", action="a2", reward=1.0, tokens=[tokens]),
            TurnRecord(turn=4, observation="o4", action="scripted", reward=-0.25),
        ],
        reward=1.25,
        components={"task": 1.0, "invalid": 0.25},
        failed=failed,
    )


def test_decisions_carry_the_whole_chat_tokens_and_returns_to_go() -> None:
    rows = list(decisions([_trajectory()], system_prompts=SYSTEM))
    assert [r["turn"] for r in rows] == [0, 2]  # the scripted turn has no tokens
    assert [r["return"] for r in rows] == [1.25, 0.75]
    assert rows[0]["token_ids"] == [5, 6]
    assert rows[0]["policy_version"] == 3
    # Turn 2's prompt: the system prompt and every earlier turn, not the last observation.
    assert rows[1]["messages"] == [
        {"role": "system", "content": "You are a trader."},
        {"role": "user", "content": "o0"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "o2"},
    ]
    assert rows[1]["chat_exact"] is None  # no tokenizer: built, not checked
    assert len(list(decisions([_trajectory()], with_scripted=True))) == 3
    assert list(decisions([_trajectory(failed="timeout")])) == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_writes_one_json_row_per_decision(fmt: str, tmp_path: Path) -> None:
    source = tmp_path / "trajectories.jsonl"
    source.write_bytes(msgspec.json.encode(_trajectory()) + b"\n")
    out = tmp_path / f"{fmt}.jsonl"
    n = export(read_trajectories(source), out, format=fmt, threshold=1.0, system_prompts=SYSTEM)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == len(rows) == 2
    chat = [
        {"role": "system", "content": "You are a trader."},
        {"role": "user", "content": "o0"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "o2"},
    ]
    if fmt == "trl":
        assert set(rows[1]) == {"prompt", "completion", "label", "reward"}
        assert rows[1]["prompt"] == chat
        assert rows[1]["completion"] == [{"role": "assistant", "content": "a2"}]
        assert [r["label"] for r in rows] == [True, False]  # return 1.25 vs 0.75 > 1.0
    elif fmt == "openrlhf":
        assert rows[1] == {
            "input": chat,
            "output": [{"role": "assistant", "content": "a2"}],
            "reward": 0.75,
            "label": False,
        }
    elif fmt == "nemo_rl":
        assert set(rows[1]) == {"messages"}  # no task_name: ResponseDataset adds its own
        assert rows[1]["messages"] == [*chat, {"role": "assistant", "content": "a2"}]
    else:
        assert rows[0]["logprobs"] == [-0.1, -0.2]


@pytest.mark.parametrize("fmt", sorted(CONVERSATION_FORMATS))
def test_the_whole_conversation_form(fmt: str, tmp_path: Path) -> None:
    source = tmp_path / "trajectories.jsonl"
    source.write_bytes(msgspec.json.encode(_trajectory()) + b"\n")
    out = tmp_path / f"{fmt}.jsonl"
    assert export(read_trajectories(source), out, format=fmt, conversation=True) == 1
    row = json.loads(out.read_text())
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system"] + ["user", "assistant"] * 3  # every turn, the scripted one too
    if fmt == "parley":
        assert [t["turn"] for t in row["turns"]] == [0, 2]
        assert row["turns"][1]["token_ids"] == [5, 6]
        assert row["episode_return"] == 1.25
    else:
        assert set(row) == {"messages"}


def test_unknown_formats_are_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="conversation export format 'openrlhf'"):
        export([_trajectory()], tmp_path / "x.jsonl", format="openrlhf", conversation=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("keep_token_ids", ["false", "true"])
def test_exported_chats_are_exactly_what_the_model_saw(
    tiny_model_dir: Path, tmp_path: Path, keep_token_ids: str
) -> None:
    """Real multi-turn episodes by LLM agents with a system prompt, one of them with a
    prompt budget so short that it folds earlier turns and cuts observations: every
    exported chat is the one the agent sent (its text is what the recorded prompt ids
    decode to), and the chat template applied to it gives exactly the recorded prompt ids
    wherever ``chat_exact`` says so: always where the agents re-encode the chat's text
    (``keep_token_ids=false``)."""
    from parley.arena.cli import main
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    keep = f"keep_token_ids={keep_token_ids}"
    short = f"llm:{tiny_model_dir}?max_tokens=6&max_prompt_tokens=260&{keep}"
    roomy = f"llm:{tiny_model_dir}?max_tokens=6&{keep}"
    status = main(
        [
            *("run", "negotiation/simple-trade-v0", "--agents", f"{short},{roomy}"),
            *("--episodes", "2", "--no-progress", "--out", str(tmp_path), "-s", "max_turns=8"),
        ]
    )
    assert status == 0
    tokenizer = load_tokenizer(str(tiny_model_dir))
    trajectories = list(read_trajectories(tmp_path / "trajectories.jsonl"))
    rows = list(decisions(trajectories, tokenizer=tokenizer))
    assert len(rows) >= 8
    for row in rows:
        templated = tokenizer.encode_chat(row["messages"])
        assert row["chat_exact"] is (templated == row["prompt_token_ids"])
        assert tokenizer.decode(templated) == tokenizer.decode(row["prompt_token_ids"])
        assert row["messages"][0]["role"] == "system"
    if keep_token_ids == "false":
        assert all(r["chat_exact"] for r in rows)
    # Both paths were exercised: whole multi-turn chats and folded or cut ones.
    assert any(len(r["messages"]) >= 6 for r in rows)
    assert any("earlier messages omitted" in r["messages"][1]["content"] for r in rows)
    # The conversation form holds every completion, in order, exactly as generated.
    for conversation in conversations(trajectories, tokenizer=tokenizer):
        said = [m["content"] for m in conversation["messages"] if m["role"] == "assistant"]
        generated = [tokenizer.decode(t["token_ids"]) for t in conversation["turns"]]
        assert said == generated
