"""The training loop through the real path: runner, pool, sampler, trainer, weight sync."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from parley.arena.training.loop import load_train_config, train


def _self_play(model: Path, out: Path, updates: int, **fields: Any) -> dict[str, Any]:
    """A train config: one policy playing both seats of simple-trade-v0, ``updates`` updates."""
    return {
        "scenario": "negotiation/simple-trade-v0",
        "scenario_kwargs": {"max_turns": 2},
        "model": str(model),
        "policies": ["shared"],
        "agent": {"max_tokens": 6, "system_prompt": True},
        "sampler": {"batch_size": 4, "staleness": 1, "concurrency": 8},
        "pg": {"estimator": "reinforce", "grouping": "role", "lr": 1e-4},
        "stages": [
            {
                "name": "self-play",
                "agents": {"player_0": "policy:shared", "player_1": "policy:shared"},
                "train": ["shared"],
                "max_updates": updates,
            }
        ],
        "out": str(out),
        "progress": False,
        **fields,
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_self_play_simple_trade_logs_per_role_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_train_config(data=_self_play(tiny_model_dir, tmp_path / "run", 3))
    result = train(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 3
    for row in rows:
        assert {"reward/player_0", "reward/player_1", "advantage_abs/player_0"} <= set(row)
        assert row["samples"] > 0
        # The staleness bound (S = 1) per update: the max, and every episode in the histogram.
        assert row["stale_max"] <= 1
        assert sum(row["stale_hist"]) == 4
        assert len(row["stale_hist"]) <= 2
        assert row["dropped_stale"] >= 0
        assert {"ratio_mean", "clip_frac", "optimizer_steps"} <= set(row)
        # The pool's side of the update, for the live dashboard.
        assert row["pool_tokens_per_s"] > 0
        assert row["pool_batch_mean"] >= 1
        assert row["pool_requests"] > 0
    assert [row["version_shared"] for row in rows] == [1, 2, 3]  # one push per update
    # Zero-sum game: the two roles' mean rewards mirror each other (up to invalid-move
    # penalties), which is why each role needs its own baseline.
    assert rows[-1]["update"] == 3
    checkpoint = result.checkpoints["shared"]
    assert (checkpoint / "config.json").exists()
    assert (checkpoint / "tokenizer.json").exists()
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["seeds"]["run"] == 0
    assert "dropped_stale" in summary["stages"][0]


def test_overrides_map_onto_the_dataclasses(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "scenario: collaboration/referential-v0\n"
        "policies: [speaker, listener]\n"
        "stages:\n"
        "  - name: s1\n"
        "    agents: {speaker: scripted, listener: 'policy:listener'}\n"
        "    train: [listener]\n"
    )
    config = load_train_config(
        path, ["pg.lr=3e-3", "sampler.staleness=1", "stages.0.max_updates=7"]
    )
    assert config.pg.lr == pytest.approx(3e-3)
    assert config.sampler.staleness == 1
    assert config.stages[0].max_updates == 7


def test_bad_configs_say_what_is_wrong(tmp_path: Path) -> None:
    from parley.protocols.errors import ConfigError

    base = {
        "scenario": "collaboration/referential-v0",
        "policies": ["listener"],
        "stages": [{"name": "s", "agents": {"listener": "policy:nobody"}, "train": ["listener"]}],
    }
    with pytest.raises(ConfigError, match="unknown policy:nobody"):
        load_train_config(data=base)
    with pytest.raises(ConfigError, match="estimator"):
        load_train_config(data={**base, "stages": []}, overrides=["pg.estimator=ppo"])


def test_the_trainer_scores_at_the_temperature_the_agents_sample_at() -> None:
    """Setting only ``agent.temperature`` left the trainer scoring at 1.0: every importance
    ratio was wrong from the first on-policy minibatch (found by review: at 0.5, ratios
    0.16-10, 44 % clipped). A mismatch is refused; greedy agents are scored at 1."""
    from parley.protocols.errors import ConfigError

    base = {
        "scenario": "collaboration/referential-v0",
        "policies": ["listener"],
        "stages": [{"name": "s", "agents": {"listener": "policy:listener"}, "train": ["listener"]}],
    }
    with pytest.raises(ConfigError, match=r"set pg.temperature to 0.5"):
        load_train_config(data={**base, "agent": {"temperature": 0.5}})
    config = load_train_config(
        data={**base, "agent": {"temperature": 0.5}, "pg": {"temperature": 0.5}}
    )
    assert config.pg.temperature == 0.5
    assert load_train_config(data={**base, "agent": {"temperature": 0}}).pg.temperature == 1.0
    with pytest.raises(ConfigError, match="unknown shaping keys"):
        load_train_config(data={**base, "shaping": {"*": {"alfa": 0.5}}})
    # Replay at S = 0 would replay nothing (no sample older than S is trained on).
    replay = {"replay": 100, "replay_fraction": 0.25}
    with pytest.raises(ConfigError, match="replays nothing"):
        load_train_config(data={**base, "pg": replay})
    load_train_config(data={**base, "pg": {**replay, "replay_max_age": 2}})
    load_train_config(data={**base, "pg": replay, "sampler": {"staleness": 1}})


@pytest.mark.timeout(300)
def test_a_shaped_run_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``shaping:`` reaches the samples as ShapingConfigs (it crashed the first batch with
    "'dict' object has no attribute 'weigh'"; found by review)."""
    shaping = {"*": {"alpha": 0.5}, "player_1": {"alpha": 1.0}}
    sampler = {"batch_size": 2, "staleness": 0, "concurrency": 2}
    data = _self_play(tiny_model_dir, tmp_path / "run", 1, shaping=shaping, sampler=sampler)
    config = load_train_config(data=data)
    train(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 1
    assert rows[0]["samples"] > 0
