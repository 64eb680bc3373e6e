"""Privileged oracle data (Scenario.oracle) reaches in-process oracles only, never a remote
agent and never the run's output files (issue 10, section 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run

ROOT = Path(__file__).resolve().parents[3]
RETAIL = "tool_use/retail-desk-v0"
ORACLE = "parley.agents.scripted.tool_use:RetailOracle"


@pytest.mark.timeout(60)
def test_in_process_oracle_gets_the_reference_and_the_files_never_hold_it(
    tmp_path: Path,
) -> None:
    config = RunConfig(scenario=RETAIL, episodes=3, out=str(tmp_path), progress=False)
    result = run(config, keep_records=True)
    assert result.summary["metrics"]["success"]["mean"] == 1.0
    for name in ("transcripts.jsonl", "trajectories.jsonl"):
        text = (tmp_path / name).read_text()
        assert '"oracle"' not in text
    for line in (tmp_path / "transcripts.jsonl").read_text().splitlines():
        for step in json.loads(line)["steps"]:
            assert "task" not in step["infos"]["assistant"]["view"]


@pytest.mark.timeout(90)
def test_a_privileged_class_in_a_remote_seat_gets_no_oracle_data(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(address: str) -> None:
        argv = [sys.executable, "-m", "parley.arena.cli", "agent", "--connect", address,
                "--seat", "assistant", "--agent", ORACLE, "--wait", "30"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE))

    config = RunConfig(
        scenario=RETAIL, agents=["scripted", "remote"], episodes=2, concurrency=1,
        listen=f"ipc://{tmp_path}/arena.sock", out=str(tmp_path), progress=False,
        join_timeout=30.0, max_failed_fraction=1.0,
    )  # fmt: skip
    try:
        result = run(config, on_listen=spawn, keep_records=True)
        procs[0].wait(timeout=20)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    # The oracle refuses to play without the data: every episode fails, naming why.
    assert [bool(r.failed) for r in result.records] == [True, True]
    assert all("oracle" in r.failed for r in result.records), result.records[0].failed
