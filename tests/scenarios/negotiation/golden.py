"""Golden transcripts: a digest of what a scenario version does, pinned so that a refactor
that shares code between versions is seen to change nothing.

:func:`digest` plays ``seeds`` episodes of a scenario id (with its arguments) twice each:
once with the spec's scripted baselines, once with a mixed agent that, half of the time,
replaces the baseline's move with a choice of the seat's constraint, a hostile action of the
conformance suite, garbage (non-strings included), an action-space sample, an empty or
doubled move, or a token of another game; seats not asked sometimes send one too. It hashes
every ``reset`` and ``step`` output (observations, rewards, terminations, truncations,
infos), the actions, the final render and the episode metrics. The digests in the tests
were computed with the code before the shared helpers of ``parley.scenarios.declaring``
(commit 8c182f2), where 200 seeds a version also gave identical transcripts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from parley.protocols.messages import Observation
from parley.scenarios.conformance import GARBAGE, agent_seed, baseline_agents, hostile_actions
from parley.scenarios.registry import make

OTHER_GAMES = (
    "[Accept]",
    "[Deny]",
    "[Offer: 3 Wood -> 2 Gold]",
    "[Offer: I give 2 Wood; You give 1 Gold]",
    "<selection>",
    "deal",
    "no agreement",
    "book=1 hat=0 ball=2 / book=0 hat=2 ball=1",
    "propose: book=1 hat=1 ball=1",
    "1",
    "A",
    "50",
    '{"answer": "1"}',
    "[Offer: 99 Wood -> 1 Gold]",
    "[Accept] [Offer: 1 Gold -> 1 Wood]",
    "\n",
)
"""Moves of the built-in games, played where they may or may not mean something."""


def _canon(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, default=repr).encode()


def _mixed(env: Any, seat: str, info: dict[str, Any], base: str, rng: np.random.Generator) -> Any:
    """The mixed agent's move: ``base`` or, half of the time, one of the others above."""
    if rng.random() >= 0.5:
        return base
    kind = int(rng.integers(8))
    constraint = info.get("constraint") or {}
    choices = constraint.get("choices") if constraint.get("type") == "choice" else None
    options: list[Any] = [
        choices[int(rng.integers(len(choices)))] if choices else base,
        "",
        base + " " + base,
        OTHER_GAMES[int(rng.integers(len(OTHER_GAMES)))],
        base + " " + OTHER_GAMES[int(rng.integers(len(OTHER_GAMES)))],
    ]
    if kind < len(options):
        return options[kind]
    if kind == 5:
        hostile = hostile_actions(info)
        return hostile[int(rng.integers(len(hostile)))]
    if kind == 6:
        return GARBAGE[int(rng.integers(len(GARBAGE)))]
    return env.action_space(seat).sample()


async def _episode(scenario_id: str, kwargs: dict[str, Any], seed: int, mixed: bool) -> bytes:
    digest = hashlib.sha256()
    env = make(scenario_id, **kwargs)
    agents = baseline_agents(scenario_id, env.possible_agents)
    for index, seat in enumerate(env.possible_agents):
        agents[seat].reset(agent_seed(seed, index))
        env.action_space(seat).seed(seed)
    rng = np.random.default_rng((seed, 7))
    observations, infos = env.reset(seed=seed)
    digest.update(_canon(["reset", observations, infos]))
    rewards: dict[str, float] = {}
    for _ in range(400):
        if not env.agents:
            break
        actions: dict[str, Any] = {}
        for seat in env.agents:
            info = infos.get(seat, {})
            if not info.get("to_act", True):
                stray = mixed and rng.random() < 0.05
                actions[seat] = OTHER_GAMES[int(rng.integers(len(OTHER_GAMES)))] if stray else ""
                continue
            observation = Observation(
                agent=seat,
                text=observations[seat],
                scenario=scenario_id,
                reward=rewards.get(seat, 0.0),
                info=dict(info),
            )
            try:
                base = (await agents[seat].act(observation)).text
            except Exception as exc:  # a baseline lost in a game the mixed moves changed
                base = ""
                digest.update(type(exc).__name__.encode())
            actions[seat] = _mixed(env, seat, info, base, rng) if mixed else base
        observations, rewards, terminations, truncations, infos = env.step(actions)
        shown = {seat: repr(action) for seat, action in actions.items()}
        step = [shown, observations, rewards, terminations, truncations, infos]
        digest.update(_canon(["step", *step]))
    digest.update(_canon(["end", env.render(), env.episode_metrics()]))
    return digest.digest()


def digest(scenario_id: str, kwargs: dict[str, Any] | None = None, seeds: int = 8) -> str:
    """sha256 (16 hex digits) of ``seeds`` episodes with the baselines and as many mixed."""

    async def play() -> str:
        total = hashlib.sha256()
        for seed in range(seeds):
            for mixed in (False, True):
                total.update(await _episode(scenario_id, kwargs or {}, seed, mixed))
        return total.hexdigest()[:16]

    return asyncio.run(play())


def golden_test(cases: list[tuple[str, dict[str, Any], str]]) -> Callable[..., None]:
    """A test, parametrized over ``(scenario id, arguments, digest)`` ``cases``, that each
    case's :func:`digest` is the one pinned; a family's test module binds it to a name."""

    @pytest.mark.parametrize(("scenario_id", "kwargs", "expected"), cases)
    def test_transcripts_match_the_golden_digest(
        scenario_id: str, kwargs: dict[str, Any], expected: str
    ) -> None:
        assert digest(scenario_id, kwargs) == expected

    return test_transcripts_match_the_golden_digest
