"""Tournaments (parley.arena.run.league, parley tournament): schedule, paired deals, resume,
ratings of a known ladder."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyspiel")

from parley.arena.cli import main
from parley.arena.run.league import (
    LeagueConfig,
    bradley_terry,
    play_league,
    swiss_pairs,
)

LADDER = {
    "perfect": "tests.arena.run.ladder_agents:Perfect",
    "half": "tests.arena.run.ladder_agents:Half",
    "random": "tests.arena.run.ladder_agents:Random",
}
BASELINES = {
    "rand": "parley.agents.scripted.imported:RandomLegal",
    "first": "parley.agents.scripted.imported:FirstLegal",
}


@pytest.mark.timeout(120)
def test_a_known_ladder_comes_out_in_order_with_separate_intervals(tmp_path: Path) -> None:
    config = LeagueConfig(
        agents=LADDER, scenarios=["openspiel:tic_tac_toe"], out=str(tmp_path), games_per_pair=20
    )
    league = play_league(config)
    ratings = league["ratings"]
    assert [row["agent"] for row in ratings] == ["perfect", "half", "random"]
    for stronger, weaker in itertools.pairwise(ratings):
        assert stronger["ci"][0] > weaker["ci"][1], ratings  # intervals do not overlap
    skill = league["openskill"]  # (openskill's Weng-Lin ratings agree on the order)
    assert [row["agent"] for row in skill] == ["perfect", "half", "random"]
    assert league["matrix"]["perfect"]["random"]["win_rate"] > 0.9
    assert league["matrix"]["perfect"]["random"]["games"] == 40  # 20 a side
    on_disk = json.loads((tmp_path / "league.json").read_text())
    assert on_disk["ratings"] == ratings


@pytest.mark.timeout(120)
def test_an_agent_that_fails_the_games_it_would_lose_forfeits_them(tmp_path: Path) -> None:
    # The sore loser raises once its position is lost, in a message that blames the other
    # seat in the failure reason's own format; counted as before (failures unscored), it
    # lost no game to perfect play and drew as often as the ladder's best.
    agents = {"perfect": LADDER["perfect"], "sore": "tests.arena.run.ladder_agents:SoreLoser"}
    config = LeagueConfig(
        agents=agents, scenarios=["openspiel:tic_tac_toe"], out=str(tmp_path), games_per_pair=20
    )
    league = play_league(config)
    cell = league["matrix"]["perfect"]["sore"]
    assert cell["games"] == 40  # every game counts
    assert cell["win_rate"] > 0.9, cell
    row = league["scenarios"]["openspiel:tic_tac_toe"]["sore"]
    assert row["games"] == 40
    assert row["forfeits"] > 20, row
    assert league["scenarios"]["openspiel:tic_tac_toe"]["perfect"]["forfeits"] == 0
    assert league["unscored"] == {"perfect": 0, "sore": 0}
    forfeited = [g for g in league["games"] if g["forfeit"]]
    assert {g["forfeit"] for g in forfeited} == {"sore"}
    assert all(tuple(g["scores"]) == (0.0, 0.0) for g in forfeited)  # a forfeit is not a score
    ratings = {row["agent"]: row for row in league["ratings"]}
    assert ratings["perfect"]["ci"][0] > ratings["sore"]["ci"][1], ratings


@pytest.mark.timeout(120)
def test_an_agent_that_stalls_the_games_it_would_lose_forfeits_them(tmp_path: Path) -> None:
    agents = {"perfect": LADDER["perfect"], "staller": "tests.arena.run.ladder_agents:Staller"}
    config = LeagueConfig(
        agents=agents,
        scenarios=["openspiel:tic_tac_toe"],
        out=str(tmp_path),
        games_per_pair=3,
        act_timeout=1.0,
    )
    league = play_league(config)
    assert league["matrix"]["perfect"]["staller"]["games"] == 6  # every game counts
    forfeits = [g["forfeit"] for g in league["games"] if g["forfeit"]]
    assert forfeits, league["games"]
    assert set(forfeits) == {"staller"}
    assert league["scenarios"]["openspiel:tic_tac_toe"]["staller"]["forfeits"] == len(forfeits)
    assert league["unscored"] == {"perfect": 0, "staller": 0}


@pytest.mark.timeout(60)
def test_failures_no_single_agent_caused_are_not_scored(tmp_path: Path) -> None:
    config = LeagueConfig(
        agents=BASELINES, scenarios=["openspiel:tic_tac_toe"], out=str(tmp_path), games_per_pair=2
    )
    first = play_league(config)
    folder = next((tmp_path / "matches").iterdir())
    lines = (folder / "transcripts.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines]
    seats = list(episodes[0]["agents"])
    reasons = [
        "scenario_error: step raised ValueError()",  # the scenario's doing
        f"{seats[0]}: agent_error: x; {seats[1]}: timeout: y",  # both agents failed
    ]
    for episode, reason in zip(episodes, reasons, strict=True):
        episode.update(status="failed", failed=reason)
    (folder / "transcripts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    result = json.loads((folder / "result.json").read_text())
    result["scoring"] = 1  # (scored by an older version: scored again from the transcripts)
    (folder / "result.json").write_text(json.dumps(result))
    (tmp_path / "league.json").unlink()
    lines_logged: list[str] = []
    again = play_league(config, log=lines_logged.append)
    assert any(line.startswith("scoring again") for line in lines_logged)
    assert len(again["games"]) == len(first["games"]) - 2
    assert again["unscored"] == {"rand": 2, "first": 2}
    assert not any(g["forfeit"] for g in again["games"])


@pytest.mark.timeout(60)
def test_every_pairing_plays_both_sides_on_the_same_deals(tmp_path: Path) -> None:
    config = LeagueConfig(
        agents=BASELINES, scenarios=["openspiel:kuhn_poker"], out=str(tmp_path), games_per_pair=6
    )
    play_league(config)
    deals = {}
    for folder in sorted((tmp_path / "matches").iterdir()):
        lines = (folder / "transcripts.jsonl").read_text().splitlines()
        episodes = [json.loads(line) for line in lines]
        seats = episodes[0]["agents"]
        deals[tuple(sorted(seats.items()))] = [
            (e["seed"], e["steps"][0]["observations"]) for e in episodes
        ]
    assert set(deals) == {
        (("player_0", BASELINES["rand"]), ("player_1", BASELINES["first"])),
        (("player_0", BASELINES["first"]), ("player_1", BASELINES["rand"])),
    }
    first, second = deals.values()
    # Game g of every match is the same deal: the same seed, player_0 sees the same card.
    assert [seed for seed, _ in first] == [seed for seed, _ in second]
    assert [obs["player_0"].split("\n")[0] for _, obs in first] == [
        obs["player_0"].split("\n")[0] for _, obs in second
    ]


@pytest.mark.timeout(60)
def test_a_league_resumes_where_it_stopped(tmp_path: Path) -> None:
    config = LeagueConfig(
        agents=BASELINES, scenarios=["openspiel:tic_tac_toe"], out=str(tmp_path), games_per_pair=4
    )
    whole = play_league(config)
    matches = sorted((tmp_path / "matches").iterdir())
    # A crash during the second match: its run folder is there, its result.json is not.
    (matches[1] / "result.json").unlink()
    (tmp_path / "league.json").unlink()
    lines: list[str] = []
    again = play_league(config, log=lines.append)
    played = [line.split()[1].rstrip(":") for line in lines if line.startswith("played")]
    assert played == [matches[1].name]
    assert sum(line.startswith("resumed") for line in lines) == 1
    assert again["ratings"] == whole["ratings"]
    assert again["games"] == whole["games"]


def test_swiss_pairs_close_standings_and_avoids_rematches() -> None:
    names = ["a", "b", "c", "d", "e"]
    points = {"a": 3.0, "b": 2.0, "c": 2.0, "d": 1.0, "e": 0.0}
    assert swiss_pairs(names, points, set()) == [("a", "b"), ("c", "d")]
    met = {frozenset(("a", "b")), frozenset(("c", "d"))}
    assert swiss_pairs(names, points, met) == [("a", "c"), ("b", "d")]


def test_bradley_terry_recovers_strengths_and_stays_finite_for_an_unbeaten_agent() -> None:
    rng = np.random.default_rng(0)
    truth = np.array([1.0, 0.0, -1.0])
    pairs = rng.integers(3, size=(3000, 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    p = 1 / (1 + np.exp(truth[pairs[:, 1]] - truth[pairs[:, 0]]))
    outcomes = (rng.random(len(p)) < p).astype(float)
    fitted = bradley_terry(pairs, outcomes, 3)
    assert np.allclose(fitted, truth - truth.mean(), atol=0.15)
    unbeaten = bradley_terry(np.array([[0, 1]] * 10), np.ones(10), 2)
    assert np.all(np.isfinite(unbeaten))
    assert unbeaten[0] > unbeaten[1]


@pytest.mark.timeout(60)
def test_parley_tournament_command_writes_the_league(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "league"
    agents = ",".join(f"{name}={spec}" for name, spec in BASELINES.items())
    args = ["tournament", "--agents", agents, "--scenarios", "openspiel:matrix_pd"]
    status = main([*args, "--games-per-pair", "3", "--out", str(out), "--json"])
    assert status == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["agents"] == ["rand", "first"]
    assert (out / "league.json").exists()
    assert main([*args, "--agents", "a=scripted,a=scripted", "--out", str(out)]) == 2
    # A remote agent could never join a match's private bus: refused at once, not a wait of
    # join_timeout per game.
    remote = ["--agents", "r=remote,first=scripted", "--out", str(tmp_path / "remote")]
    assert main([*args, *remote]) == 2
    assert "tournament hosts its agents in-process" in capsys.readouterr().err
    assert not (tmp_path / "remote" / "matches").exists()


@pytest.mark.timeout(60)
def test_the_viewer_shows_the_league_and_drills_down_to_episodes(tmp_path: Path) -> None:
    from parley.arena.view.server import export_static

    hostile = "<img src=x onerror=alert(1)>"
    league_dir = tmp_path / "league"
    config = LeagueConfig(
        agents={hostile: BASELINES["rand"], "first": BASELINES["first"]},
        scenarios=["openspiel:tic_tac_toe"],
        out=str(league_dir),
        games_per_pair=3,
    )
    play_league(config)
    site = tmp_path / "site"
    export_static([tmp_path], site)
    index = (site / "index.html").read_text()
    assert "league-link" in index
    page_name = next(p.name for p in site.iterdir() if p.name.startswith("league-"))
    page = (site / page_name).read_text()
    assert "<svg id=league-matrix" in page
    assert "id=league-ladder" in page
    assert "openskill mu" in page
    assert hostile not in page  # every name escaped
    episodes = [part.split('"', 1)[0] for part in page.split('class=league-episode href="')[1:]]
    assert len(episodes) == 6  # 3 games x 2 sides, each linked to its episode page
    assert all((site / name).exists() for name in episodes)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_league_on_ray_plays_the_same_games(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    common = {"agents": BASELINES, "scenarios": ["openspiel:tic_tac_toe"], "games_per_pair": 3}
    here = play_league(LeagueConfig(out=str(tmp_path / "here"), **common))
    on_ray = play_league(LeagueConfig(out=str(tmp_path / "ray"), ray="local", **common))
    summaries = list((tmp_path / "ray" / "matches").glob("*/summary.json"))
    assert summaries
    assert all("ray" in json.loads(path.read_text()) for path in summaries)
    strip = [{k: v for k, v in g.items() if k != "run"} for g in here["games"]]
    assert strip == [{k: v for k, v in g.items() if k != "run"} for g in on_ray["games"]]


@pytest.mark.timeout(60)
def test_a_swiss_league_plays_its_rounds_without_rematches(tmp_path: Path) -> None:
    agents = {**LADDER, **BASELINES}  # 5 agents: one sits out each round
    config = LeagueConfig(
        agents=agents,
        scenarios=["openspiel:tic_tac_toe"],
        out=str(tmp_path),
        games_per_pair=2,
        schedule="swiss",
        rounds=2,
    )
    league = play_league(config)
    pairs = {frozenset(game["agents"]) for game in league["games"]}
    assert len(pairs) == 4  # 2 rounds x 2 pairs, no pair twice
    assert len(list((tmp_path / "matches").iterdir())) == 8  # each pair on both sides
    assert len(league["ratings"]) == 5


@pytest.mark.timeout(60)
def test_progress_counts_the_games_of_every_match_played_or_resumed(tmp_path: Path) -> None:
    config = LeagueConfig(
        agents=BASELINES, scenarios=["openspiel:kuhn_poker"], out=str(tmp_path), games_per_pair=3
    )
    calls: list[tuple[int, int]] = []
    play_league(config, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 6), (3, 6), (6, 6)]  # 2 sides x 3 games
    calls.clear()
    play_league(config, progress=lambda done, total: calls.append((done, total)))  # resumed
    assert calls == [(0, 6), (3, 6), (6, 6)]


@pytest.mark.timeout(60)
def test_the_league_page_links_a_bounded_number_of_games_per_match(tmp_path: Path) -> None:
    """The page's work grows with the matches, not the games: each match links its first
    EPISODES_SHOWN games and its run page for the rest (22,400 games had made a 3 MB page)."""
    from parley.arena.view.data import discover
    from parley.arena.view.html import Links
    from parley.arena.view.league import EPISODES_SHOWN, league_page

    config = LeagueConfig(
        agents=BASELINES,
        scenarios=["openspiel:kuhn_poker"],
        out=str(tmp_path / "league"),
        games_per_pair=EPISODES_SHOWN + 2,
    )
    play_league(config)
    sources = discover([tmp_path])
    league = next(s for s in sources.values() if s.kind == "league")
    page = league_page(league, sources, Links())
    assert page.count("class=league-episode") == 2 * EPISODES_SHOWN  # (24 before)
    runs = [s.id for s in sources.values() if s.kind == "run"]
    assert len(runs) == 2
    for rid in runs:
        assert f'<a href="{Links().run(rid)}">2 more</a>' in page
