"""The load suite (``make test-load``): a tournament on a busy machine.

A tournament charges an agent a loss when its seats alone fail a game (a timeout, an error):
on a loaded host that rule must not turn the host's load into losses. The test plays one
league twice from the command line, as a user would (``parley tournament ... --json``): once
on a quiet machine, then with a busy-loop process on every core and the tournament's process
paused and resumed (SIGSTOP / SIGCONT) in turn, each pause longer than ``--act-timeout``, so
that a timeout counted in wall-clock time would charge the agents whose acts were pending.
Neither league may fail or forfeit a game, and the busy one must equal the quiet one: the
same games and outcomes, matrix and ratings, and each match's transcripts move for move.

The league: tic-tac-toe agents of graded strength (tests/arena/run/ladder_agents.py) on
tic-tac-toe and a simultaneous-move game (rock-paper-scissors), one of them ``SlowHonest``
(0.3 s over several awaits per act) so that acts are pending while the process is stopped.
All agents are in-process: ``parley tournament`` has no ``--listen`` for remote agents.

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

from tests.busy import busy_cores, finish, pausing

pytestmark = [pytest.mark.load, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ACT_TIMEOUT_S = 2.0
PAUSES_S = (3.0, 5.0, 4.0)
"""The tournament's pauses, in turn, with 1 s of play before each: every one past the act
timeout (a quiet league here takes ~9 s of play, so the busy one gets several)."""
LADDER = "tests.arena.run.ladder_agents"
AGENTS = {
    "perfect": f"{LADDER}:PerfectAnyGame",
    "half": f"{LADDER}:HalfAnyGame",
    "random": f"{LADDER}:Random",
    "slow": f"{LADDER}:SlowHonest",
}
SCENARIOS = ("openspiel:tic_tac_toe", "openspiel:matrix_rps")
GAMES = len(AGENTS) * (len(AGENTS) - 1) * len(SCENARIOS) * 3
"""Every ordered pair of agents (both seat arrangements) plays each game 3 times."""
RUN_TIMEOUT_S = 300.0
"""Only against a hang: a busy league here takes ~30-60 s."""


def _tournament(out: Path) -> subprocess.Popen[bytes]:
    agents = ",".join(f"{name}={spec}" for name, spec in AGENTS.items())
    argv = ["tournament", "--agents", agents, "--scenarios", ",".join(SCENARIOS),
            "--games-per-pair", "3", "--seed", "5", "--act-timeout", str(ACT_TIMEOUT_S),
            "--out", str(out), "--json"]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "parley.arena.cli", *argv],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _finish(proc: subprocess.Popen[bytes], what: str) -> dict[str, Any]:
    """Wait for ``proc``; the league it printed (``--json``)."""
    league: dict[str, Any] = json.loads(finish(proc, what, RUN_TIMEOUT_S)[0])
    return league


def _played(out: Path, *, busy: bool) -> tuple[dict[str, Any], list[float]]:
    """Play the league into ``out`` (busy: on busy cores, the process paused in turn from
    its first match on); the league and the pauses made."""
    if not busy:
        return _finish(_tournament(out), "the quiet league"), []
    with busy_cores():
        proc = _tournament(out)
        with pausing(proc.pid, PAUSES_S, start=(out / "matches").exists) as made:
            league = _finish(proc, "the busy league")
    return league, made


def _transcripts(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Each match's transcripts by episode index."""
    found = {}
    for path in sorted((out / "matches").glob("*/transcripts.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        found[path.parent.name] = sorted(rows, key=lambda row: row["index"])
    return found


def _same_league(busy: dict[str, Any], quiet: dict[str, Any]) -> None:
    """The deterministic parts of ``league.json`` agree (all but the output folder)."""
    busy, quiet = dict(busy), dict(quiet)
    assert busy.pop("config") | {"out": ""} == quiet.pop("config") | {"out": ""}
    assert busy["games"] == quiet["games"]  # the same games, scores and forfeits
    assert busy["matrix"] == quiet["matrix"]
    assert busy["ratings"] == quiet["ratings"]
    assert busy == quiet  # and the rest (openskill, per-scenario standings, unscored)


def _check(league: dict[str, Any], out: Path, what: str) -> None:
    """Every game of ``league`` (played into ``out``) was played out and scored."""
    assert len(league["games"]) == GAMES, what
    forfeits = [game for game in league["games"] if game["forfeit"]]
    failed = [(match, row["episode"], row["failed"])
              for match, rows in _transcripts(out).items()
              for row in rows if row["status"] != "ok"]  # fmt: skip
    assert not forfeits, f"{what}: {len(forfeits)} of {GAMES} games forfeited: {failed[:3]}"
    assert not failed, f"{what}: {len(failed)} games failed: {failed[:3]}"
    assert set(league["unscored"].values()) == {0}, (what, league["unscored"])


def test_a_tournament_on_a_busy_machine(tmp_path: Path) -> None:
    leagues = {}
    pauses: list[float] = []
    for name in ("quiet", "busy"):
        leagues[name], made = _played(tmp_path / name, busy=name == "busy")
        pauses += made
        _check(leagues[name], tmp_path / name, f"the {name} league")
    print(f"the busy league: pauses of {pauses} s")  # (pytest -s shows them)
    assert len(pauses) >= 2, f"the tournament was paused only {pauses}"
    assert min(pauses) > ACT_TIMEOUT_S
    quiet, busy = leagues["quiet"], leagues["busy"]
    ratings = [row["agent"] for row in quiet["ratings"]]
    assert ratings[0] == "perfect", quiet["ratings"]  # the league tells the agents apart
    _same_league(busy, quiet)
    assert _transcripts(tmp_path / "busy") == _transcripts(tmp_path / "quiet")
