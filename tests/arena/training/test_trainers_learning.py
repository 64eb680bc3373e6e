"""A real learning assertion through the real path (runner, pool, sampler, trainer, sync).

Referential game, K = 2 candidates (4 one-word objects, one-letter messages, the listener
answers by name, the speaker sees the target alone), two tiny random models and no warm
start: the listener first learns the scripted speaker's code by RL, then the speaker learns
by RL to talk to that trained listener. The team starts at chance (0.5) and must reach
0.85; every stage learns from the game's reward alone. (``examples/referential.yaml`` is
the K = 4 version of the same recipe.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from parley.arena.training.loop import load_train_config, train


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_team_learns_the_referential_game_by_rl_k2(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_train_config(
        data={
            "scenario": "collaboration/referential-v0",
            "scenario_kwargs": {
                "n_candidates": 2,
                "n_attributes": 1,
                "n_values": 4,
                "vocab_size": 4,
                "message_length": 1,
                "answer": "name",
                "show_others": False,
            },
            "model": str(tiny_model_dir),
            "policies": ["speaker", "listener"],
            "agent": {"max_tokens": 4, "system_prompt": False},
            "sampler": {"batch_size": 64, "staleness": 0, "concurrency": 64},
            "pg": {"estimator": "grpo", "grouping": "role", "lr": 1e-3},
            "threads": 2,
            "progress": False,
            "stages": [
                {
                    "name": "listener",
                    "agents": {"speaker": "scripted", "listener": "policy:listener"},
                    "train": ["listener"],
                    "max_updates": 150,
                    "target": 0.95,
                    "window": 10,
                },
                {
                    "name": "speaker",
                    "agents": {"speaker": "policy:speaker", "listener": "policy:listener"},
                    "train": ["speaker"],
                    "max_updates": 300,
                    "target": 0.95,
                    "window": 10,
                },
            ],
            "out": str(tmp_path / "run"),
        }
    )
    result = train(config)
    listener, speaker = (s["curve"] for s in result.stage_summaries)
    assert np.mean(listener[:3]) < 0.7, f"the team should start near chance (0.5): {listener[:3]}"
    assert np.mean(listener[-10:]) >= 0.85, f"the listener did not learn: {listener[-10:]}"
    assert np.mean(speaker[:3]) < 0.7, f"the speaker should start near chance: {speaker[:3]}"
    assert np.mean(speaker[-10:]) >= 0.85, f"the team did not learn: last {speaker[-10:]}"
