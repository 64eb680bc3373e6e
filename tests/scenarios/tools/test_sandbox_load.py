"""The sandbox on a busy machine: a run's wall limit counts its own time, not the time it
waited for a CPU, and a parent paused past a run's deadline does not call a run that ended
meanwhile a timeout. Before, 16 busy loops on 2 cores timed out a run of 0.3 s of CPU at a
1 s limit, and a parent SIGSTOPped past the limit reported every run as ``timeout``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from parley.scenarios import make
from parley.scenarios.tools.sandbox import MAX_QUEUE_FACTOR, Sandbox, SandboxLimits
from tests.busy import pausing, spin, stop

pytestmark = pytest.mark.timeout(120)

# About 0.2-0.4 s of CPU on an idle core of this kind.
WORK = "n = 0\nfor i in range(4_000_000):\n    n += i\nprint(n)\n"
SLEEP = "import time\ntime.sleep(99)\n"


@contextlib.contextmanager
def _one_core_shared_with(hogs: int) -> Iterator[None]:
    """This process (and so every sandbox it starts) and ``hogs`` busy loops on core 0 alone:
    a run gets about 1/(hogs + 1) of a core, whatever the rest of the machine does (each
    loop is a session of its own, as other jobs are: with autogroup scheduling, loops in
    one session would share one group's time)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    spinners = [spin() for _ in range(hogs)]
    try:
        time.sleep(1.0)  # the loops are spinning, not starting
        yield
    finally:
        os.sched_setaffinity(0, before)
        for spinner in spinners:
            stop(spinner)


def test_waiting_for_a_cpu_is_not_charged_to_the_run() -> None:
    limit = 1.0
    sandbox = Sandbox(SandboxLimits(wall_seconds=limit, cpu_seconds=10), allow_weak=True)
    with _one_core_shared_with(hogs=8):
        result = sandbox.run(WORK)
        slept = sandbox.run(SLEEP)
    assert result.ok, (result.ended_by, result.duration, result.queued_seconds)
    assert result.stdout.strip() == str(sum(range(4_000_000)))
    # The load really took the run past its limit: only the run-queue wait let it finish.
    assert result.duration > limit, (result.duration, limit)
    assert result.queued_seconds > 0
    assert sandbox.queued_seconds >= result.queued_seconds
    # A program that sleeps still ends at its limit (its wait for a CPU is small).
    assert slept.ended_by == "timeout"
    assert slept.duration < limit * (1 + MAX_QUEUE_FACTOR) + 2.0


_PARENT = """
import json, sys
from parley.scenarios.tools.sandbox import Sandbox, SandboxLimits
sandbox = Sandbox(SandboxLimits(wall_seconds=1.0), allow_weak=True)
print("ready", flush=True)
results = [sandbox.run("print(6 * 7)") for _ in range(3)]
print(json.dumps([[r.ended_by, r.stdout.strip()] for r in results]), flush=True)
"""


def test_a_parent_paused_past_the_deadline_reads_a_finished_run() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        # 1.5 s pauses with 20 ms of running between them: every run's deadline (1 s)
        # passes while the parent is stopped, and the run ends meanwhile.
        with pausing(proc.pid, [1.5], running=0.02) as made:
            out, err = proc.communicate(timeout=90)
    finally:
        stop(proc)
    assert len(made) >= 2, made
    assert proc.returncode == 0, err.decode()[-2000:]
    assert json.loads(out) == [["exit", "42"]] * 3


def test_a_debug_step_budget_is_not_spent_by_load() -> None:
    # Four quick runs fit a 1.2 s budget on any idle machine; sharing a core with 8 busy
    # loops each waits about a second for a CPU, which the budget must not charge.
    env = make("code/debug-v1", task=0, step_budget_s=1.2)
    env.reset(seed=0)
    calls = [{"name": "run_python", "arguments": {"code": f"print({i} * 11)"}} for i in range(4)]
    start = time.monotonic()
    with _one_core_shared_with(hogs=8):
        env.step({"coder": json.dumps({"tool_calls": calls})})
    took = time.monotonic() - start
    results = json.dumps(env.unwrapped.case.last_results["coder"])
    assert "budget" not in results, (took, results)
    for i in range(4):
        assert str(i * 11) in results
