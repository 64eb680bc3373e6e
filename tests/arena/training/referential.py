"""The K = 2 referential game the training tests share (4 one-word objects, one-letter
messages, the listener answers by name, the speaker sees the target alone): the small
version of ``examples/referential.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCENARIO = "collaboration/referential-v0"

REFERENTIAL_K2 = {
    "n_candidates": 2,
    "n_attributes": 1,
    "n_values": 4,
    "vocab_size": 4,
    "message_length": 1,
    "answer": "name",
    "show_others": False,
}

REFERENTIAL_K4 = {
    "n_candidates": 4,
    "n_attributes": 1,
    "n_values": 8,
    "vocab_size": 8,
    "message_length": 1,
    "answer": "name",
    "show_others": False,
}
"""Four candidates of eight values: the game of the Ray training tests."""


def two_stage_recipe(model_dir: Path, out: Path) -> dict[str, Any]:
    """The referential recipe (examples/referential.yaml) on :data:`REFERENTIAL_K4`, cut to
    3 + 2 small updates (the listener, then both)."""
    return {
        "scenario": SCENARIO,
        "scenario_kwargs": REFERENTIAL_K4,
        "model": str(model_dir),
        "policies": ["speaker", "listener"],
        "agent": {"temperature": 1.0, "max_tokens": 4, "system_prompt": False},
        "sampler": {"batch_size": 8, "staleness": 1, "concurrency": 8},
        "pg": {"estimator": "grpo", "grouping": "role", "lr": 0.001},
        "threads": 1,
        "stages": [
            {
                "name": "listener",
                "agents": {"speaker": "scripted", "listener": "policy:listener"},
                "train": ["listener"],
                "max_updates": 3,
            },
            {
                "name": "joint",
                "agents": {"speaker": "policy:speaker", "listener": "policy:listener"},
                "train": ["speaker", "listener"],
                "max_updates": 2,
            },
        ],
        "out": str(out),
        "progress": False,
    }
