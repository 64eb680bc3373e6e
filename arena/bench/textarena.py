"""simple-trade beside TextArena 0.7.4's SimpleNegotiation: env steps/s for the same moves.

Part of ``parley bench env`` (issue 11 §5: an env step of simple-trade must not cost more
than TextArena's). Each episode, on both sides, builds a fresh env, resets it and plays
ten turns of the same trivial moves — the first player offers one unit of wood for one unit
of another resource, the second denies — reading each player's observation before it
moves, as an agent would:

* ``negotiation/simple-trade-v0`` and ``-v1`` through :func:`parley.scenarios.make`
  (``env.step`` returns every observation);
* TextArena's ``SimpleNegotiationEnv`` bare (``env.get_observation()`` then
  ``env.step(action)``), the strictest reference; and as ``textarena.make`` wraps it
  (``GameMessagesObservationWrapper`` rebuilds the whole message list into a string on every
  observation).

TextArena is not a dependency of parley: when it is missing, this part is skipped with the
line that installs it (:data:`INSTALL`). Rates are the best of many short runs in CPU time
(everything runs in this process), the cases taking turns (:func:`best_rates`).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["best_rates", "measure"]

TEXTARENA_VERSION = "0.7.4"
INSTALL = f"pip install --no-deps textarena=={TEXTARENA_VERSION} nltk chess"
"""How to install TextArena for this comparison (its other dependencies are not needed)."""

# The same moves on both sides: an offer of one wood, then a denial, for ten turns.
OURS: dict[str, dict[str, str]] = {
    "negotiation/simple-trade-v0": {
        "player_0": "[Offer: I give 1 Wood; You give 1 Gold]",
        "player_1": "[Deny]",
    },
    "negotiation/simple-trade-v1": {
        "player_0": "[Offer: 1 Wood -> 1 Gold]",
        "player_1": "[Deny]",
    },
}
THEIRS = {0: "[Offer: 1 Wood -> 1 Wheat]", 1: "[Deny]"}
TURNS = 10
_UNIQUE = itertools.count()
"""Numbers the moves of the ``distinct`` cases: no text ever recurs, in a run or across runs."""


CHUNKS = 10
"""Each timed run is cut into this many short ones (see :func:`best_rates`)."""


def best_rates(
    cases: Mapping[str, Callable[[int], float]], episodes: int, repeats: int
) -> dict[str, float]:
    """The best rate of each case (``case(n)`` plays ``n`` episodes and returns its rate)
    over ``repeats`` x :data:`CHUNKS` short runs of ``episodes / CHUNKS`` episodes, the cases
    taking turns run by run: on a loaded machine a short run more often falls in a quiet
    moment, and turns taken often let every case meet the same moments."""
    n = max(1, episodes // CHUNKS)
    best = dict.fromkeys(cases, 0.0)
    for _ in range(repeats * CHUNKS):
        for name, case in cases.items():
            best[name] = max(best[name], case(n))
    return best


def missing() -> str | None:
    """Why the comparison cannot run here (with the install line), or ``None``."""
    try:
        textarena = importlib.import_module("textarena")
    except ImportError as exc:
        return f"TextArena is not installed ({exc.msg}); to compare, run: {INSTALL}"
    version = getattr(textarena, "__version__", "unknown")
    if version != TEXTARENA_VERSION:
        return f"TextArena {version} is installed, not {TEXTARENA_VERSION}: {INSTALL}"
    return None


def _ours(scenario: str, episodes: int, distinct: bool = False) -> float:
    """Env steps/s of ``scenario``: make, reset and ten turns per episode. ``distinct``: each
    move carries a never-repeated message (as an LLM's moves would): no whole text recurs,
    only the offer inside it (the rules code remembers offers, not messages)."""
    from parley.scenarios import make

    moves = OURS[scenario]
    steps = 0
    started = time.process_time()
    for episode in range(episodes):
        env = make(scenario, max_turns=TURNS)
        observations, infos = env.reset(seed=episode)
        while env.agents:
            actions = {}
            for seat in env.agents:
                if infos[seat].get("to_act", True) and observations[seat]:
                    move = moves[seat]
                    actions[seat] = f"{move} Note {next(_UNIQUE)}." if distinct else move
            observations, _, _, _, infos = env.step(actions)
            steps += 1
        env.close()
    return steps / (time.process_time() - started)


def _theirs(make_env: Callable[[], Any], episodes: int, distinct: bool = False) -> float:
    """Env steps/s of TextArena's SimpleNegotiation: make, reset and play per episode
    (``distinct``: as in :func:`_ours`)."""
    steps = 0
    started = time.process_time()
    for episode in range(episodes):
        env = make_env()
        env.reset(num_players=2, seed=episode)
        done = False
        while not done:
            player, observation = env.get_observation()
            move = THEIRS[player] if observation is not None else ""
            done, _ = env.step(f"{move} Note {next(_UNIQUE)}." if distinct and move else move)
            steps += 1
        env.close()
    return steps / (time.process_time() - started)


def measure(episodes: int, repeats: int) -> dict[str, Any]:
    """Steps/s of both sides and our ratios over TextArena's; ``{"textarena_skipped": why}``
    when TextArena 0.7.4 is not importable."""
    why = missing()
    if why is not None:
        return {"textarena_skipped": why}
    import textarena
    from textarena.envs.SimpleNegotiation.env import SimpleNegotiationEnv

    cases: dict[str, Callable[[int], float]] = {
        "textarena_bare": lambda n: _theirs(lambda: SimpleNegotiationEnv(max_turns=TURNS), n),
        "textarena_wrapped": lambda n: _theirs(lambda: textarena.make("SimpleNegotiation-v0"), n),
    }
    cases["textarena_bare_distinct"] = lambda n: _theirs(
        lambda: SimpleNegotiationEnv(max_turns=TURNS), n, distinct=True
    )
    for scenario in OURS:
        cases[scenario] = functools.partial(_ours, scenario)
        cases[f"{scenario}_distinct"] = functools.partial(_ours, scenario, distinct=True)
    best = best_rates(cases, episodes, repeats)
    results: dict[str, Any] = {
        "textarena_version": TEXTARENA_VERSION,
        "env_steps_per_s_textarena_bare": best["textarena_bare"],
        "env_steps_per_s_textarena_wrapped": best["textarena_wrapped"],
    }
    for scenario in OURS:
        version = scenario.rsplit("-", 1)[1]
        results[f"env_steps_per_s_simple_trade_{version}"] = best[scenario]
        results[f"simple_trade_{version}_ratio_vs_textarena"] = (
            best[scenario] / best["textarena_bare"]
        )
        results[f"simple_trade_{version}_ratio_vs_textarena_wrapped"] = (
            best[scenario] / best["textarena_wrapped"]
        )
        # Every move a new text (LLM-like): only the offers in them recur.
        results[f"simple_trade_{version}_ratio_vs_textarena_distinct_moves"] = (
            best[f"{scenario}_distinct"] / best["textarena_bare_distinct"]
        )
    return results
