"""Interrupting ``parley run`` and ``parley agent`` with real signals, in real processes
(issue 14): the run's three JSONL files hold the same whole episodes, ``summary.json`` is
written and marked partial, the message says where the files are; a waiting agent leaves
with a message naming the signal and status 128 + N, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

PARLEY = str(Path(sys.executable).with_name("parley"))
EPISODES = 200_000  # far more than the run can play before the signal


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PARLEY_DEBUG"}


def _wait_for_lines(path: Path, deadline_s: float = 60.0) -> None:
    """Until ``path`` holds a few written episodes (the files are block-buffered)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if path.exists() and path.stat().st_size > 64_000:
            return
        time.sleep(0.1)
    pytest.fail(f"{path} did not grow within {deadline_s} s")


def _episodes(path: Path) -> list[str]:
    return [json.loads(line)["episode"] for line in path.read_text().splitlines()]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_keeps_a_consistent_record(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "run"
    cmd = [PARLEY, "run", "negotiation/deal-or-no-deal-v1", "--episodes", str(EPISODES)]
    cmd += ["--out", str(out), "--no-progress", "--concurrency", "8"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )
    try:
        _wait_for_lines(out / "transcripts.jsonl")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    assert f"stopped by {name}" in err
    assert str(out / "summary.json") in err
    transcripts = _episodes(out / "transcripts.jsonl")
    timings = _episodes(out / "timings.jsonl")
    trajectories = _episodes(out / "trajectories.jsonl")
    assert 0 < len(transcripts) < EPISODES
    # The same whole episodes in every file (two trajectories per episode: two seats).
    assert transcripts == timings
    assert sorted(set(trajectories)) == sorted(transcripts)
    assert len(trajectories) == 2 * len(transcripts)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary["episodes_planned"] == EPISODES
    assert summary["episodes"]["total"] == len(transcripts)
    assert f"after {len(transcripts)} of {EPISODES} episodes" in err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_waiting_agent_leaves_cleanly(signum: int) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"  # no arena there: the agent waits
    cmd = [PARLEY, "agent", "--connect", address, "--seat", "player_0", "--wait", "60"]
    cmd += ["--agent", "scripted", "--scenario", "negotiation/deal-or-no-deal-v1"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # "joining ..." once the agent is up and waiting
        assert "joining" in first
        time.sleep(0.5)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    assert f"parley agent: stopped by {name}; left the arena at {address}" in err
    assert "no Hello" not in err  # not reported as a connection timeout
