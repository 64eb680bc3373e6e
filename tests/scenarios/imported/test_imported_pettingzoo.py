"""PettingZoo classic games as parley scenarios (parley.scenarios.imported.pettingzoo)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

pytest.importorskip("pygame")
pytest.importorskip("rlcard")

from parley.scenarios import make
from parley.scenarios.imported import catalog
from parley.scenarios.imported.checks import quick_check, whole_episodes

ACCEPTED = [e.id for e in catalog(("pettingzoo",)) if e.accepted]


def test_the_classic_games_are_listed_and_hanabi_refused_with_its_reason() -> None:
    assert len(ACCEPTED) >= 8
    assert "pettingzoo:classic/leduc_holdem_v4" in ACCEPTED
    refused = [e for e in catalog(("pettingzoo",)) if not e.accepted]
    assert all(e.reason for e in refused)


# Whole random episodes of these run hundreds of moves (25-40 s for the full suite): a few
# steps in the fast tests, the full suite in the slow ones.
LONG = {"pettingzoo:classic/chess_v6", "pettingzoo:classic/go_v5"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario_id", sorted(LONG))
def test_long_games_hold_the_contract_for_a_few_steps(scenario_id: str) -> None:
    quick_check(scenario_id, steps=8)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "scenario_id",
    [pytest.param(i, marks=pytest.mark.slow) if i in LONG else i for i in ACCEPTED],
)
def test_every_classic_game_passes_the_conformance_suite(scenario_id: str) -> None:
    whole_episodes(scenario_id)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "game", ["connect_four_v3", "leduc_holdem_v4", "rps_v2", "tictactoe_v3", "texas_holdem_v4"]
)
def test_scores_equal_the_librarys_for_the_same_moves(game: str) -> None:
    """Random legal moves as text through parley; the applied ids replayed in the library
    env from the same seed give the same rewards (an illegal id would be penalised there)."""
    for seed in range(3):
        env = make(f"pettingzoo:classic/{game}")
        _, infos = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        while env.agents:
            seat = next(s for s in env.agents if infos[s]["to_act"])
            legal = infos[seat]["view"]["legal"]
            move = legal[int(rng.integers(len(legal)))]
            _, _, _, _, infos = env.step({s: move if s == seat else "" for s in env.agents})
        assert env.invalid_moves() == 0
        lib = importlib.import_module(f"pettingzoo.classic.{game}").env()
        lib.reset(seed=env.library_seed)
        totals = dict.fromkeys(lib.possible_agents, 0.0)
        played = list(env.played)
        while lib.agents:
            seat = lib.agent_selection
            dead = lib.terminations[seat] or lib.truncations[seat]
            lib.step(None if dead else played.pop(0))
            for agent, value in lib.rewards.items():
                totals[agent] += value
        assert not played
        for seat, value in totals.items():
            assert env.totals(seat).get("task", 0.0) == pytest.approx(value)


def test_chess_moves_are_uci_and_a_wrong_one_is_invalid() -> None:
    env = make("pettingzoo:classic/chess_v6")
    observations, infos = env.reset(seed=0)
    assert "e2e4" in infos["player_0"]["view"]["legal"]
    assert "FEN: rnbqkbnr/pppppppp" in observations["player_0"]
    _, _, _, _, infos = env.step({"player_0": "e2e5", "player_1": ""})
    assert "not a legal move" in infos["player_0"]["invalid"]
    _, _, _, _, infos = env.step({"player_0": "E2E4 ", "player_1": ""})
    assert "invalid" not in infos["player_0"]
    assert infos["player_1"]["to_act"]
