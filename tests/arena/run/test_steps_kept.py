"""What the runner keeps of each step, and when it may skip work (issue 11 §5).

- A run whose steps nobody reads (no ``out``, no ``keep_records``) builds no transcript, yet
  its summary is the one a run writing every file gets, invalid moves, returns and failures
  included; :meth:`Runner.play` after such a run keeps every step again (the sampler's path).
- The transcript holds the step's own dicts only when they are fresh: parley's
  ``Scenario.step`` builds new ones each step, while a foreign env that hands out the same
  dicts every step (or a Scenario subclass that overrides the ``@final`` step to do so) is
  copied, so each recorded step says what that step said; the observations recorded are
  the ones the seats were shown (taken from the requests, not from the env's last dicts,
  which such an env has changed by then).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.episode import EpisodePlan
from parley.arena.run.runner import Runner, run
from parley.scenarios import register
from parley.scenarios.negotiation.simple_trade_v1 import SimpleNegotiation
from tests.arena.run.test_runner import SCENARIO, CountEnv

HERE = "tests.arena.run.test_steps_kept"
REUSING = "test/count-reusing-dicts-v0"
OVERRIDING = "test/trade-overriding-step-v0"


def _comparable(summary: dict[str, Any]) -> dict[str, Any]:
    summary = dict(summary)
    summary.pop("timing")
    summary["config"] = {k: v for k, v in summary["config"].items() if k != "out"}
    return summary


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("scenario", "agents"),
    [
        ("negotiation/simple-trade-v1", None),
        # v0's trader writes v0's offers: invalid moves in v1 (forfeits).
        ("negotiation/simple-trade-v1", ["scripted", "parley.agents.scripted.negotiation:Trader"]),
        ("negotiation/deal-or-no-deal-v0", None),
        (SCENARIO, ["scripted", "tests.arena.run.test_runner:NoisyAgent"]),
    ],
)
def test_a_run_that_keeps_no_step_reports_the_same_summary(
    tmp_path: Path, scenario: str, agents: list[str] | None
) -> None:
    config = RunConfig(scenario=scenario, agents=agents, episodes=12, trials=2, progress=False)
    light = run(config)
    full = run(config.replace(out=str(tmp_path)), keep_records=True)
    assert _comparable(light.summary) == _comparable(full.summary)
    assert light.summary["agent_steps"] > 0
    # The full run did keep every step, in the records and in the files.
    lines = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    assert [json.loads(line)["steps"] for line in lines] == [
        record.transcript["steps"] for record in full.records
    ]
    assert all(record.transcript["steps"] for record in full.records)
    assert all(t.turns for record in full.records for t in record.trajectories)


@pytest.mark.timeout(30)
def test_play_after_a_run_that_kept_no_step_keeps_every_step() -> None:
    runner = Runner(RunConfig(scenario="negotiation/simple-trade-v1", episodes=2, progress=False))
    asyncio.run(runner.run())

    async def one() -> Any:
        async with runner.open():
            plan = EpisodePlan(
                0, task=0, trial=0, seed=3, agent_seeds={"player_0": 1, "player_1": 2}
            )
            return await runner.play(plan)

    record = asyncio.run(one())
    assert len(record.transcript["steps"]) == 10
    assert all(len(t.turns) == 5 for t in record.trajectories)


class ReusingCountEnv(CountEnv):
    """CountEnv that hands out the same five dicts every step, changed in place."""

    metadata: ClassVar[dict[str, Any]] = {**CountEnv.metadata, "name": REUSING}

    def step(self, actions: dict[str, str]) -> tuple[Any, Any, Any, Any, Any]:
        fresh = super().step(actions)
        if not hasattr(self, "_held"):
            self._held: tuple[dict[str, Any], ...] = tuple({} for _ in fresh)
        for held, new in zip(self._held, fresh, strict=True):
            held.clear()
            held.update(new)
        return self._held


class OverridingTrade(SimpleNegotiation):
    """A Scenario whose subclass overrides the @final step to reuse its infos dict."""

    metadata: ClassVar[dict[str, Any]] = {**SimpleNegotiation.metadata, "name": OVERRIDING}

    def step(self, actions: Any) -> Any:  # the attack
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if not hasattr(self, "_held"):
            self._held: dict[str, Any] = {}
        self._held.clear()
        self._held.update(infos)
        return observations, rewards, terminations, truncations, self._held


register(
    REUSING,
    f"{HERE}:ReusingCountEnv",
    baselines={"*": "tests.arena.run.test_runner:TargetAgent"},
    override=True,
)
register(
    OVERRIDING,
    f"{HERE}:OverridingTrade",
    baselines={"*": "parley.agents.scripted.negotiation:SpiralTrader"},
    override=True,
)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("reusing", "reference"), [(REUSING, SCENARIO), (OVERRIDING, "negotiation/simple-trade-v1")]
)
def test_an_env_that_reuses_its_dicts_is_recorded_step_by_step(
    tmp_path: Path, reusing: str, reference: str
) -> None:
    def transcripts(scenario: str) -> list[dict[str, Any]]:
        out = tmp_path / scenario.replace("/", "_")
        run(RunConfig(scenario=scenario, episodes=3, progress=False, out=str(out)))
        return [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]

    got, expected = transcripts(reusing), transcripts(reference)
    assert [t["steps"] for t in got] == [t["steps"] for t in expected]
    # (and the steps differ from each other: a shared dict would repeat the last one)
    assert len({json.dumps(step["infos"], sort_keys=True) for step in got[0]["steps"]}) > 1
