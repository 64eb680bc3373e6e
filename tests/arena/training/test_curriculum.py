"""The curriculum of parley train (issue 32 s6): the documented raise rule, and the
difficulty rising in a short run."""

from __future__ import annotations

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
