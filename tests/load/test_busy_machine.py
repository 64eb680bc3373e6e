"""The load suite (``make test-load``, issue 28): parley on a busy machine.

Each test plays a run twice from the command line, as a user would: once on a quiet
machine, then with a busy-loop process on every core and the arena paused and resumed
(SIGSTOP / SIGCONT, pauses of 0.5 to 7 s) throughout. The busy run must fail no episode and
write the same transcripts as the quiet one. The runs:

* the README's first ``llm:`` command (the tiny model in the arena's process);
* the README's ``--pool`` example: ``parley serve`` (transformers) and ``parley run --pool``;
* a remote agent: ``parley run --listen`` and ``parley agent --connect``.

Nothing here depends on how fast the machine is: only on results and exit statuses.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.busy import busy_cores, finish, pausing, stop

pytestmark = [pytest.mark.load, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PAUSES_S = (7.0, 0.5, 2.0, 1.0)
"""The arena's pauses, in turn, once it plays, with 1 s of play before each (7 s first, so
that even a short run gets it: past the 5 s of silence that used to count as death)."""
RUN_TIMEOUT_S = 600.0
"""Only against a hang: a busy run here took 4.5 min (torch's import and the model's load
with every core busy, and 7 other test runs on the 2 cores)."""


def _parley(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "parley.arena.cli", *argv],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _finish(proc: subprocess.Popen[bytes], what: str, timeout: float = RUN_TIMEOUT_S) -> str:
    """Wait for ``proc``; its stderr. Fails unless it exits 0 within ``timeout``."""
    return finish(proc, what, timeout)[1]


@contextlib.contextmanager
def _pausing(proc: subprocess.Popen[bytes], out: Path) -> Iterator[list[float]]:
    """Pause ``proc`` (SIGSTOP) and resume it (SIGCONT) in turn, from when it starts to play
    (its transcripts file exists) until the block ends; yields the list of pauses made."""
    with pausing(proc.pid, PAUSES_S, start=(out / "transcripts.jsonl").exists) as made:
        yield made


def _transcripts(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda row: row["index"])


def _check(quiet: Path, busy: Path, episodes: int, pauses: list[float]) -> None:
    got, want = _transcripts(busy), _transcripts(quiet)
    failed = [(row["episode"], row["failed"]) for row in got if row["status"] != "ok"]
    assert not failed, failed[:5]
    assert len(got) == episodes
    assert got == want  # the same episodes, move for move, as on the quiet machine
    assert max(pauses, default=0.0) >= 7.0, f"the arena was paused only {pauses}"


def _run_args(scenario: str, agents: str, episodes: int, out: Path, *extra: str) -> list[str]:
    return ["run", scenario, "--agents", agents, "--episodes", str(episodes), "--seed", "3",
            "--concurrency", "4", "--out", str(out), "--no-progress", "--json", *extra]  # fmt: skip


def _played(argv: list[str], out: Path, *, busy: bool) -> list[float]:
    """Play ``parley run ARGV`` into ``out`` (busy: on busy cores, the arena paused in turn);
    the pauses."""
    if not busy:
        _finish(_parley(*argv), "the quiet run")
        return []
    with busy_cores():
        run = _parley(*argv)
        with _pausing(run, out) as pauses:
            _finish(run, "the busy run")
    return pauses


def test_the_readme_llm_command_on_a_busy_machine(tiny_model_dir: Path, tmp_path: Path) -> None:
    episodes = 2
    for name, busy in (("quiet", False), ("busy", True)):
        argv = _run_args("negotiation/deal-or-no-deal-v3", f"llm:{tiny_model_dir},scripted",
                         episodes, tmp_path / name)  # fmt: skip
        pauses = _played(argv, tmp_path / name, busy=busy)
    _check(tmp_path / "quiet", tmp_path / "busy", episodes, pauses)


def test_a_pool_run_on_a_busy_machine(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The README's ``--pool`` example: before, every episode failed at load 30-45 (the
    pool declared dead after 5 s of silence), with "Future exception was never retrieved"
    noise."""
    episodes = 2
    address = f"ipc://{tempfile.mkdtemp(prefix='parley-load-')}/pool.sock"
    log = tmp_path / "serve.log"  # (a file: a pipe nobody reads could fill and block it)
    with log.open("wb") as stderr:
        serve = subprocess.Popen(
            [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(tiny_model_dir),
             "--backend", "transformers", "--listen", address],
            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
    try:
        assert serve.stdout is not None
        first = serve.stdout.readline().decode()  # "pool listening on ADDRESS"
        assert address in first, first
        for name, busy in (("quiet", False), ("busy", True)):
            argv = _run_args("negotiation/simple-trade-v2", f"llm:{tiny_model_dir},scripted",
                             episodes, tmp_path / name, "--pool", address)  # fmt: skip
            pauses = _played(argv, tmp_path / name, busy=busy)
        serve.send_signal(signal.SIGTERM)
        _finish(serve, "parley serve", timeout=60)
        noise = log.read_text(errors="replace")
    finally:
        stop(serve)
    _check(tmp_path / "quiet", tmp_path / "busy", episodes, pauses)
    assert "never retrieved" not in noise, noise[-4000:]


def test_a_remote_agent_run_on_a_busy_machine(tmp_path: Path) -> None:
    """Before: a 7 s pause of the arena made ``parley agent`` leave for good (exit 0) and
    every later episode fail."""
    episodes = 30
    agent_spec = "tests.arena.run.replica_agents:SlowNegotiator"
    pauses: list[float] = []
    for name, busy in (("quiet", False), ("busy", True)):
        address = f"ipc://{tempfile.mkdtemp(prefix='parley-load-')}/arena.sock"
        argv = _run_args("negotiation/deal-or-no-deal-v3", "scripted,remote", episodes,
                         tmp_path / name, "--listen", address)  # fmt: skip
        with busy_cores() if busy else contextlib.nullcontext():
            run = _parley(*argv)
            agent = _parley("agent", "--connect", address, "--seat", "player_1",
                            "--agent", agent_spec, "--wait", "120")  # fmt: skip
            try:
                with _pausing(run, tmp_path / name) if busy else contextlib.nullcontext([]) as made:
                    _finish(run, f"the {name} run")
                    pauses = made
                said = _finish(agent, "parley agent", timeout=60)
            finally:
                stop(run)
                stop(agent)
        assert "the arena said goodbye" in said
    _check(tmp_path / "quiet", tmp_path / "busy", episodes, pauses)
