"""A real learning assertion through the real path (runner, pool, sampler, trainer, sync).

Referential game, K = 2 candidates (4 one-word objects, one-letter messages): the speaker,
a tiny random model, first gets the generic naming warm start (answer the target's name
among distractors; no code, no reward), then learns the code by RL alone against the
scripted listener. It starts at chance (0.5) and must reach 0.85.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from parley.arena.trainers.loop import load_train_config, train

WORDS = ["red", "blue", "green", "yellow"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_speaker_learns_the_code_by_rl_k2(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_train_config(
        data={
            "scenario": "collaboration/referential-v0",
            "scenario_kwargs": {
                "n_candidates": 2,
                "n_attributes": 1,
                "n_values": 4,
                "vocab_size": 4,
                "message_length": 1,
            },
            "model": str(tiny_model_dir),
            "policies": ["speaker"],
            "agent": {"max_tokens": 2, "system_prompt": False},
            "sampler": {"batch_size": 64, "staleness": 0, "concurrency": 64},
            "pg": {"estimator": "grpo", "grouping": "role", "lr": 3e-3},
            "threads": 2,
            "progress": False,
            "stages": [
                {
                    "name": "naming",
                    "kind": "reading",
                    "train": ["speaker"],
                    "max_updates": 100,
                    "target": 0.97,
                    "reading": {
                        "task": "repeat",
                        "question": "Message (1 letters from abcd):",
                        "words": WORDS,
                        "min_items": 2,
                        "max_items": 2,
                        "max_words": 1,
                    },
                },
                {
                    "name": "speaker",
                    "agents": {"speaker": "policy:speaker", "listener": "scripted"},
                    "train": ["speaker"],
                    "max_updates": 600,
                    "target": 0.9,
                    "window": 10,
                },
            ],
            "out": str(tmp_path / "run"),
        }
    )
    result = train(config)
    curve = result.stage_summaries[1]["curve"]
    assert np.mean(curve[:5]) < 0.7, f"the speaker should start near chance (0.5): {curve[:5]}"
    assert np.mean(curve[-10:]) >= 0.85, f"the speaker did not learn: last {curve[-10:]}"
