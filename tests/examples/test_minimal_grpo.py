"""examples/minimal_grpo.py: one GRPO update in one file, through parley's scenario and pool."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).parents[2] / "examples" / "minimal_grpo.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("minimal_grpo", SCRIPT)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def test_the_example_is_one_readable_file_without_the_training_package() -> None:
    text = SCRIPT.read_text()
    assert len(text.splitlines()) <= 300
    imports = [ln for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert not [ln for ln in imports if "parley.arena.training" in ln]
    assert "from parley.scenarios import make" in text


@pytest.mark.timeout(120)
def test_two_updates_change_the_weights_with_a_finite_loss_and_a_log_line_each(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    example = _example()
    args = example.Args(updates=2, seeds=2, group=4, model_dir=str(tiny_model_dir))
    model, history = asyncio.run(example.train(args))
    assert [row["update"] for row in history] == [1, 2]
    assert all(math.isfinite(row["loss"]) and row["episodes"] == 8 for row in history)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("update ")]
    assert len(lines) == 2
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    moved = [
        not torch.equal(a, b) for a, b in zip(before.parameters(), model.parameters(), strict=True)
    ]
    assert any(moved)


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_the_listener_learns_from_reward_alone(tiny_model_dir: Path) -> None:
    example = _example()
    args = example.Args(model_dir=str(tiny_model_dir), target=0.8)
    _, history = asyncio.run(example.train(args))
    recent = [row["success"] for row in history[-5:]]
    assert history[0]["success"] < 0.5  # (chance is 0.25)
    assert sum(recent) / len(recent) >= 0.8, history
