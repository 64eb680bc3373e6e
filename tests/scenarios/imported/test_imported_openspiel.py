"""OpenSpiel games as parley scenarios (parley.scenarios.imported.openspiel)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pyspiel = pytest.importorskip("pyspiel")

from parley.scenarios import make, spec  # noqa: E402
from parley.scenarios.conformance import (  # noqa: E402
    NotApplicable,
    check_noninterference,
)
from parley.scenarios.imported import catalog  # noqa: E402
from parley.scenarios.imported.checks import library_noninterference, quick_check, whole_episodes  # noqa: E402

ACCEPTED = [entry for entry in catalog(("openspiel",)) if entry.accepted]
REFUSED = [entry for entry in catalog(("openspiel",)) if not entry.accepted]

# The full suite on a selection: bargaining, two pokers, a cooperative game, a simultaneous
# one, a board game (the cheap checks below run over every accepted game).
SELECTED = [
    "openspiel:bargaining",
    "openspiel:kuhn_poker",
    "openspiel:leduc_poker",
    "openspiel:hanabi",
    "openspiel:tiny_hanabi",
    "openspiel:goofspiel",
    "openspiel:matrix_pd",
    "openspiel:tic_tac_toe",
]
# Games whose later draws depend on a hidden deal: the plain noninterference check would
# compare past the point where the library itself shows the seat the difference.
DECK_GAMES = {"openspiel:hanabi", "openspiel:blackjack"}


def test_catalog_accepts_the_games_the_issue_names() -> None:
    ids = {entry.id for entry in ACCEPTED}
    assert len(ids) >= 20
    assert {"openspiel:bargaining", "openspiel:kuhn_poker", "openspiel:hanabi"} <= ids
    assert all(entry.seats and entry.description for entry in ACCEPTED)
    assert REFUSED
    assert all(entry.reason for entry in REFUSED)
    assert any("mean_field" in entry.reason for entry in REFUSED)


# Accepted games whose every reset costs a large part of a second (bridge solves each deal
# double-dummy, ~0.6 s of CPU): checked in the slow test only.
COSTLY = {"openspiel:bridge"}


def _failures(check: Callable[[str], object], ids: list[str]) -> list[str]:
    failures = []
    for scenario_id in ids:
        try:
            check(scenario_id)
        except NotApplicable:
            continue
        except AssertionError as exc:
            failures.append(str(exc))
    return failures


@pytest.mark.timeout(90)
def test_every_accepted_game_holds_the_contract_for_a_few_steps() -> None:
    ids = [entry.id for entry in ACCEPTED if entry.id not in COSTLY]
    assert not _failures(lambda i: quick_check(i, steps=6), ids)


@pytest.mark.timeout(90)
def test_no_accepted_game_shows_a_seat_what_the_library_hides_from_it() -> None:
    hidden = [
        entry.id
        for entry in ACCEPTED
        if entry.id not in COSTLY and "imperfect" in entry.description
    ]
    assert not _failures(library_noninterference, hidden)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario_id", sorted(COSTLY))
def test_costly_games_hold_the_contract(scenario_id: str) -> None:
    quick_check(scenario_id, steps=4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario_id", SELECTED)
def test_selected_games_pass_the_conformance_suite(scenario_id: str) -> None:
    whole_episodes(scenario_id)
    if scenario_id in DECK_GAMES:
        assert library_noninterference(scenario_id) > 0
    elif scenario_id in {"openspiel:bargaining", "openspiel:kuhn_poker"}:
        check_noninterference(scenario_id)  # parley's own check, unchanged


@pytest.mark.parametrize("name", ["kuhn_poker", "bargaining", "leduc_poker", "hanabi"])
def test_redrawing_a_deal_finds_another_whenever_one_is_hidden(name: str) -> None:
    """redraw_private redraws what a seat may not know into another deal it cannot tell
    apart: its one pass in a random order often dealt the same cards again, or found no
    card left (kuhn_poker: the other seat's), and said that nothing was hidden, so the
    conformance check of kuhn_poker and bargaining, probing seed 0, checked nothing."""
    for seed in range(10):
        for seat in make(f"openspiel:{name}").possible_agents:
            env = make(f"openspiel:{name}")
            env.reset(seed=seed)
            dealt, seen = list(env.state_.history()), env._observation(env.index[seat])
            assert env.redraw_private(seat, np.random.default_rng(seed)), (name, seed, seat)
            assert list(env.state_.history()) != dealt
            assert env._observation(env.index[seat]) == seen


@pytest.mark.parametrize(
    "scenario_id",
    ["openspiel:kuhn_poker", "openspiel:leduc_poker", "openspiel:goofspiel", "openspiel:hanabi",
     "openspiel:bargaining", "openspiel:2048", "openspiel:blotto"],
)  # fmt: skip
def test_scores_equal_the_librarys_for_the_same_moves(scenario_id: str) -> None:
    """Random legal move sequences, played as text through parley, and the history replayed
    in the library: the same actions and the same returns as each seat's task total."""
    game = pyspiel.load_game(scenario_id.split(":", 1)[1])
    for seed in range(4):
        env = make(scenario_id)
        _, infos = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        played: list[list[str]] = []
        while env.agents:
            actions = {}
            for seat in env.agents:
                legal = infos[seat]["view"]["legal"]
                actions[seat] = legal[int(rng.integers(len(legal)))] if legal else ""
            played.append([actions[s] for s in env.agents if infos[s]["to_act"]])
            _, _, _, _, infos = env.step(actions)
        assert env.invalid_moves() == 0
        state, texts = _replay(game, env.state_.full_history())
        assert state.is_terminal()
        for i, seat in enumerate(env.possible_agents):
            assert env.totals(seat).get("task", 0.0) == pytest.approx(state.returns()[i])
        # The texts played name the actions the library applied, in order.
        assert [t.lower() for step in played for t in step] == [t.lower() for t in texts]


def test_a_seat_is_paid_as_the_librarys_returns_change_every_step() -> None:
    """repeated_leduc_poker declares terminal rewards yet pays each hand as it ends: after
    every step a seat's task total is the library's return so far (not only at the end)."""
    env = make("openspiel:repeated_leduc_poker")
    _, infos = env.reset(seed=0)
    rng = np.random.default_rng(0)
    paid_early = False
    while env.agents:
        seat = next(s for s in env.agents if infos[s]["to_act"])
        legal = infos[seat]["view"]["legal"]
        _, _, _, _, infos = env.step({seat: legal[int(rng.integers(len(legal)))]})
        returns = env.state_.returns()
        for i, name in enumerate(env.possible_agents):
            assert env.totals(name).get("task", 0.0) == pytest.approx(returns[i])
        paid_early = paid_early or (not env.state_.is_terminal() and any(returns))
    assert paid_early  # (the game did pay before its end)


def _replay(game: Any, history: list[Any]) -> tuple[Any, list[str]]:
    """``history`` applied to a fresh state of ``game``; also the text of every player
    action (a simultaneous node's actions are recorded one per player, in player order)."""
    state, texts, at = game.new_initial_state(), [], 0
    while at < len(history):
        if state.is_simultaneous_node():
            joint = [item.action for item in history[at : at + game.num_players()]]
            texts += [state.action_to_string(p, a) for p, a in enumerate(joint)]
            state.apply_actions(joint)
            at += len(joint)
            continue
        item = history[at]
        if item.player >= 0:
            texts.append(state.action_to_string(item.player, item.action))
        state.apply_action(item.action)
        at += 1
    return state, texts


def test_an_illegal_move_is_invalid_then_a_random_legal_move_is_played() -> None:
    env = make("openspiel:tic_tac_toe", invalid_tries=3)
    _observations, infos = env.reset(seed=0)
    assert infos["player_0"]["to_act"]
    assert not infos["player_1"]["to_act"]
    assert infos["player_0"]["constraint"]["type"] == "choice"
    assert len(infos["player_0"]["constraint"]["choices"]) == 9
    for attempt in range(3):
        _, _, _, _, infos = env.step({"player_0": "x(9,9)", "player_1": "x(0,0)"})
        assert "not a legal move" in infos["player_0"]["invalid"]
        assert infos["player_0"]["to_act"] is (attempt < 2)
    assert "played" in infos["player_0"]["invalid"]
    assert infos["player_1"]["to_act"]
    assert len(infos["player_1"]["view"]["legal"]) == 8
    # A legal move in any letter case and spacing is accepted.
    move = infos["player_1"]["view"]["legal"][0]
    _, _, _, _, infos = env.step({"player_0": "", "player_1": f"  {move.upper()}  "})
    assert "invalid" not in infos["player_1"]


def test_the_same_seed_deals_the_same_cards_and_another_seed_differs() -> None:
    deals = set()
    for seed in range(8):
        first, second = make("openspiel:leduc_poker"), make("openspiel:leduc_poker")
        first.reset(seed=seed)
        second.reset(seed=seed)
        assert first.state_.history() == second.state_.history()
        deals.add(tuple(first.state_.history()))
    assert len(deals) > 1


def test_spec_resolves_lazily_with_parameters_and_refuses_with_a_reason() -> None:
    found = spec("openspiel:leduc_poker(players=3)")
    assert found.baseline_for("player_2").endswith(":RandomLegal")
    env = found.make()
    assert env.possible_agents == ["player_0", "player_1", "player_2"]
    assert env.metadata["name"] == "openspiel:leduc_poker(players=3)"
    with pytest.raises(Exception, match="mean_field"):
        spec("openspiel:mfg_garnet")
    with pytest.raises(Exception, match="cannot load"):
        spec("openspiel:no_such_game")


def _fresh(code: str) -> str:
    """What ``code`` prints when run in a fresh interpreter (nothing imported yet), stripped."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True
    )
    return out.stdout.strip()


@pytest.mark.timeout(60)
def test_building_a_builtin_scenario_imports_no_game_library() -> None:
    code = (
        "import sys\n"
        "from parley.scenarios import make, registry\n"
        "make('negotiation/deal-or-no-deal-v3').reset(seed=0); registry()\n"
        "print(sorted(m for m in ('pyspiel', 'textarena', 'openskill') if m in sys.modules))\n"
    )
    assert _fresh(code) == "[]"


def test_parley_list_all_shows_the_games_with_seats_and_the_refused_with_reasons(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from parley.arena.cli import main

    assert main(["list", "--all", "--family", "openspiel"]) == 0
    printed = capsys.readouterr().out
    assert "openspiel:kuhn_poker" in printed
    assert "player_0, player_1" in printed
    assert "mean_field dynamics" in printed
    assert "negotiation/deal-or-no-deal" not in printed  # (--family applies to both tables)


@pytest.mark.timeout(120)
def test_a_constrained_llm_seat_never_plays_an_illegal_move(tiny_model_dir: Any) -> None:
    """A random tiny model in leduc poker and tic-tac-toe: every move it writes is legal (the
    choice constraint), though it knows nothing of either game."""
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run

    for scenario in ("openspiel:leduc_poker", "openspiel:tic_tac_toe"):
        config = RunConfig(
            scenario=scenario,
            agents=[f"llm:{tiny_model_dir}", "scripted"],
            episodes=3,
            progress=False,
        )
        summary = run(config).summary
        assert summary["episodes"]["ok"] == 3
        assert summary["agent_steps"] > 6
        assert summary["invalid_moves"] == 0


@pytest.mark.timeout(60)
def test_games_written_in_python_are_there_whatever_was_imported_first() -> None:
    """OpenSpiel registers its Python games (python_kuhn_poker, ...) when
    ``open_spiel.python.games`` is imported: the catalog had them only where something else
    had imported it (the whole suite did; their numpy returns then failed every reset)."""
    code = (
        "from parley.scenarios.imported import catalog\n"
        "from parley.scenarios import make\n"
        "ids = {e.id for e in catalog(('openspiel',)) if e.accepted}\n"
        "print('openspiel:python_kuhn_poker' in ids, 'openspiel:python_tic_tac_toe' in ids)\n"
        "env = make('openspiel:python_kuhn_poker')\n"
        "obs, infos = env.reset(seed=3)\n"
        "total = {}\n"
        "while env.agents:\n"
        "    acts = {s: infos[s]['constraint']['choices'][-1] for s in env.agents\n"
        "            if infos[s].get('to_act')}\n"
        "    obs, rewards, *_, infos = env.step(acts)\n"
        "    for s, r in rewards.items(): total[s] = total.get(s, 0.0) + r\n"
        "print(sorted(total.items()))\n"
    )
    found, paid = _fresh(code).splitlines()
    assert found == "True True"
    assert paid != "[]"
    import ast

    assert sum(r for _, r in ast.literal_eval(paid)) == 0.0  # zero-sum, paid as floats


@pytest.mark.parametrize("name", ["kuhn_poker", "kuhn_poker(players=3)", "tic_tac_toe"])
def test_games_paid_at_the_end_pay_nothing_before_it_and_say_whose_turn_it_is(name: str) -> None:
    """What the adapter relies on to skip ``returns()`` and ``is_terminal()`` after a move
    that leaves a player to act (:data:`_PAID_AT_END`), on random play-outs."""
    from parley.scenarios.imported.openspiel import _PAID_AT_END, load_game

    game = load_game(name)
    assert game.get_type().short_name in _PAID_AT_END
    rng = np.random.default_rng(0)
    for _ in range(200):
        state = game.new_initial_state()
        while True:
            player = state.current_player()
            assert (player == pyspiel.PlayerId.TERMINAL) == state.is_terminal()
            if state.is_terminal():
                break
            assert all(value == 0.0 for value in state.returns())
            actions = (
                [a for a, _ in state.chance_outcomes()]
                if state.is_chance_node()
                else state.legal_actions()
            )
            state.apply_action(actions[int(rng.integers(len(actions)))])


def _splitmix64(state: int, count: int) -> list[int]:
    """The reference splitmix64 (Vigna's splitmix64.c): ``count`` outputs from ``state``."""
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        out.append(z ^ (z >> 31))
    return out


def test_seed_draws_are_splitmix64_from_the_seeds_first_output() -> None:
    from parley.scenarios.imported.openspiel import SeedDraws

    # (the reference's published outputs from 1234567)
    assert _splitmix64(1234567, 3) == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
    ]
    for seed in (0, 1, 2, 7, 2**63, 2**64 - 1):
        start = _splitmix64(seed, 1)[0]
        expected = [(z >> 11) / 2**53 for z in _splitmix64(start, 5)]
        draws = SeedDraws(seed)
        assert [draws.random() for _ in range(5)] == expected
    with pytest.raises(ValueError):
        SeedDraws(2**64)


def _chi_square(counts: list[int], probabilities: list[float]) -> float:
    total = sum(counts)
    return sum(
        (c - total * p) ** 2 / (total * p) for c, p in zip(counts, probabilities, strict=True)
    )


# chi-square's 0.999 quantiles (df: value): a fixed set of seeds, so the test is not flaky; a
# biased draw (a card 10 % more likely) exceeds them several times over at these counts.
_CHI2_999 = {1: 10.83, 3: 16.27, 5: 20.52, 9: 27.88, 15: 37.70}


def test_seed_draws_are_uniform_and_independent_over_seeds_and_draws() -> None:
    from parley.scenarios.imported.openspiel import SeedDraws

    firsts = [0] * 10
    pairs = [0] * 16
    for seed in range(20_000):
        draws = SeedDraws(seed)
        a, b = draws.random(), draws.random()
        assert 0.0 <= a < 1.0
        assert 0.0 <= b < 1.0
        firsts[int(a * 10)] += 1
        pairs[int(a * 4) * 4 + int(b * 4)] += 1
    assert _chi_square(firsts, [0.1] * 10) < _CHI2_999[9]
    assert _chi_square(pairs, [1 / 16] * 16) < _CHI2_999[15]


def test_seeded_deals_come_as_often_as_their_probabilities() -> None:
    """Over many seeds (a fresh env each, as ``parley run`` plays them), each outcome of a
    chance node comes as often as OpenSpiel's probability of it: kuhn_poker's six deals
    (uniform) and 2048's first tile (a 2 with probability 0.9, on one of 16 cells)."""
    deals: dict[tuple[int, ...], int] = {}
    for seed in range(6_000):
        env = make("openspiel:kuhn_poker")
        env.reset(seed=seed)
        deal = tuple(env.state_.history())
        deals[deal] = deals.get(deal, 0) + 1
    assert len(deals) == 6
    assert _chi_square(list(deals.values()), [1 / 6] * 6) < _CHI2_999[5]
    env = make("openspiel:2048")
    outcomes = env.game.new_initial_state().chance_outcomes()
    values, cells = [0, 0], [0] * 16
    probability = dict(outcomes)
    for seed in range(6_000):
        env.reset(seed=seed)
        first = env.state_.history()[0]
        assert probability[first] > 0
        values[int(probability[first] < 0.05)] += 1  # (a 4: 0.1 / 16)
        cells[first // 2] += 1
    assert _chi_square(values, [0.9, 0.1]) < _CHI2_999[1]
    assert _chi_square(cells, [1 / 16] * 16) < _CHI2_999[15]


def test_a_seed_deals_alike_in_every_env_and_a_reset_without_one_continues_the_generator() -> None:
    """reset(seed=n) deals from n alone (SeedDraws: the episode before and the env's age do
    not matter); reset() deals from the scenario's generator, which continues, so that an
    assigned generator (parley exploit's scripted chance) still decides the deal."""
    from parley.scenarios.imported.openspiel import SeedDraws

    reused = make("openspiel:leduc_poker")
    for seed in (5, 0, 5, 2**64 - 1):
        reused.reset(seed=seed)
        fresh = make("openspiel:leduc_poker")
        fresh.reset(seed=seed)
        assert reused.state_.history() == fresh.state_.history()
    env = make("openspiel:kuhn_poker")
    for seed in range(20):  # (kuhn's first chance node: one of 3 cards, each 1/3)
        env.reset(seed=seed)
        assert int(env.state_.history()[0]) == int(SeedDraws(seed).random() * 3)
    env.reset(seed=3)
    env.reset()  # no seed: the generator of seed 3, made now
    expected = np.random.default_rng(3)
    first = int(expected.random() * 3)
    assert int(env.state_.history()[0]) == first
    assert env._rng is not None
    env.rng = np.random.default_rng(11)
    env.reset()
    assert int(env.state_.history()[0]) == int(np.random.default_rng(11).random() * 3)
    for seed in (np.int64(4), 2**64 + 4):  # (other seeds: numpy's generator of the seed)
        env.reset(seed=seed)
        assert int(env.state_.history()[0]) == int(np.random.default_rng(seed).random() * 3)
