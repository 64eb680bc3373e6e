"""Imported games beside their libraries: env steps/s of the adapter ÷ the library's own step.

``parley bench games`` (issue 31 §4: target >= 0.8 for an OpenSpiel and a TextArena game).
Each game's episodes are first played once through parley with random moves (a seeded
generator picks among the seat's legal moves, or among a few texts the TextArena game
understands, :data:`TEXTARENA_MOVES`); then the same moves are timed, the cases taking turns
(:func:`~parley.arena.bench.textarena.best_rates`, in CPU time), through:

* ``parley`` — the scenario made once, ``reset(seed=...)`` per episode, ``env.step`` per move
  (every seat's observation, infos, constraint and view built each step);
* ``hooks`` (not a target) — the same scenario and moves through its hooks alone
  (:func:`play_hooks`): what ``env.step``'s machinery adds is ``parley``'s difference from
  it;
* ``library`` — the library's own environment step on the same moves:
  OpenSpiel's ``rl_environment.Environment`` (made once, ``reset()`` per episode,
  ``step([action])``; its chance events replayed from the parley episode, so the deals are the
  same), or TextArena's unwrapped env (``make`` and ``reset`` per episode, as the adapter does,
  then ``get_observation()`` and ``step(text)`` per move, ``close()`` at the end);
* ``library_state`` (OpenSpiel only, a floor, not a target) — the bare C++ state with only
  what an agent needs before each move (the mover's observation string and the names of its
  legal moves), then ``apply_action``;
* ``library_seeded`` (not a target) — ``library`` plus what parley's randomness contract
  adds to it, whatever the adapter does per step: draws made per episode from the seed of
  ``reset(seed=...)`` (OpenSpiel: the adapter's :class:`~parley.scenarios.imported.openspiel.
  SeedDraws`, made at the first chance node, one draw per chance node, the outcomes still
  replayed; TextArena: the library seed drawn from ``SeedDraws``
  (:func:`~parley.scenarios.imported.textarena.library_seed_of`), and the episode's own
  generator put behind ``random``'s functions, stdout dropped, around every call into the
  library).

``{game}_ratio_vs_library`` is parley's steps/s ÷ the library's (:data:`TARGET`);
``{game}_seeded_vs_library`` is ``library_seeded``'s: what that contract alone leaves of the
library's rate (for TextArena, whose loop parley must run whole, the most parley's ratio can
be); ``{game}_hooks_vs_library`` is ``hooks``'s (the adapter with the library, less the step
machinery). A library that is not installed is skipped with the line that installs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from parley.arena.bench.textarena import best_rates
from parley.protocols.errors import ConfigError

__all__ = ["add_arguments", "run"]

GAMES = (
    "openspiel:kuhn_poker",
    "openspiel:tic_tac_toe",
    "textarena:KuhnPoker-v0",
    "textarena:TicTacToe-v0",
)
TARGET = 0.8
"""parley's env steps/s ÷ the library's own, on the same moves (issue 31 §4)."""

TEXTARENA_MOVES: dict[str, tuple[str, ...]] = {
    "textarena:KuhnPoker-v0": ("[Check]", "[Bet]", "[Call]", "[Fold]"),
    "textarena:TicTacToe-v0": tuple(f"[{k}]" for k in range(9)),
    "textarena:SimpleNegotiation-v0": ("[Offer: 1 Wood -> 1 Wheat]", "[Accept]", "[Deny]"),
    "textarena:PigDice-v0": ("[roll]", "[roll]", "[hold]"),
}
"""Texts the TextArena games understand (TextArena lists no legal moves); a move TextArena
refuses is played on both sides alike (its own error allowance applies)."""


@dataclasses.dataclass
class Episode:
    """One recorded episode: what parley was sent, and what the library needs to replay it."""

    seed: int
    steps: list[dict[str, str]]
    """The action dict of every ``env.step``."""
    actions: list[int]
    """OpenSpiel: the player actions in order (empty for TextArena)."""
    chance: list[int]
    """OpenSpiel: the chance outcomes in order (empty for TextArena)."""
    texts: list[str]
    """TextArena: the moves in order (empty for OpenSpiel)."""
    library_seed: int = 0
    """TextArena: the seed its ``reset`` got from the adapter."""
    players: int = 0


def _library(game_id: str) -> str:
    return game_id.partition(":")[0]


def missing(game_id: str) -> str | None:
    """Why ``game_id`` cannot be compared here (with what to install), or ``None``."""
    library = _library(game_id)
    if library not in ("openspiel", "textarena"):
        return f"{game_id}: the games bench compares openspiel: and textarena: games only"
    if library == "textarena" and game_id not in TEXTARENA_MOVES:
        return f"{game_id}: no moves known for it; one of {sorted(TEXTARENA_MOVES)}"
    try:
        from parley.scenarios import make

        env = make(game_id)
    except ConfigError as exc:
        return str(exc)
    if library == "openspiel" and env.game.get_type().dynamics.name != "SEQUENTIAL":
        return f"{game_id}: only sequential OpenSpiel games are compared (one move a step)"
    return None


def record(game_id: str, episodes: int) -> list[Episode]:
    """``episodes`` episodes of random moves through parley (seeds 0, 1, ...)."""
    from parley.scenarios import make

    out = []
    for seed in range(episodes):
        env: Any = make(game_id)
        _, infos = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        steps, texts = [], []
        while env.agents:
            seat = next(s for s in env.agents if infos[s]["to_act"])
            options = infos[seat]["view"].get("legal") or TEXTARENA_MOVES[game_id]
            move = str(options[int(rng.integers(len(options)))])
            steps.append({seat: move})
            texts.append(move)
            _, _, _, _, infos = env.step({seat: move})
        if _library(game_id) == "openspiel":
            history = env.state_.full_history()
            actions = [int(item.action) for item in history if item.player >= 0]
            chance = [int(item.action) for item in history if item.player < 0]
            out.append(Episode(seed, steps, actions, chance, []))
        else:
            out.append(Episode(seed, steps, [], [], texts, env.library_seed, env.num_players))
    return out


# --- the timed loops: each returns steps per CPU second -------------------------------------


def _parley(game_id: str, episodes: list[Episode]) -> float:
    from parley.scenarios import make

    env = make(game_id)
    steps = 0
    started = time.process_time()
    for episode in episodes:
        env.reset(seed=episode.seed)
        for actions in episode.steps:
            env.step(actions)
        steps += len(episode.steps)
    return steps / (time.process_time() - started)


def play_hooks(env: Any, episode: Episode) -> None:
    """Play ``episode`` through ``env``'s hooks alone: ``reset(seed=...)``, then per move
    ``acting``, ``play`` and ``resolve``, without the machinery of ``env.step`` (the
    caller-contract and charset checks, every seat's observation and infos, the invalid-move
    record, the reward and termination dicts)."""
    env.reset(seed=episode.seed)
    for actions in episode.steps:
        for seat in env.acting():
            env.play(seat, actions.get(seat, ""))
        env.resolve()


def _hooks(game_id: str, episodes: list[Episode]) -> float:
    from parley.scenarios import make

    env = make(game_id)
    steps = 0
    started = time.process_time()
    for episode in episodes:
        play_hooks(env, episode)
        steps += len(episode.steps)
    return steps / (time.process_time() - started)


def _openspiel_env(game: Any, episodes: list[Episode]) -> float:
    from open_spiel.python import rl_environment

    outcomes: Iterator[int] = iter(())
    env = rl_environment.Environment(game, chance_event_sampler=lambda state: next(outcomes))
    steps = 0
    started = time.process_time()
    for episode in episodes:
        outcomes = iter(episode.chance)
        env.reset()
        for action in episode.actions:
            env.step([action])
        steps += len(episode.actions)
    return steps / (time.process_time() - started)


def _openspiel_seeded(game: Any, episodes: list[Episode]) -> float:
    from open_spiel.python import rl_environment

    from parley.scenarios.imported.openspiel import SeedDraws

    draws: Any = None
    seed = 0
    outcomes: Iterator[int] = iter(())

    def replay(state: Any) -> int:
        nonlocal draws
        if draws is None:  # made at the first chance node, as the adapter's
            draws = SeedDraws(seed)
        draws.random()  # (what the adapter's draw costs; the outcome is the recorded one)
        return next(outcomes)

    env = rl_environment.Environment(game, chance_event_sampler=replay)
    steps = 0
    started = time.process_time()
    for episode in episodes:
        draws, seed, outcomes = None, episode.seed, iter(episode.chance)
        env.reset()
        for action in episode.actions:
            env.step([action])
        steps += len(episode.actions)
    return steps / (time.process_time() - started)


def _openspiel_state(game: Any, episodes: list[Episode]) -> float:
    observe = (
        "observation_string"
        if game.get_type().provides_observation_string
        else "information_state_string"
    )
    steps = 0
    started = time.process_time()
    for episode in episodes:
        state = game.new_initial_state()
        chance, actions = iter(episode.chance), iter(episode.actions)
        while not state.is_terminal():
            if state.is_chance_node():
                state.chance_outcomes()  # (what a sampler reads)
                state.apply_action(next(chance))
                continue
            player = state.current_player()
            getattr(state, observe)(player)
            names = [state.action_to_string(player, a) for a in state.legal_actions(player)]
            del names
            state.apply_action(next(actions))
            steps += 1
        state.returns()
    return steps / (time.process_time() - started)


def _textarena(env_id: str, episodes: list[Episode]) -> float:
    import textarena

    raw = f"{env_id}-raw" if f"{env_id}-raw" in textarena.envs.registration.ENV_REGISTRY else env_id
    steps = 0
    started = time.process_time()
    for episode in episodes:
        env = textarena.make(raw)
        env.reset(num_players=episode.players, seed=episode.library_seed)
        for text in episode.texts:
            env.get_observation()
            env.step(action=text)
        env.close()
        steps += len(episode.texts)
    return steps / (time.process_time() - started)


def _textarena_seeded(env_id: str, episodes: list[Episode]) -> float:
    import textarena

    from parley.scenarios.imported.textarena import _OwnRandom, _raw, library_seed_of

    own, raw = _OwnRandom(), _raw(env_id)
    steps = 0
    started = time.process_time()
    for episode in episodes:
        seed = library_seed_of(episode.seed)
        own.start(seed)
        with own:
            env = textarena.make(raw)
            env.reset(num_players=episode.players, seed=seed)
        for text in episode.texts:
            with own:
                env.get_observation()
                env.step(action=text)
        with own:
            env.close()
        steps += len(episode.texts)
    return steps / (time.process_time() - started)


def _case(
    loop: Callable[[Any, list[Episode]], float], subject: Any, recorded: list[Episode]
) -> Callable[[int], float]:
    """``case(n)``: ``loop`` over the first ``n`` recorded episodes (for best_rates)."""
    return lambda n: loop(subject, recorded[:n])


def _slug(game_id: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", game_id.lower()).strip("_")


def measure(
    games: list[str], episodes: int, repeats: int, *, step: Callable[[str], None] = print
) -> dict[str, Any]:
    """Steps/s of each case and parley's ratios over the library's (module docstring);
    ``{slug}_skipped`` says why a game was not compared."""
    results: dict[str, Any] = {"target_ratio_vs_library": TARGET}
    for game_id in games:
        slug = _slug(game_id)
        why = missing(game_id)
        if why is not None:
            results[f"{slug}_skipped"] = why
            continue
        step(f"{game_id}: recording {episodes} episodes")
        recorded = record(game_id, episodes)
        name = game_id.partition(":")[2]
        cases = {
            "parley": _case(_parley, game_id, recorded),
            "hooks": _case(_hooks, game_id, recorded),
        }
        if _library(game_id) == "openspiel":
            from parley.scenarios.imported.openspiel import load_game

            game = load_game(name)
            cases["library"] = _case(_openspiel_env, game, recorded)
            cases["library_state"] = _case(_openspiel_state, game, recorded)
            cases["library_seeded"] = _case(_openspiel_seeded, game, recorded)
        else:
            cases["library"] = _case(_textarena, name, recorded)
            cases["library_seeded"] = _case(_textarena_seeded, name, recorded)
        step(f"{game_id}: timing {', '.join(cases)}")
        best = best_rates(cases, episodes, repeats)
        for case, rate in best.items():
            results[f"{slug}_steps_per_s_{case}"] = rate
        results[f"{slug}_ratio_vs_library"] = best["parley"] / best["library"]
        results[f"{slug}_seeded_vs_library"] = best["library_seeded"] / best["library"]
        results[f"{slug}_hooks_vs_library"] = best["hooks"] / best["library"]
        if "library_state" in best:
            results[f"{slug}_ratio_vs_library_state"] = best["parley"] / best["library_state"]
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--games",
        default=",".join(GAMES),
        help="comma-separated openspiel:/textarena: ids (sequential games)",
    )
    parser.add_argument("--episodes", type=int, default=300, help="recorded episodes per game")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=args.json)
    games = [g.strip() for g in args.games.split(",") if g.strip()]
    results = measure(games, args.episodes, args.repeats, step=functools.partial(_note, console))
    if args.json:
        print(json.dumps(results))
        return 0
    table = Table(title="imported games: env steps/s (CPU time), same moves")
    columns = (
        "game",
        "parley",
        "library",
        "ratio",
        f"target >= {TARGET}",
        "state floor",
        "seeded",
        "hooks",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "game" else "right")
    for game_id in games:
        slug = _slug(game_id)
        if f"{slug}_skipped" in results:
            skipped = results[f"{slug}_skipped"][:60]
            table.add_row(game_id, "-", "-", "-", "skipped", skipped, "", "")
            continue
        ratio = results[f"{slug}_ratio_vs_library"]
        floor = results.get(f"{slug}_ratio_vs_library_state")
        table.add_row(
            game_id,
            f"{results[f'{slug}_steps_per_s_parley']:,.0f}",
            f"{results[f'{slug}_steps_per_s_library']:,.0f}",
            f"{ratio:.2f}",
            "yes" if ratio >= TARGET else "no",
            "" if floor is None else f"{floor:.2f}",
            f"{results[f'{slug}_seeded_vs_library']:.2f}",
            f"{results[f'{slug}_hooks_vs_library']:.2f}",
        )
    table.caption = (
        "library: OpenSpiel's rl_environment step, TextArena's unwrapped env step; state "
        "floor: parley ÷ OpenSpiel's bare C++ state (observation and move names only); "
        "seeded: the library with parley's per-episode seeding (and TextArena's random "
        "isolation) ÷ the library; hooks: the scenario's hooks alone (no env.step "
        "machinery) ÷ the library"
    )
    console.print(table)
    return 0


def _note(console: Any, line: str) -> None:
    console.print(f"[dim]{line}[/dim]")
