"""Work the adapters do per step (issue 31 §4: an imported game's step against the library's
own): counted, not timed."""

from __future__ import annotations

import random

import pytest

from parley.scenarios import make
from parley.scenarios.imported.moves import LegalMoves


def test_the_same_legal_moves_are_built_once_and_shared() -> None:
    first = LegalMoves.of(["Pass", "Bet"], [0, 1])
    again = LegalMoves.of(["Pass", "Bet"], [0, 1])
    assert again is first  # (built anew on every step before)
    assert isinstance(first.shown, tuple)  # shared, so it cannot be changed
    assert first.by_text == {"pass": 0, "bet": 1}
    assert first.listed() == "Pass, Bet"
    assert LegalMoves.of(["x", "x"], [3, 4]).shown == ("x #3", "x #4")


@pytest.mark.timeout(60)
def test_a_textarena_episode_never_copies_the_callers_random_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """random.getstate copies 625 words: the adapter used to swap states four times around
    every call into TextArena (two calls a step), then copied the caller's state once per
    episode; now its own generator is seeded per episode, and the caller's generator and
    functions are as they were."""
    pytest.importorskip("textarena")
    env = make("textarena:TicTacToe-v0")
    copies = 0
    real = random.getstate

    def counting() -> object:
        nonlocal copies
        copies += 1
        return real()

    monkeypatch.setattr(random, "getstate", counting)
    functions = {name: getattr(random, name) for name in ("choice", "seed", "shuffle", "random")}
    random.seed(7)
    expected = random.Random(7).random()
    _, infos = env.reset(seed=0)
    steps = 0
    for move in ["[4]", "[0]", "[8]", "[2]", "[6]", "[1]", "[7]", "[3]", "[5]"]:
        if not env.agents:
            break
        seat = next(s for s in env.agents if infos[s]["to_act"])
        _, _, _, _, infos = env.step({seat: move})
        steps += 1
    assert steps >= 5
    assert copies == 0  # (4 per call, 2 calls a step, at first; then 1 an episode)
    assert random.random() == expected  # the caller's stream did not move
    assert {name: getattr(random, name) for name in functions} == functions


def test_the_episode_seed_is_applied_by_the_first_call_into_random() -> None:
    """The generator behind random's functions is seeded by the episode's first call into
    random, not at once: TextArena's own ``random.seed`` in ``reset`` replaces the whole
    state, so the seed before it was wasted work (~3 us an episode); a draw before any seed
    sees the stream of a generator seeded at once, and the caller's stream never moves."""
    pytest.importorskip("textarena")
    from parley.scenarios.imported.textarena import _OwnRandom

    own = _OwnRandom()
    random.seed(3)
    caller = random.Random(3)
    own.start(5)
    with own:
        pass  # (nothing called: the seed is still to be applied)
    with own:
        first = [random.random(), random.randint(0, 9)]
    expected = random.Random(5)
    assert first == [expected.random(), expected.randint(0, 9)]
    own.start(5)
    with own:
        random.seed(7)  # (as TextArena's reset does)
        again = random.random()
    assert again == random.Random(7).random()
    own.start(6)
    with own:
        kept = random.choice  # a stand-in a game keeps and calls later, outside ``with``
    assert kept(range(100)) == random.Random(6).choice(range(100))
    assert random.random() == caller.random()  # the caller's stream did not move


@pytest.mark.timeout(60)
def test_a_textarena_episode_seeds_its_generator_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("textarena")
    seeds = 0
    real = random.Random.seed

    def counting(self: random.Random, *args: object, **kwargs: object) -> None:
        nonlocal seeds
        seeds += 1
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(random.Random, "seed", counting)
    env = make("textarena:TicTacToe-v0")
    env.reset(seed=0)
    assert seeds == 1  # (2 before: random.Random(0) when the env was made, ~4.4 us)
    seeds = 0
    env.reset(seed=1)
    assert seeds == 1  # TextArena's own, in reset (2 before: the adapter's first)


def test_a_generator_never_started_draws_the_stream_of_seed_0() -> None:
    """_OwnRandom is made unseeded (seed 0 pending): before any :meth:`start`, whatever
    comes first (a draw, gauss, getstate) sees random.Random(0)'s stream."""
    pytest.importorskip("textarena")
    from parley.scenarios.imported.textarena import _OwnRandom

    for first in ("random", "gauss", "getstate"):
        own, expected = _OwnRandom(), random.Random(0)
        with own:
            got = getattr(random, first)()
            assert got == getattr(expected, first)()
            assert random.random() == expected.random()


@pytest.mark.timeout(120)
def test_the_seeded_floor_of_bench_games_seeds_as_the_adapters_do() -> None:
    """``library_seeded`` charges the library's loop with parley's seeding: its TextArena
    seed is the one the adapter drew for the recorded episode, and both games report it."""
    pytest.importorskip("pyspiel")
    pytest.importorskip("textarena")
    from parley.arena.bench import games
    from parley.scenarios.imported.textarena import library_seed_of

    for episode in games.record("textarena:KuhnPoker-v0", 3):
        assert library_seed_of(episode.seed) == episode.library_seed
    ids = ["openspiel:kuhn_poker", "textarena:KuhnPoker-v0"]
    results = games.measure(ids, 3, 1, step=lambda line: None)
    for slug in ("openspiel_kuhn_poker", "textarena_kuhnpoker_v0"):
        assert results[f"{slug}_steps_per_s_library_seeded"] > 0
        assert results[f"{slug}_seeded_vs_library"] > 0
        assert results[f"{slug}_hooks_vs_library"] > 0


@pytest.mark.timeout(120)
def test_the_hooks_case_of_bench_games_plays_parleys_episodes() -> None:
    """``hooks`` times the scenario's hooks without ``env.step``'s machinery: on the recorded
    moves it reaches the same end with the same scores as ``env.step`` did."""
    pytest.importorskip("pyspiel")
    pytest.importorskip("textarena")
    from parley.arena.bench import games

    for game_id in ("openspiel:kuhn_poker", "openspiel:tic_tac_toe", "textarena:KuhnPoker-v0"):
        stepped, hooked = make(game_id), make(game_id)
        for episode in games.record(game_id, 8):
            stepped.reset(seed=episode.seed)
            for actions in episode.steps:
                stepped.step(actions)
            games.play_hooks(hooked, episode)
            assert not stepped.agents, game_id
            assert not hooked.acting(), game_id  # (the episode is over there too)
            for seat in stepped.possible_agents:
                task = stepped.totals(seat).get("task")
                assert hooked.totals(seat).get("task") == task, (game_id, episode.seed)


@pytest.mark.timeout(120)
def test_games_named_by_action_name_their_moves_as_the_state_does() -> None:
    """The games whose moves are named once per (player, legal actions), not at every step:
    on random play (hands of leduc_poker with 3 players too) every seat's legal moves are what
    the state names now."""
    pytest.importorskip("pyspiel")
    from parley.scenarios.imported import openspiel

    ids = [f"openspiel:{name}" for name in sorted(openspiel._NAMES_BY_ACTION)]
    for scenario_id in [*ids, "openspiel:leduc_poker(players=3)"]:
        env = make(scenario_id)
        assert env._named is not None, scenario_id
        rng = random.Random(0)
        for seed in range(30):
            _, infos = env.reset(seed=seed)
            while env.agents:
                state = env.state_
                for seat, moves in env._moves.items():
                    player = env.index[seat]
                    actions = state.legal_actions(player)
                    names = [state.action_to_string(player, a) for a in actions]
                    assert moves.shown == LegalMoves.of(names, actions).shown, scenario_id
                acts = {s: rng.choice(infos[s]["view"]["legal"]) for s in env.acting()}
                _, _, _, _, infos = env.step(acts)
    assert make("openspiel:chess")._named is None  # (its names depend on the position)


def test_a_seeded_openspiel_episode_of_legal_moves_makes_no_numpy_generator() -> None:
    """Seeding numpy's generator (~6.5 us) was 40 % of a kuhn_poker reset, paid by every
    episode of ``parley run`` (a fresh env each): a seeded episode's chance draws come from
    SeedDraws; the generator is made only for what else draws (an invalid move's pick)."""
    pytest.importorskip("pyspiel")
    for game_id in ("openspiel:kuhn_poker", "openspiel:leduc_poker", "openspiel:liars_dice"):
        for seed in range(5):
            env = make(game_id)
            _, infos = env.reset(seed=seed)
            while env.agents:
                seat = next(s for s in env.agents if infos[s]["to_act"])
                _, _, _, _, infos = env.step({seat: infos[seat]["view"]["legal"][-1]})
            assert env._rng is None, (game_id, seed)
    env = make("openspiel:kuhn_poker", invalid_tries=1)
    _, infos = env.reset(seed=0)
    seat = next(s for s in env.agents if infos[s]["to_act"])
    env.step({seat: "no such move"})  # (played for it: a legal move drawn from env.rng)
    assert env._rng is not None


@pytest.mark.timeout(60)
def test_a_seeded_textarena_episode_makes_no_numpy_generator() -> None:
    """Seeding numpy's generator (~8 us) to draw the library seed was as much as the rest of
    a KuhnPoker reset, paid by every episode of ``parley run`` (a fresh env each): the seed
    comes from SeedDraws, and a seeded episode makes no generator."""
    pytest.importorskip("textarena")
    for game_id, move in (("textarena:KuhnPoker-v0", "[Check]"), ("textarena:TicTacToe-v0", "[4]")):
        for seed in range(3):
            env = make(game_id)
            _, infos = env.reset(seed=seed)
            while env.agents:
                seat = next(s for s in env.agents if infos[s]["to_act"])
                _, _, _, _, infos = env.step({seat: move})
            assert env._rng is None, (game_id, seed)
