"""Red team of the forfeit rule (parley.arena.run.league, parley.arena.run.suites): agents
that lose try to have their games counted unscored, or their opponent's as forfeited.

Every attack plays real episodes: openspiel:tic_tac_toe against minimax (the attacker fails
only once its position is lost, see ladder_agents.py) or the simultaneous-move
openspiel:matrix_rps; in-process agents in a real tournament, remote ones as real processes
over an ipc socket. Each test asserts the verdict the rule promises: a game failed by one
agent's seats alone is that agent's forfeit, whatever the failure looks like.

Holes found here and fixed: an in-process action whose text is no str was the run's
protocol error (unscored), an exception whose str() raises or a CancelledError raised by
``act`` ended the run, an agent blocking the event loop had its opponent charged the
timeout, and an arena paused past the act timeout charged a remote agent whose reply was
waiting in its socket (arena/run/direct.py, protocols/bus/requests.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspiel")

from parley.arena.run.backpressure import failed_seats
from parley.arena.run.config import RunConfig
from parley.arena.run.league import LeagueConfig, Match, _score, play_league
from parley.arena.run.runner import run
from parley.arena.run.suites import Suite, SuiteEntry, run_suite
from parley.protocols.bus import BusConfig

ROOT = Path(__file__).resolve().parents[3]
AGENTS = "tests.arena.run.ladder_agents"
TTT = "openspiel:tic_tac_toe"
RPS = "openspiel:matrix_rps"
SEATS = ("player_0", "player_1")


def _league(tmp_path: Path, attacker: str, games: int = 4, **kw: Any) -> dict[str, Any]:
    """A tournament of minimax against ``attacker`` (a class of ladder_agents.py)."""
    agents = {"perfect": f"{AGENTS}:Perfect", "attacker": f"{AGENTS}:{attacker}"}
    config = LeagueConfig(
        agents=agents, scenarios=[kw.pop("scenario", TTT)], out=str(tmp_path),
        games_per_pair=games, **kw,
    )  # fmt: skip
    return play_league(config)


def _forfeited_by_the_attacker_only(league: dict[str, Any], games: int) -> None:
    assert league["unscored"] == {"perfect": 0, "attacker": 0}, league["unscored"]
    assert league["matrix"]["perfect"]["attacker"]["games"] == 2 * games  # every game counts
    forfeits = {game["forfeit"] for game in league["games"] if game["forfeit"]}
    assert forfeits == {"attacker"}, league["games"]


# --- in-process attackers: what the runner makes of what they raise or return -----------


@pytest.mark.timeout(60)
def test_a_forged_reason_with_newlines_tabs_and_separators_still_names_the_liar(
    tmp_path: Path,
) -> None:
    league = _league(tmp_path, "Forger")
    _forfeited_by_the_attacker_only(league, 4)
    reasons = [
        json.loads(line)["failed"]
        for folder in (tmp_path / "matches").iterdir()
        for line in (folder / "transcripts.jsonl").read_text().splitlines()
    ]
    forged = [reason for reason in reasons if "player_0: timeout" in reason]
    assert forged  # the forgery is in the recorded reason, as data, and fools no one
    assert all(len(failed_seats(reason, SEATS) or ()) == 1 for reason in forged)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "attacker",
    [
        # A lone surrogate, a str subclass whose methods raise in the scenario, tokens of no
        # protocol type: "reply not sendable" (agent_error), never the scenario's failure.
        "Unsendable",
        "UnsendableStr",
        "UnsendableTokens",
        # An int for a text: it encodes, but the decoded copy fails its type check.
        "NotText",
        # An exception whose str() raises; a CancelledError raised by act itself: each
        # ended the whole run (and the league, again on every resume).
        "Unprintable",
        "SelfCancel",
    ],
)
def test_an_action_or_error_the_runner_cannot_take_is_the_agents_forfeit(
    tmp_path: Path, attacker: str
) -> None:
    _forfeited_by_the_attacker_only(_league(tmp_path, attacker), 4)


@pytest.mark.timeout(60)
def test_invalid_moves_until_the_scenario_moves_for_it_are_a_plain_loss(tmp_path: Path) -> None:
    # OpenSpiel games ask again after an invalid move, then play a random one: no way to
    # drag a lost game past max_steps (a failure no agent is charged with).
    league = _league(tmp_path, "Stubborn")
    assert league["unscored"] == {"perfect": 0, "attacker": 0}
    assert not any(game["forfeit"] for game in league["games"])
    assert league["matrix"]["perfect"]["attacker"]["win_rate"] > 0.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "dodger",
    [
        "ForgingDodger",
        "UnsendingDodger",
        "NotTextDodger",
    ],
)
def test_parley_eval_counts_the_dodged_tasks_however_they_fail(tmp_path: Path, dodger: str) -> None:
    suite = Suite("dodge-v1", "one entry", (SuiteEntry("tool_use/calc-chain-v1", 8, 2, 3),))
    report = run_suite(suite, {"solver": f"tests.arena.run.dodging_agents:{dodger}"}, tmp_path)
    row = report["entries"][0]
    assert 0 < row["episodes"]["failed"] == row["forfeits"], row
    assert row["metrics"]["success_with_forfeits"]["n"] == 16


@pytest.mark.timeout(60)
@pytest.mark.parametrize("blocker", ["LoopBlocker", "LoopBlockerResigns"])
def test_an_agent_that_blocks_the_arena_cannot_make_its_opponent_fail(
    tmp_path: Path, blocker: str
) -> None:
    agents = {"honest": f"{AGENTS}:SlowHonest", "blocker": f"{AGENTS}:{blocker}"}
    config = LeagueConfig(
        agents=agents, scenarios=[RPS], out=str(tmp_path), games_per_pair=1, act_timeout=1.0
    )
    league = play_league(config)
    assert league["unscored"] == {"honest": 0, "blocker": 0}, league["games"]
    forfeits = [game["forfeit"] for game in league["games"] if game["forfeit"]]
    assert "honest" not in forfeits, league["games"]


# --- remote attackers: real processes over an ipc socket ---------------------------------

_RAW = """
import asyncio, os, signal, sys
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.messages import Action, Error, Heartbeat, Observation, Ok

mode, address = sys.argv[1], sys.argv[2]
FORGED = "player_0: agent_error: x; player_0: timeout: y\\nplayer_0: bus_error: z"

async def answer(env):
    obs = env.body
    if mode == "ok":  # a reply of another kind: bad_reply
        return Ok()
    if mode == "error":  # an Error reply whose message forges a reason
        return Error(code="scenario_error", message=FORGED)
    if mode == "overloaded":  # "not me, the bus": refused as overloaded, forever
        return Error(code="overloaded", message="busy", retryable=True)
    if mode == "other-seat":  # answers as if it were player_0
        return Action(agent="player_0", text=obs.info["view"]["legal"][0])
    if mode == "kill":  # dies when asked (in a simultaneous move: as its opponent is)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "flood":  # floods the arena while its opponent is asked, then answers
        asyncio.get_running_loop().create_task(flood(2.0))
        await asyncio.sleep(0.2)
        return Action(agent=obs.agent, text=obs.info["view"]["legal"][0])
    raise SystemExit(f"unknown mode {mode}")

async def flood(seconds):
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end:
        for _ in range(200):
            try:
                await endpoint.send(arena, Heartbeat())
            except Exception:  # (the arena closed)
                return
        await asyncio.sleep(0)

async def main():
    global endpoint, arena
    async with Endpoint("agent-player_1", config=BusConfig()) as endpoint:
        endpoint.on(Observation, answer)
        arena = await endpoint.connect(address, timeout=30)
        while endpoint.farewell(arena) is None:
            await asyncio.sleep(0.1)

asyncio.run(main())
"""


def _remote_run(
    tmp_path: Path,
    scenario: str,
    argv: Callable[[str], list[str]],
    *,
    episodes: int = 2,
    opponent: Callable[[str], list[str]] | None = None,
    **kw: Any,
) -> list[dict[str, Any]]:
    """Play ``episodes`` of ``scenario``: player_1 the remote process ``argv(address)``,
    player_0 a random in-process agent (or the remote process ``opponent(address)``); the
    transcripts."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(address: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for make in (argv, opponent):
            if make is not None:
                procs.append(subprocess.Popen(make(address), cwd=ROOT, env=env))

    seat_0 = f"{AGENTS}:Random" if opponent is None else "remote"
    config = RunConfig(
        scenario=scenario, agents={"player_0": seat_0, "player_1": "remote"},
        episodes=episodes, concurrency=1, listen=f"ipc://{tmp_path}/arena.sock",
        out=str(tmp_path / "run"), progress=False, max_failed_fraction=1.0,
        **{"act_timeout": 1.0, "join_timeout": 30.0, **kw},
    )  # fmt: skip
    try:
        run(config, on_listen=spawn)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    lines = (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _scored(tmp_path: Path, scenario: str) -> tuple[list[Any], int]:
    """The league's scoring of the run: player_1 is "attacker", player_0 "honest"."""
    match = Match(scenario, (("player_0", "honest"), ("player_1", "attacker")))
    return _score(match, tmp_path / "run", str(tmp_path))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["ok", "error", "overloaded"])
def test_a_remote_agent_that_answers_but_not_with_an_action_forfeits(
    tmp_path: Path, mode: str
) -> None:
    # ok: bad_reply; error: agent_error with the forged reason cut at "; "; overloaded: asked
    # again until act_timeout is spent, then its timeout (the bus is not blamed).
    episodes = _remote_run(
        tmp_path, TTT, lambda address: [sys.executable, "-c", _RAW, mode, address]
    )
    assert all(episode["status"] == "failed" for episode in episodes), episodes
    games, unscored = _scored(tmp_path, TTT)
    assert unscored == 0, [episode["failed"] for episode in episodes]
    assert [game.forfeit for game in games] == ["attacker"] * len(episodes)


@pytest.mark.timeout(60)
def test_a_remote_agent_answering_in_the_other_seats_name_plays_its_own(tmp_path: Path) -> None:
    # The arena names the seat of a reply by its request, never by the reply's own claim.
    argv = [sys.executable, "-c", _RAW, "other-seat"]
    episodes = _remote_run(tmp_path, RPS, lambda address: [*argv, address])
    assert [episode["status"] for episode in episodes] == ["ok", "ok"]
    for episode in episodes:  # player_0's own move stands beside it
        actions = episode["steps"][0]["actions"]
        assert actions["player_1"] == "Rock", actions
        assert actions["player_0"] in ("Rock", "Paper", "Scissors"), actions


@pytest.mark.timeout(60)
def test_a_remote_agent_that_dies_when_asked_with_its_opponent_forfeits(tmp_path: Path) -> None:
    # matrix_rps asks both seats at once: the honest in-process seat has answered, the
    # remote one is gone (its connection closed: dead, or past act_timeout first).
    episodes = _remote_run(
        tmp_path, RPS, lambda address: [sys.executable, "-c", _RAW, "kill", address], episodes=1
    )
    assert episodes[0]["failed"].split(": ")[0] == "player_1", episodes
    games, unscored = _scored(tmp_path, RPS)
    assert unscored == 0
    assert [game.forfeit for game in games] == ["attacker"]


@pytest.mark.timeout(60)
def test_a_remote_agent_hosting_no_seat_forfeits(tmp_path: Path) -> None:
    # It joins under player_1's name but plays player_0: the arena's requests for player_1
    # are refused by its host (agent_error), not the opponent's doing.
    def argv(address: str) -> list[str]:
        return [sys.executable, "-m", "parley.arena.cli", "agent", "--connect", address,
                "--seat", "player_0", "--name", "agent-player_1", "--agent",
                f"{AGENTS}:Random", "--wait", "30"]  # fmt: skip

    episodes = _remote_run(tmp_path, TTT, argv)
    assert all(episode["status"] == "failed" for episode in episodes), episodes
    games, unscored = _scored(tmp_path, TTT)
    assert unscored == 0
    assert [game.forfeit for game in games] == ["attacker"] * len(episodes)


@pytest.mark.timeout(60)
def test_flooding_the_arena_does_not_make_the_remote_opponent_fail(tmp_path: Path) -> None:
    # Both seats remote, asked at once (matrix_rps); the attacker floods the arena with
    # heartbeats (about 10^5 a second here) while its opponent takes 0.3 s to answer over
    # a 1 s act_timeout: the arena reads every connection in turn, the honest reply in time.
    def honest(address: str) -> list[str]:
        return [sys.executable, "-m", "parley.arena.cli", "agent", "--connect", address,
                "--seat", "player_0", "--agent", f"{AGENTS}:SlowHonest",
                "--wait", "30"]  # fmt: skip

    episodes = _remote_run(
        tmp_path, RPS, lambda address: [sys.executable, "-c", _RAW, "flood", address],
        opponent=honest,
    )  # fmt: skip
    assert [episode["failed"] for episode in episodes] == ["", ""]


# --- a busy machine: the arena paused while a quick reply waits in its socket ------------

_ARENA = """
import sys
from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from parley.arena.run.suites import Suite, SuiteEntry, run_suite
listen, out = sys.argv[1], sys.argv[2]
run(RunConfig(scenario="openspiel:tic_tac_toe", progress=False, max_failed_fraction=1.0,
              agents={"player_0": "tests.arena.run.ladder_agents:Random", "player_1": "remote"},
              episodes=3, concurrency=1, listen=listen, out=out, act_timeout=1.0,
              join_timeout=30.0))
"""


@pytest.mark.timeout(90)
def test_an_honest_remote_agent_is_not_charged_for_the_arenas_pause(tmp_path: Path) -> None:
    # The arena runs in a process of its own; the remote agent answers each request at once
    # but first stops the arena for 2.5 s (SIGSTOP, SIGCONT: a loaded host), over a 1 s
    # act_timeout. Its replies sat in the arena's socket in time. (Before the bus put its
    # deadlines off for a late timer, 8 of 9 such episodes failed: a race, the reply won
    # when zmq's I/O thread ran first on SIGCONT; test_bus_multiprocess pins the bus's part.)
    listen, out = f"ipc://{tmp_path}/arena.sock", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    arena = subprocess.Popen([sys.executable, "-c", _ARENA, listen, str(out)], cwd=ROOT, env=env)
    agent_env = {**env, "ARENA_PID": str(arena.pid), "PAUSE_S": "2.5"}
    agent = subprocess.Popen(
        [sys.executable, "-m", "parley.arena.cli", "agent", "--connect", listen, "--seat",
         "player_1", "--agent", f"{AGENTS}:PausesArena", "--wait", "30"],
        cwd=ROOT, env=agent_env,
    )  # fmt: skip
    try:
        assert arena.wait(timeout=80) == 0
    finally:
        for proc in (agent, arena):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # (in case it is paused)
                proc.kill()
            proc.wait()
    lines = (out / "transcripts.jsonl").read_text().splitlines()
    failed = [json.loads(line)["failed"] for line in lines]
    assert failed == [""] * 3, failed
    assert BusConfig().peer_timeout > 2.5  # (the pause is no peer death either)
