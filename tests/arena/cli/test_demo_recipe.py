"""``make demo`` trains exactly the recipe of ``examples/referential.yaml`` (its own copy,
since ``examples/`` is not installed): the two must not drift apart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from parley.arena.cli.demo_train import demo_config
from parley.arena.training.config import load_train_config

RECIPE = Path(__file__).parents[3] / "examples" / "referential.yaml"


def test_the_demo_trains_the_committed_recipe(tmp_path: Path) -> None:
    demo = demo_config(tmp_path / "demo", k=4)
    recipe = load_train_config(RECIPE, [f"out={tmp_path / 'demo'}", "progress=true"])
    for field in ("scenario", "scenario_kwargs", "model", "policies", "agent", "sampler",
                  "pg", "threads", "stages", "seed", "lora", "precision"):  # fmt: skip
        assert getattr(demo, field) == getattr(recipe, field), field
    # Every field compared above, or one the demo cannot differ in.
    assert dataclasses.replace(demo, out=recipe.out) == recipe
