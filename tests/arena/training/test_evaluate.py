"""evaluate_seats: checkpoints and agent specs in one arena run, with the training's prompts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from parley.arena.cli.demo_train import evaluate_team
from parley.arena.training.config import load_train_config
from parley.arena.training.evaluate import evaluate_seats

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "examples" / "referential.yaml"

pytestmark = pytest.mark.timeout(240)


async def test_checkpoint_and_scripted_seats_play_the_configs_scenario(
    tiny_model_dir: Path,
) -> None:
    config = load_train_config(RECIPE)
    seats = {"speaker": "scripted", "listener": str(tiny_model_dir)}
    summary = await evaluate_seats(seats, config, episodes=16)
    assert summary["scenario"] == config.scenario
    assert summary["episodes"] == {"total": 16, "ok": 16, "failed": 0}
    assert 0.0 <= summary["metrics"]["success"]["mean"] <= 1.0
    # The scripted team (no checkpoint: no pool) is the recipe's ceiling.
    scripted = await evaluate_seats({"speaker": "scripted", "listener": "scripted"}, config)
    assert scripted["metrics"]["success"]["mean"] == 1.0
    assert await evaluate_team("scripted", "scripted", config, episodes=8) == 1.0


def test_the_example_script_prints_the_summary(tiny_model_dir: Path) -> None:
    cmd = [sys.executable, str(ROOT / "examples" / "evaluate_seats.py"), str(RECIPE)]
    cmd += ["speaker=scripted", f"listener={tiny_model_dir}", "--episodes", "8"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["episodes"] == {"total": 8, "ok": 8, "failed": 0}
    assert set(out["returns"]) == {"speaker", "listener"}
