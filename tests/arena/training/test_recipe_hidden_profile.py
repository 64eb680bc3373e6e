"""examples/hidden-profile.yaml, shortened, through the real path (runner, pool, sampler,
trainer, sync): a tiny random model in seat agent_0, beside two scripted FactTellers that
share their facts and abstain, learns by RL alone to vote the best option from its
notebook. Chance is 1/3; the test asks for >= 0.75 over the last 5 batches. (The whole
recipe, with its team stage, takes minutes: examples/hidden-profile.md.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from parley.arena.training.loop import load_train_config, train

RECIPE = Path(__file__).parents[3] / "examples" / "hidden-profile.yaml"


def test_recipe_config_loads_and_names_its_stages() -> None:
    config = load_train_config(RECIPE)
    assert config.scenario == "collaboration/hidden-profile-v1"
    assert [s.name for s in config.stages] == ["vote_0", "vote_1", "vote_2", "team"]
    assert config.stages[-1].train == ["agent_0", "agent_1", "agent_2"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_voter_learns_to_read_its_notebook_by_rl(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_train_config(RECIPE)
    config = dataclasses.replace(
        config,
        stages=config.stages[:1],  # vote_0: up to 80 updates of 128, stops at 0.85
        model=str(tiny_model_dir),
        out=str(tmp_path / "run"),
        progress=False,
    )
    result = train(config)
    curve = result.stage_summaries[0]["curve"]
    assert np.mean(curve[:3]) < 0.5, f"the team should start near chance (1/3): {curve[:3]}"
    assert np.mean(curve[-5:]) >= 0.75, f"the voter did not learn: last {curve[-5:]}"
