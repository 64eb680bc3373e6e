"""The load suite (``make test-load``): ``parley train`` on a busy machine.

The README's training recipe (``examples/referential.yaml``: the built-in ``tiny`` model,
the in-process pool, the asynchronous sampler, the PG trainer, weight sync), cut to its
first stage and a short budget, is trained twice from the command line: once on a quiet
machine, then with a busy-loop process on every core and the trainer stopped (SIGSTOP)
and resumed (SIGCONT) again and again while it trains. Training is deterministic in what
it samples and scores (the seeds of the run, the model, the episodes and the backend), so
the busy run must make the same updates, on the same episodes, with the same rewards, and
fail or drop none of them: no timeout, staleness rule or wait of the trainer may count the
machine's load or the stops against it.

Nothing here depends on how fast the machine is: only on results and exit statuses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.busy import busy_cores, finish, pausing

pytestmark = [pytest.mark.load, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
UPDATES = 48
PAUSES_S = (3.0, 0.5, 2.0, 1.0)
"""The trainer's pauses, in turn, once its first update is written, 0.5 s of training
between two."""
RUN_TIMEOUT_S = 600.0
"""Only against a hang (a quiet run takes ~10 s here, most of it imports)."""

DETERMINED = (
    "update", "stage", "stage_update", "attempt", "episodes", "samples", "failed",
    "dropped_stale", "stale_hist", "stale_max", "success", "reward_mean", "reward/listener",
    "version_listener", "pool_requests",
)  # fmt: skip
"""The metrics a row's seeds decide (the rest: wall times, rates, float round-off)."""


def _config(out: Path) -> Path:
    """The recipe's listener stage (the scripted speaker), :data:`UPDATES` updates of 16."""
    recipe = yaml.safe_load((ROOT / "examples" / "referential.yaml").read_text())
    stage = {**recipe["stages"][0], "max_updates": UPDATES}
    stage.pop("target", None)  # (every update is made: the same count on both runs)
    config = {
        **{key: recipe[key] for key in ("scenario", "scenario_kwargs", "agent", "pg")},
        "model": "tiny",
        "policies": ["listener"],
        "sampler": {**recipe["sampler"], "batch_size": 16, "concurrency": 16},
        "threads": 1,
        "stages": [stage],
        "progress": False,
    }
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def _train(out: Path, *, busy: bool) -> list[float]:
    """``parley train`` into ``out`` (busy: on busy cores, the trainer paused in turn); the
    pauses made."""
    argv = [sys.executable, "-m", "parley.arena.cli", "train", "--config", str(_config(out)),
            "--out", str(out)]  # fmt: skip
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    if not busy:
        finish(subprocess.Popen(argv, cwd=ROOT, env=ENV, **pipes), "the quiet run", RUN_TIMEOUT_S)
        return []
    with busy_cores():
        proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, **pipes)
        started = (out / "metrics.jsonl").exists
        with pausing(proc.pid, PAUSES_S, running=0.5, start=started) as made:
            finish(proc, "the busy run", RUN_TIMEOUT_S)
    print(f"pauses of the trainer: {made}")  # (pytest -s shows them)
    return made


def _rows(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{key: json.loads(line).get(key) for key in DETERMINED} for line in lines]


def _stage(out: Path) -> dict[str, Any]:
    (stage,) = json.loads((out / "summary.json").read_text())["stages"]
    keys = ("updates", "episodes", "failed_episodes", "dropped_stale", "dropped_groups",
            "curve", "stalled")  # fmt: skip
    return {key: stage[key] for key in keys}


def test_parley_train_on_a_busy_machine(tmp_path: Path) -> None:
    _train(tmp_path / "quiet", busy=False)
    pauses = _train(tmp_path / "busy", busy=True)
    quiet, busy = _rows(tmp_path / "quiet"), _rows(tmp_path / "busy")
    assert len(quiet) == UPDATES
    assert [(r["failed"], r["dropped_stale"]) for r in busy] == [(0, 0)] * UPDATES
    assert busy == quiet  # the same updates, episodes and rewards as on the quiet machine
    assert _stage(tmp_path / "busy") == _stage(tmp_path / "quiet")
    assert len(pauses) >= 3, f"the trainer was paused only {pauses}"
    assert max(pauses) >= 3.0, f"the trainer was paused only {pauses}"
