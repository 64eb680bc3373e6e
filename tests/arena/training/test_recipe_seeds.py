"""Recipes that hold beyond the seed they were tuned on (issue 29 §8): every vote stage of
examples/hidden-profile.yaml starts over from fresh weights when it stalls, every stage of
the recipes has a target (a short run exits 3), and examples/recipe_seeds.py's seed table
marks a seed whose stage stalled, restarted and still ended short of target as failed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml

pytest.importorskip("torch")

from parley.arena.training.config import load_train_config
from tests.arena.training.test_stage_restarts import LISTENER, _config

EXAMPLES = Path(__file__).parents[3] / "examples"


def _recipe_seeds() -> ModuleType:
    spec = importlib.util.spec_from_file_location("recipe_seeds", EXAMPLES / "recipe_seeds.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stage_of_the_recipes_has_a_target_and_every_vote_stage_a_fresh_restart() -> None:
    hidden = load_train_config(EXAMPLES / "hidden-profile.yaml")
    deal = load_train_config(EXAMPLES / "deal-or-no-deal.yaml")
    for stage in [*hidden.stages, *deal.stages]:
        assert stage.target is not None, stage.name  # a run that falls short exits 3
    votes = [stage for stage in hidden.stages if stage.name.startswith("vote_")]
    assert len(votes) == 3
    for stage in votes:
        # A seat stalled at chance (issue 29: one seat voted C in 400/400 episodes) starts
        # over from fresh random weights, early enough to leave room for the new attempt.
        rule = stage.restart
        assert rule is not None, stage.name
        assert rule.reinit == stage.train
        assert rule.back_to is None
        assert rule.max >= 1
        assert rule.after < stage.max_updates
        assert 1 / 3 < rule.below <= stage.target
    team = hidden.stages[-1]
    assert team.restart is not None
    assert team.restart.after < team.max_updates


@pytest.mark.timeout(120)
def test_a_seed_that_restarts_and_still_ends_short_is_a_failed_row(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    seeds = _recipe_seeds()
    # Success is at most 1: the stage stalls at once, starts over from a fresh listener
    # once, then runs to its cap short of its target.
    rule = {"after": 1, "below": 2.0, "max": 1, "reinit": ["listener"]}
    stages = [{"name": "stall", "agents": LISTENER, "train": ["listener"], "max_updates": 2,
               "target": 2.0, "window": 1, "restart": rule}]  # fmt: skip
    small = {"batch_size": 4, "staleness": 0, "concurrency": 4}
    config = _config(
        tmp_path, stages, policies=["listener"], sampler=small, model=str(tiny_model_dir)
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "seeds"

    # pass_at 0: the arena figure alone would pass it; the stage short of target fails it.
    row = seeds.run_seed(path, 5, out, [], episodes=4, pass_at=0.0)

    got = [(s["stage"], s["attempt"], s["stalled"], s["updates"]) for s in row["stages"]]
    assert got == [("stall", 0, True, 1), ("stall", 1, False, 2)]
    assert row["restarts"] == 1
    assert row["short_of_target"] == ["stall"]
    assert row["passed"] is False
    assert 0.0 <= row["arena"] <= 1.0
    assert row["metric"] == "success"
    assert row["load"] is not None  # trained here: the load average as it started and ended
    table = seeds.markdown([row], ["stall"], 0.0)
    line = next(line for line in table.splitlines() if line.startswith("| 5 |"))
    assert "| 1 (stall " in line
    assert "| stall |" in line
    assert line.endswith("| **fail** |")
    assert "0 of 1 seeds pass" in table

    # The run finished in OUT/seed5: asked again, the seed is evaluated, not trained again.
    metrics = out / "seed5" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    again = seeds.run_seed(path, 5, out, [], episodes=4, pass_at=0.0)
    assert metrics.stat().st_mtime_ns == before
    assert again["load"] is None
    assert again["stages"] == row["stages"]
    assert again["arena"] == row["arena"]
    assert json.loads((out / "seed5" / "summary.json").read_text())["short_of_target"] == ["stall"]


@pytest.mark.parametrize("seeds", ["0..9", "5-3", "a", "1,,2"])
def test_a_seed_list_it_cannot_read_is_a_usage_error_naming_it(
    seeds: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _recipe_seeds()
    with pytest.raises(SystemExit) as exit_:
        module.main(
            ["--seeds", seeds, "--out", str(tmp_path)], config=EXAMPLES / "referential.yaml"
        )
    assert exit_.value.code == 2
    assert repr(seeds.split(",")[0] if seeds != "1,,2" else "") in capsys.readouterr().err
    assert not (tmp_path / "seeds.json").exists()  # nothing trained, nothing written


def test_seed_ranges_and_lists_read_as_written() -> None:
    assert _recipe_seeds().seed_list("0-4,7, 9") == [0, 1, 2, 3, 4, 7, 9]
