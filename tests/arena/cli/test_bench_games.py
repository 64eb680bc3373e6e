"""``parley bench games``: imported games beside their libraries, on the same moves."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspiel")
ta = pytest.importorskip("textarena")

from parley.arena.bench import games  # noqa: E402
from parley.scenarios import make  # noqa: E402


@pytest.mark.timeout(120)
def test_bench_games_json_reports_each_games_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    from parley.arena.cli import main

    ids = "openspiel:kuhn_poker,textarena:KuhnPoker-v0,openspiel:goofspiel,pettingzoo:x"
    argv = ["bench", "games", "--json", "--episodes", "3", "--repeats", "1", "--games", ids]
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for slug in ("openspiel_kuhn_poker", "textarena_kuhnpoker_v0"):
        for case in ("parley", "library"):
            assert results[f"{slug}_steps_per_s_{case}"] > 0
        assert results[f"{slug}_ratio_vs_library"] > 0
    assert results["openspiel_kuhn_poker_ratio_vs_library_state"] > 0
    assert "sequential" in results["openspiel_goofspiel_skipped"]  # (simultaneous moves)
    assert "openspiel: and textarena:" in results["pettingzoo_x_skipped"]


@pytest.mark.timeout(60)
def test_the_library_replays_the_recorded_moves_to_parleys_returns() -> None:
    """What the library cases play is the episode parley played: the same deals (chance
    outcomes replayed, TextArena's seed), the same moves, the same returns."""
    from open_spiel.python import rl_environment

    from parley.scenarios.imported.openspiel import load_game

    for episode in games.record("openspiel:kuhn_poker", 6):
        outcomes = iter(episode.chance)
        env = rl_environment.Environment(
            load_game("kuhn_poker"), chance_event_sampler=lambda state, it=outcomes: next(it)
        )
        step = env.reset()
        returns = [0.0, 0.0]
        for action in episode.actions:
            assert action in step.observations["legal_actions"][step.observations["current_player"]]
            step = env.step([action])
            returns = [r + s for r, s in zip(returns, step.rewards, strict=True)]
        assert step.last()
        played = make("openspiel:kuhn_poker")
        played.reset(seed=episode.seed)
        for actions in episode.steps:
            played.step(actions)
        assert returns == [played.totals(s).get("task", 0.0) for s in played.possible_agents]
    for episode in games.record("textarena:KuhnPoker-v0", 4):
        lib = ta.make("KuhnPoker-v0-raw")
        lib.reset(num_players=episode.players, seed=episode.library_seed)
        for text in episode.texts:
            lib.get_observation()
            done, _ = lib.step(action=text)
        assert done
        rewards, _ = lib.close()
        played = make("textarena:KuhnPoker-v0")
        played.reset(seed=episode.seed)
        for actions in episode.steps:
            played.step(actions)
        assert [float(rewards[p]) for p in range(2)] == [
            played.totals(s)["task"] for s in played.possible_agents
        ]
