"""``parley train``'s exit status: a run whose stages end short of their targets says so in
its last line and summary.json and exits with SHORT_OF_TARGET (it had exited 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from parley.arena.cli import main
from parley.arena.training.loop import SHORT_OF_TARGET
from tests.arena.training.test_stage_restarts import LISTENER, _config


@pytest.mark.timeout(120)
def test_a_stage_short_of_its_target_is_the_last_line_and_a_distinct_status(
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # the log width: table rows stay one line
    stages = [
        # Success is at most 1: this stage runs to its cap, short of its target.
        {"name": "short", "agents": LISTENER, "train": ["listener"], "max_updates": 2,
         "target": 2.0, "window": 1},
        # Success is at least 0: this one reaches its target at its first update.
        {"name": "met", "agents": LISTENER, "train": ["listener"], "max_updates": 2,
         "target": -1.0, "window": 1},
        {"name": "untargeted", "agents": LISTENER, "train": ["listener"], "max_updates": 1},
    ]  # fmt: skip
    small = {"batch_size": 4, "staleness": 0, "concurrency": 4}
    config = _config(
        tmp_path, stages, policies=["listener"], sampler=small, model=str(tiny_model_dir)
    )
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    assert SHORT_OF_TARGET not in (0, 1, 2, 130)  # distinct from success, errors, usage, ^C

    assert main(["train", "--config", str(path)]) == SHORT_OF_TARGET

    captured = capsys.readouterr()
    table = [line for line in captured.out.splitlines() if line.startswith("│ ")]
    assert "2.000 short" in next(line for line in table if line.startswith("│ short "))
    assert "-1.000 reached" in next(line for line in table if line.startswith("│ met "))
    err = captured.err.strip().splitlines()
    assert err[-1].startswith("parley train: short of target: short at ")
    assert "< 2.0 after 2 updates" in err[-1]
    assert "met" not in err[-1]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["short_of_target"] == ["short"]
    stages = {s["stage"]: s for s in summary["stages"]}
    assert [stages[name]["reached"] for name in ("short", "met", "untargeted")] == [
        False,
        True,
        None,
    ]
    assert stages["met"]["updates"] == 1  # it stopped at its target
    assert (tmp_path / "run" / "checkpoints" / "listener").is_dir()  # written all the same
