"""A hostile in-process agent cannot stall or end a run (issue 10 s3): every action it sends
is scored as a move (an invalid move where it is one) and the output files stay valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.agents.scripted.base import ScriptedAgent
from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from parley.protocols.messages import Observation
from parley.scenarios.conformance import HOSTILE_VALUES

HOSTILE = [
    *(f'{{"answer": {value}}}' for value in HOSTILE_VALUES),
    *(
        '{"tool_calls": [{"name": "calculate", "arguments": {"expression": ' + value + "}}]}"
        for value in HOSTILE_VALUES
    ),
]


class Hostile(ScriptedAgent):
    """Plays the next hostile action each turn (episodes end on any parsed answer)."""

    def new_episode(self) -> None:
        self.turn = 0

    def decide(self, observation: Observation) -> str:
        self.turn += 1
        return HOSTILE[(observation.info["agent_seed"] + self.turn) % len(HOSTILE)]


@pytest.mark.timeout(60)
def test_hostile_actions_are_moves_not_failures(tmp_path: Path) -> None:
    config = RunConfig(
        scenario="tool_use/calc-chain-v0", episodes=len(HOSTILE), out=str(tmp_path),
        progress=False, concurrency=4,
    )  # fmt: skip
    result = run(config, agents={"solver": Hostile}, keep_records=True)
    assert [r.failed for r in result.records] == [""] * len(HOSTILE)
    rows = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    assert len(rows) == len(HOSTILE)
    for row in rows:
        for step in row["steps"]:
            for text in step["observations"].values():
                assert all(ch == "\n" or " " <= ch <= "~" for ch in text)
    assert result.summary["invalid_move_rate"] > 0
