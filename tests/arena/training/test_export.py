"""Trajectory export: the decision schema and the TRL / OpenRLHF / NeMo RL rows."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from parley.arena.training.export import FORMATS, decisions, export, read_trajectories
from parley.protocols.messages import TokenRecord, Trajectory, TurnRecord


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


def test_decisions_carry_tokens_and_returns_to_go() -> None:
    rows = list(decisions([_trajectory()]))
    assert [r["turn"] for r in rows] == [0, 2]  # the scripted turn has no tokens
    assert [r["return"] for r in rows] == [1.25, 0.75]
    assert rows[0]["token_ids"] == [5, 6]
    assert rows[0]["policy_version"] == 3
    assert len(list(decisions([_trajectory()], with_scripted=True))) == 3
    assert list(decisions([_trajectory(failed="timeout")])) == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_writes_one_json_row_per_decision(fmt: str, tmp_path: Path) -> None:
    source = tmp_path / "trajectories.jsonl"
    source.write_bytes(msgspec.json.encode(_trajectory()) + b"\n")
    out = tmp_path / f"{fmt}.jsonl"
    n = export(read_trajectories(source), out, format=fmt, threshold=1.0)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == len(rows) == 2
    if fmt == "trl":
        assert rows[0]["prompt"] == [{"role": "user", "content": "o0"}]
        assert rows[0]["completion"] == [{"role": "assistant", "content": "a0"}]
        assert [r["label"] for r in rows] == [True, False]  # return 1.25 vs 0.75 > 1.0
    elif fmt == "openrlhf":
        assert rows[1] == {"input": "o2", "output": "a2", "reward": 0.75, "label": False}
    elif fmt == "nemo_rl":
        assert rows[0]["messages"][1] == {"role": "assistant", "content": "a0"}
        assert rows[0]["task_name"] == "negotiation/simple-trade-v0"
    else:
        assert rows[0]["logprobs"] == [-0.1, -0.2]
