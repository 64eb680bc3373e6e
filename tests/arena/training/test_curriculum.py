"""The curriculum of parley train (issue 32 s6): the documented raise rule, and the
difficulty rising in a short run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.arena.training.curriculum import Curriculum, CurriculumConfig
from parley.protocols.errors import ConfigError


def _episodes(success: list[float], level: int) -> list[dict[str, float]]:
    return [{"success": s, "difficulty": float(level)} for s in success]


def test_raises_once_a_full_window_at_the_level_reaches_raise_at() -> None:
    curriculum = Curriculum(CurriculumConfig(start=0, step=2, max=3, raise_at=0.8, window=4))
    assert curriculum.scenario_kwargs({"max_turns": 6}) == {"max_turns": 6, "difficulty": 0}
    assert not curriculum.observe(_episodes([1, 1, 1], 0))  # 1.0, but the window is not full
    assert not curriculum.observe(_episodes([0, 1, 1, 1], 0))  # the last 4 never reach 0.8
    assert curriculum.observe(_episodes([1], 0))  # [1, 1, 1, 1]
    assert curriculum.level == 2
    assert curriculum.scenario_kwargs({})["difficulty"] == 2
    # Episodes still running at the old level count for nothing now: no instant raise.
    assert not curriculum.observe(_episodes([1] * 8, 0))
    assert curriculum.level == 2
    assert not curriculum.observe(_episodes([1, 0, 0, 1, 1], 2))  # 0.5, 0.75
    assert not curriculum.observe(_episodes([1], 2))  # [0, 1, 1, 1]: 0.75
    assert curriculum.observe(_episodes([1], 2))  # [1, 1, 1, 1]
    assert curriculum.level == 3  # capped at max, not 4
    assert not curriculum.observe(_episodes([1] * 8, 3))
    assert curriculum.summary() == {
        "option": "difficulty",
        "level": 3,
        "raises": [{"level": 2, "episodes": 8}, {"level": 3, "episodes": 23}],
    }


def test_failed_episodes_and_other_metrics_do_not_count() -> None:
    curriculum = Curriculum(CurriculumConfig(window=2, raise_at=1.0))
    assert not curriculum.observe([{}, {"reward": 1.0}, {"success": 1.0}, {}])
    assert curriculum.observe([{"success": 1.0}])  # scenarios that do not report the level
    assert curriculum.level == 1


@pytest.mark.parametrize(
    "bad",
    [{"step": 0}, {"window": 0}, {"start": 6, "max": 5}, {"raise_at": float("nan")}],
)
def test_bad_rules_are_config_errors(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="curriculum"):
        CurriculumConfig(**bad)  # type: ignore[arg-type]


def test_a_short_run_raises_the_difficulty_and_logs_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """calc-chain with the scripted oracle in the seat (it solves chains of up to 5
    operations in 6 turns): the level climbs 0 -> 5 and stays there (success 0 at 5)."""
    pytest.importorskip("torch")
    from parley.arena.training.loop import load_train_config, train

    out = tmp_path / "run"
    data = {
        "scenario": "tool_use/calc-chain-v1",
        "model": str(tiny_model_dir),
        "sampler": {"batch_size": 4, "concurrency": 4},
        "stages": [
            {"name": "warm", "agents": {"solver": "scripted"}, "train": [], "max_updates": 4},
            # Room to spare: a raise voids the episodes in flight at the old level, how many
            # depends on timing. (A runner that kept making episodes at the level it was
            # built with stayed at 2, with success 1.0, whatever the updates.)
            {"name": "climb", "agents": {"solver": "scripted"}, "train": [], "max_updates": 40},
        ],
        "curriculum": {"start": 0, "max": 6, "window": 4, "raise_at": 0.8},
        "out": str(out),
        "progress": False,
    }
    train(load_train_config(data=data))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    levels = [row["difficulty"] for row in rows]
    assert levels == sorted(levels)  # never lowered
    assert levels[0] <= 1
    assert levels[-1] == 5  # the oracle never passes difficulty 5 in 6 turns
    summary = json.loads((out / "summary.json").read_text())
    first, second = (stage["curriculum"] for stage in summary["stages"])
    assert second["level"] == 5
    assert first["level"] <= second["level"]  # the second stage went on from the first's
    assert [r["level"] for r in second["raises"]] == [1, 2, 3, 4, 5]


def test_a_curriculum_on_ray_is_a_config_error() -> None:
    from parley.arena.training.config import load_train_config

    stage = {"name": "s", "agents": {"solver": "scripted"}, "train": []}
    data = {"scenario": "tool_use/calc-chain-v1", "stages": [stage], "curriculum": {}}
    assert load_train_config(data=data).curriculum == CurriculumConfig()
    with pytest.raises(ConfigError, match="curriculum runs its episodes in this process"):
        load_train_config(data={**data, "ray": "local"})
