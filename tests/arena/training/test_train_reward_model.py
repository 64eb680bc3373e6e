"""``parley train`` with a reward model: the ``rm`` component reaches the trained samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parley.protocols.errors import ConfigError


def _config(model: Path, out: Path, **extra: Any) -> dict[str, Any]:
    return {
        "scenario": "negotiation/deal-or-no-deal-v0",
        "scenario_kwargs": {"max_turns": 2},
        "model": str(model),
        "agent": {"max_tokens": 8},
        "sampler": {"batch_size": 4, "concurrency": 4},
        "stages": [
            {
                "name": "rm",
                "agents": {"player_0": "policy:default", "player_1": "scripted"},
                "train": ["default"],
                "max_updates": 1,
            }
        ],
        "out": str(out),
        "progress": False,
        **extra,
    }


@pytest.mark.timeout(300)
def test_the_reward_model_component_is_trained_on(
    tiny_model_dir: Path, tiny_rm_dir: Path, tmp_path: Path
) -> None:
    """With rm_weight 1e6 the learner's rewards are the reward model's scores (deal points
    are at most 10): before, the field did not exist and the rewards were the game's."""
    pytest.importorskip("torch")
    from parley.arena.training.loop import load_train_config, train

    out = tmp_path / "run"
    config = _config(tiny_model_dir, out, reward_model=str(tiny_rm_dir), rm_weight=1e6)
    train(load_train_config(data=config))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert len(rows) == 1
    rewards = [row["reward/player_0"] for row in rows]
    assert all(abs(r) > 100 for r in rewards), rewards


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"reward_model": "/nonexistent/rm"}, "not a directory"),
        ({"rm_scope": "team"}, "rm_scope"),
        ({"rm_weight": float("nan")}, "rm_weight"),
    ],
)
def test_bad_reward_model_options_are_refused(
    extra: dict[str, Any], match: str, tmp_path: Path
) -> None:
    from parley.arena.training.config import load_train_config

    with pytest.raises(ConfigError, match=match):
        load_train_config(data=_config(tmp_path, tmp_path / "out", **extra))
