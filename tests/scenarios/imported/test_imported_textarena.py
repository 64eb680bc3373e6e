"""TextArena games as parley scenarios (parley.scenarios.imported.textarena)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

ta = pytest.importorskip("textarena")

from parley.scenarios import make  # noqa: E402
from parley.scenarios.charset import printable  # noqa: E402
from parley.scenarios.imported import catalog  # noqa: E402
from parley.scenarios.imported.checks import quick_check, whole_episodes  # noqa: E402
from parley.scenarios.imported.textarena import _format  # noqa: E402

# Moves each game understands (plus garbage, which TextArena must refuse by its own rules).
MOVES = {
    "textarena:KuhnPoker-v0": ["[Check]", "[Bet]", "[Call]", "[Fold]", "hm"],
    "textarena:TicTacToe-v0": [f"[{k}]" for k in range(9)] + ["[9]"],
    "textarena:PigDice-v0": ["[roll]", "[roll]", "[hold]"],
    "textarena:SimpleNegotiation-v0": ["[Accept]", "[Deny]", "hello", "[Offer: 1 Wheat -> 1 Ore]"],
    "textarena:IteratedPrisonersDilemma-v0": ["[cooperate]", "[defect]", "talk"],
}
# Accepted ids whose every reset takes seconds (Sudoku-v0-hard generates its puzzle by search):
# the enumeration leaves them out.
COSTLY = {"textarena:Sudoku-v0-hard", "textarena:Sokoban-v0-medium"}


def _play(scenario_id: str, seed: int) -> tuple[Any, list[str], list[str]]:
    """One episode of random moves; the moves and what each acting seat was shown."""
    env = make(scenario_id)
    observations, infos = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    played, shown = [], []
    while env.agents:
        seat = next(s for s in env.agents if infos[s]["to_act"])
        shown.append(observations[seat])
        move = MOVES[scenario_id][int(rng.integers(len(MOVES[scenario_id])))]
        played.append(move)
        observations, _, _, _, infos = env.step({s: move if s == seat else "" for s in env.agents})
    return env, played, shown


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario_id", sorted(MOVES))
def test_scores_and_views_equal_the_librarys_for_the_same_moves(scenario_id: str) -> None:
    """The same texts played straight into TextArena (seeded as the adapter seeded it): the
    seats' task totals are TextArena's rewards, and each turn's observation is exactly what
    TextArena addressed to that player (then the prompt): nothing another player was sent."""
    for seed in range(3):
        env, played, shown = _play(scenario_id, seed)
        lib = ta.make(scenario_id.split(":", 1)[1] + "-raw")
        lib.reset(num_players=env.num_players, seed=env.library_seed)
        for move, observation in zip(played, shown, strict=True):
            _, messages = lib.get_observation()
            # (parley's own line for a refused move aside: the seat made that move itself)
            own = [ln for ln in observation.split("\n") if not ln.startswith("Invalid move: ")]
            assert "\n".join(own) == printable(_format(messages)) + "\nYour move."
            done, _ = lib.step(action=move)
        assert done
        rewards, _ = lib.close()
        for pid, seat in enumerate(env.possible_agents):
            assert env.totals(seat)["task"] == pytest.approx(float(rewards[pid]))


@pytest.mark.timeout(60)
def test_interleaved_episodes_draw_from_their_own_streams() -> None:
    """Two PigDice episodes stepped in turn in one process give the transcripts each gives
    alone (TextArena rolls its dice from the global random module), and the caller's random
    state is untouched."""
    alone = [_transcript("textarena:PigDice-v0", seed) for seed in (1, 2)]
    random.seed(12345)
    before = random.getstate()
    envs = [make("textarena:PigDice-v0") for _ in range(2)]
    logs: list[list[str]] = [[], []]
    infos = [env.reset(seed=seed)[1] for env, seed in zip(envs, (1, 2), strict=True)]
    rngs = [np.random.default_rng(seed) for seed in (1, 2)]
    while any(env.agents for env in envs):
        for k, env in enumerate(envs):
            if not env.agents:
                continue
            move = MOVES["textarena:PigDice-v0"][int(rngs[k].integers(3))]
            observations, _, _, _, infos[k] = env.step(dict.fromkeys(env.agents, move))
            logs[k].append(repr(sorted(observations.items())))
    assert logs == alone
    assert random.getstate() == before


@pytest.mark.timeout(60)
def test_a_game_that_draws_while_it_is_made_depends_on_the_seed_only() -> None:
    """Taboo-v0-full draws its words while TextArena makes it: the adapter seeds the
    episode's generator before that, so the caller's random state does not change the
    episode (it did while the generator started as a copy of the caller's state)."""
    env = make("textarena:Taboo-v0-full")
    shown = []
    for caller_seed in (99, 1):
        random.seed(caller_seed)
        observations, _ = env.reset(seed=0)
        shown.append(observations)
    assert shown[0] == shown[1]


@pytest.mark.timeout(60)
def test_the_library_seed_comes_from_seed_draws_and_a_seed_replays_its_episode() -> None:
    """A seeded episode's library seed is SeedDraws' first draw of its seed (no numpy
    generator made: ~8 us, as much as the rest of a KuhnPoker reset): the same seed gives the
    same episode in a fresh env or a reused one, whatever came before; neighbouring seeds
    give other library seeds; a reset without a seed continues the env's own stream."""
    from parley.scenarios.imported.openspiel import SeedDraws
    from parley.scenarios.imported.textarena import library_seed_of

    seeds = [library_seed_of(seed) for seed in range(2000)]
    assert seeds[:3] == [int(SeedDraws(s).random() * (2**31 - 1)) for s in range(3)]
    assert all(0 <= s < 2**31 - 1 for s in seeds)
    assert len(set(seeds)) == len(seeds)
    assert library_seed_of(2**64 - 1) >= 0
    alone = [_transcript("textarena:PigDice-v0", seed) for seed in (1, 2)]
    reused = make("textarena:PigDice-v0")
    for seed in (2, 1, 2):
        assert _transcript("textarena:PigDice-v0", seed, reused) == alone[seed - 1]
        assert reused.library_seed == library_seed_of(seed)
        assert reused._rng is None  # (nothing drew from numpy's generator)
    reused.reset()  # (no seed: the stream seeded by the last seed, continued)
    expected = int(np.random.default_rng(2).integers(2**31 - 1))
    assert reused.library_seed == expected
    reused.reset()
    assert reused.library_seed != expected  # (the next of that stream)
    for odd in (-1, 2**64):  # (seeds SeedDraws does not take: numpy's generator, as before)
        env = make("textarena:PigDice-v0")
        try:
            env.reset(seed=odd)
        except ValueError:
            continue  # (numpy refuses negative seeds)
        again = make("textarena:PigDice-v0")
        again.reset(seed=odd)
        assert again.library_seed == env.library_seed


def _transcript(scenario_id: str, seed: int, env: Any = None) -> list[str]:
    env = env or make(scenario_id)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    log = []
    while env.agents:
        move = MOVES[scenario_id][int(rng.integers(3))]
        observations, *_ = env.step(dict.fromkeys(env.agents, move))
        log.append(repr(sorted(observations.items())))
    return log


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario_id", sorted(MOVES))
def test_selected_games_pass_the_conformance_suite(scenario_id: str) -> None:
    whole_episodes(scenario_id)


def test_a_library_failure_is_an_invalid_move_that_ends_the_episode() -> None:
    """ThreeCardMonte-v0 returns a message where its reward should be: the episode ends,
    recorded, nothing scored, no exception."""
    env = make("textarena:ThreeCardMonte-v0")
    env.reset(seed=0)
    for _ in range(5):
        if not env.agents:
            break
        _, _, _, _, infos = env.step(dict.fromkeys(env.agents, "not a guess"))
    assert not env.agents
    assert env.episode_metrics()["library_error"] == 1.0
    assert "TextArena raised" in infos["player_0"]["invalid"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_every_accepted_game_holds_the_contract_for_a_few_steps() -> None:
    entries = catalog(("textarena",))
    accepted = [e.id for e in entries if e.accepted and e.id not in COSTLY]
    games = {i.split(":", 1)[1].split("-v")[0] for i in accepted}
    assert len(games) >= 50, sorted(games)
    assert all(e.reason for e in entries if not e.accepted)
    failures = []
    for scenario_id in accepted:
        try:
            quick_check(scenario_id, steps=6)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures


def test_format_gives_the_lines_of_every_form_of_message() -> None:
    """The fast path of the common form (int sender, str text; lists only) against the
    general loop (which a tuple of the same messages takes), with odd items mixed in: bool,
    float and out-of-range senders, lists, pairs, bare texts, non-str texts, none."""
    rng = random.Random(3)
    senders: list[Any] = [-1, 0, 1, 2, 15, 16, -2, True, False, 1.0, "x"]
    texts: list[Any] = ["[Bet]", "", "two\nlines", 7, None]
    for _ in range(3000):
        messages: list[Any] = []
        for _ in range(rng.randint(0, 5)):
            common = rng.random() < 0.8
            sender = rng.choice(senders[:5] if common else senders)
            text = rng.choice(texts[:3] if common else texts)
            form = 0 if common else rng.randint(0, 4)
            item = [
                (sender, text, "kind"),
                [sender, text, "kind"],
                (sender, text),
                (sender, text, "kind", "extra"),
                text,
            ][form]
            messages.append(item)
        assert _format(messages) == _format(tuple(messages)), messages
    assert _format([]) == ""
    assert _format("as is") == "as is"
