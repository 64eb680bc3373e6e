"""``parley run --ray local`` on a busy machine: load and a stopped driver are no verdict.

The run's liveness rules (the head watch's ``head_lost_after_s`` and ``head_stuck_after_s``,
a lost worker's ``replacement_wait_s``) are set to 1 s here, by a launcher as the dead-head
test in test_ray.py sets its own; then the run is played with a busy-loop process on every
core and its driver stopped (SIGSTOP) for 3-4 s at a time, longer than any of them. It must
end as a quiet run ends: status 0, the same transcripts and trajectories as the local
runner writes (a quiet Ray run writes those: test_ray.py), no worker lost or replaced, no
episode retried, and the head not lost. Nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from tests.busy import busy_cores, finish, pausing

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = "negotiation/deal-or-no-deal-v0"
EPISODES = 1500
"""Several pauses' worth of play on a busy machine (~10 s), still a short test."""
LIMIT_S = 1.0
PAUSES_S = (3.0, 4.0)
"""The driver's pauses, in turn, with 1 s of play before each: each past every limit."""
_SMALL_LIMITS = (
    "-c",
    "from parley.arena.run.ray_runner import RayRunner as R; "
    f"R.head_lost_after_s = R.head_stuck_after_s = R.replacement_wait_s = {LIMIT_S}; "
    "from parley.arena.cli import main; raise SystemExit(main())",
)


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("transcripts.jsonl", "trajectories.jsonl")}


def test_a_stopped_driver_on_a_busy_machine_ends_as_a_quiet_run(tmp_path: Path) -> None:
    config = RunConfig(scenario=SCENARIO, episodes=EPISODES, seed=9, concurrency=2,
                       progress=False, out=str(tmp_path / "local"))  # fmt: skip
    local = run(config)
    out = tmp_path / "ray"
    argv = [sys.executable, *_SMALL_LIMITS, "run", SCENARIO, "--episodes", str(EPISODES),
            "--seed", "9", "--concurrency", "2", "--ray", "local", "--ray-workers", "2",
            "--no-progress", "--out", str(out), "--json"]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    transcripts = out / "transcripts.jsonl"

    def playing() -> bool:
        return transcripts.exists() and transcripts.stat().st_size > 0

    with busy_cores():
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        with pausing(proc.pid, PAUSES_S, start=playing) as pauses:
            stdout, _ = finish(proc, "parley run --ray local", timeout=240)
    assert pauses, "the run ended before its driver was stopped once"
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["episodes"] == local.summary["episodes"]
    assert summary.get("partial") is None
    figures = summary["ray"]
    assert figures["workers_lost"] == []
    assert figures["workers_started"] == figures["workers"] == 2
    assert figures["retried"]["episodes"] == 0
    assert figures["duplicates_dropped"] == 0
    assert _files(out) == _files(tmp_path / "local")
