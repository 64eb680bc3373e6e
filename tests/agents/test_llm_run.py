"""``parley run SCENARIO --agents llm:DIR,scripted`` end to end on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parley.arena.cli import main
from parley.scenarios import registry, spec

pytest.importorskip("torch")


def _run(scenario: str, agents: str, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    status = main(
        [
            *("run", scenario, "--agents", agents, "--episodes", "2", "--concurrency", "2"),
            *("--no-progress", "--out", str(out), "--act-timeout", "120", *extra),
        ]
    )
    return status, json.loads((out / "summary.json").read_text())


@pytest.mark.timeout(300)
def test_negotiation_with_an_llm_seat(tiny_model_dir: Path, tmp_path: Path) -> None:
    agents = f"llm:{tiny_model_dir}?max_tokens=8&temperature=0.7,scripted"
    status, summary = _run("negotiation/deal-or-no-deal-v0", agents, tmp_path, "-s", "max_turns=2")
    assert status == 0
    assert summary["episodes"] == {"ok": 2, "failed": 0, "total": 2}
    turns = [
        turn
        for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
        for traj in [json.loads(line)]
        if traj["agent"] == "player_0"
        for turn in traj["turns"]
    ]
    assert turns, "the llm seat acted"
    for turn in turns:
        (record,) = turn["tokens"]
        assert record["policy"] == "default"
        assert len(record["token_ids"]) == len(record["logprobs"]) >= 1
        assert record["prompt_token_ids"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "scenario", sorted(i for i, s in registry().items() if not s.entry_point.startswith("tests."))
)
def test_every_scenario_takes_an_llm_seat(
    scenario: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    seat = next(iter(spec(scenario).baselines))  # the other seats play their baselines
    agents = f"{seat}=llm:{tiny_model_dir}?max_tokens=8"
    _, summary = _run(scenario, agents, tmp_path, "--max-steps", "60")
    # An untrained model may not finish an episode within the step guard, but no episode
    # may fail for any other reason (the agent, the pool, the scenario).
    assert set(summary["failure_kinds"]) <= {"max_steps"}, summary["failures"]
