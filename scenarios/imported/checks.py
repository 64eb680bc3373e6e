"""Conformance of imported games, cheap enough to run over every game a library has.

:func:`quick_check` plays a few steps of one game (hostile texts and random legal moves) and
holds it to parley's contract: no exception, observations in their space, ``infos`` plain
JSON that the wire can encode, the step reward the sum of its components, at most
:data:`~parley.scenarios.conformance.STEP_CPU_BUDGET_S` of CPU per step, and the same
transcript twice from the same seed. :func:`library_noninterference` is the
``noninterference`` check for games whose later chance draws depend on hidden ones (a deck
after a hidden deal): it compares a seat's view in the two worlds only until the library's
own observation for that seat differs (the rules made the hidden datum's consequence
visible); before that point every parley observation and info must be identical. The
seats play random legal moves (their texts replayed in both worlds).
"""

from __future__ import annotations

import gc
import json
import time
import warnings
from typing import Any

import msgspec
import numpy as np

from parley.scenarios.conformance import (
    HOSTILE_TEXTS,
    STEP_CPU_BUDGET_S,
    ConformanceFailure,
    NotApplicable,
    check_contract,
    check_determinism,
    check_fuzz,
    check_hostile,
)
from parley.scenarios.registry import make

__all__ = ["library_noninterference", "quick_check", "whole_episodes"]


def _moves(info: dict[str, Any]) -> list[str]:
    return list((info.get("view") or {}).get("legal") or [])


def _play(scenario_id: str, seed: int, steps: int, timed: bool = True) -> list[str]:
    env = make(scenario_id)
    rng = np.random.default_rng(seed)
    observations, infos = env.reset(seed=seed)
    record = [json.dumps([observations, infos], sort_keys=True)]
    for step in range(steps):
        if not env.agents:
            break
        actions = {}
        for seat in env.agents:
            legal = _moves(infos[seat])
            hostile = step % 3 == 1 or not legal
            pick = HOSTILE_TEXTS[int(rng.integers(len(HOSTILE_TEXTS)))]
            actions[seat] = pick if hostile else legal[int(rng.integers(len(legal)))]
        collecting = gc.isenabled()
        gc.disable()
        cpu = time.thread_time()
        try:
            observations, rewards, _, _, infos = env.step(actions)
        except Exception as exc:
            raise ConformanceFailure(f"{scenario_id}: step raised {exc!r}") from exc
        finally:
            cpu = time.thread_time() - cpu
            if collecting:
                gc.enable()
        if timed and cpu > STEP_CPU_BUDGET_S:
            raise ConformanceFailure(f"{scenario_id}: a step took {cpu:.3f} s of CPU")
        for seat, text in observations.items():
            if not env.observation_space(seat).contains(text):
                raise ConformanceFailure(f"{scenario_id}: observation of {seat} off its space")
            msgspec.msgpack.encode(infos[seat])
            if not np.isclose(rewards[seat], sum(infos[seat]["components"].values())):
                raise ConformanceFailure(f"{scenario_id}: reward of {seat} != its components")
        record.append(json.dumps([observations, rewards, infos], sort_keys=True))
    return record


def quick_check(scenario_id: str, *, steps: int = 8, seed: int = 0) -> None:
    """A few steps of ``scenario_id`` against the contract (module docstring); raises
    :class:`ConformanceFailure` naming what broke."""
    # The first run is not timed: it warms the library's process-wide caches (tiny_bridge
    # builds its tables on first use, 0.1 s once); the second is.
    first, again = _play(scenario_id, seed, steps, timed=False), _play(scenario_id, seed, steps)
    if first != again:
        at = next(i for i, (a, b) in enumerate(zip(first, again, strict=False)) if a != b)
        raise ConformanceFailure(f"{scenario_id}: seed {seed} gave two transcripts (step {at})")


def whole_episodes(scenario_id: str) -> None:
    """parley's conformance checks that play whole episodes (contract, determinism on seeds
    0 and 1, a fuzz episode of garbage, the hostile run), warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_contract(scenario_id)
        check_determinism(scenario_id, seeds=(0, 1))
        check_fuzz(scenario_id, episodes=1)
        check_hostile(scenario_id)


def library_noninterference(scenario_id: str, seeds: tuple[int, ...] = (0, 1, 2)) -> int:
    """The noninterference check up to the library's own disclosure (module docstring).

    Returns how many steps were compared over all seeds and seats; raises
    :class:`NotApplicable` when nothing is hidden at the deal.
    """
    compared = 0
    for seed in seeds:
        probe = make(scenario_id)
        probe.reset(seed=seed)
        for index, keep in enumerate(probe.possible_agents):
            rng = np.random.default_rng([seed, index])
            compared += _replay(scenario_id, seed, keep, int(rng.integers(2**32)))
    if not compared:
        raise NotApplicable("nothing dealt is hidden from any seat")
    return compared


def _replay(scenario_id: str, seed: int, keep: str, redraw_seed: int) -> int:
    plain, redrawn = make(scenario_id), make(scenario_id)
    seen = plain.reset(seed=seed)
    probe = make(scenario_id)
    probe.reset(seed=seed)
    if not probe.redraw_private(keep, np.random.default_rng(redraw_seed)):
        return 0
    other = redrawn.reset(
        seed=seed, options={"redraw_private": {"keep": keep, "seed": redraw_seed}}
    )
    player = plain.index[keep]
    rng = np.random.default_rng(seed)
    compared = 0
    while plain.agents and redrawn.agents:
        if plain._observation(player) != redrawn._observation(player):
            break  # the library itself now shows keep something that differs
        for name, a, b in (
            ("observation", seen[0].get(keep), other[0].get(keep)),
            ("infos", json.dumps(seen[-1].get(keep), sort_keys=True),
             json.dumps(other[-1].get(keep), sort_keys=True)),
        ):  # fmt: skip
            if a != b:
                raise ConformanceFailure(
                    f"{scenario_id} seed {seed}: {keep}'s {name} depends on data it may not "
                    f"know:\n  {str(a)[:300]}\n  {str(b)[:300]}"
                )
        compared += 1
        actions = {}
        for seat in plain.agents:
            legal = _moves(seen[-1][seat])
            actions[seat] = legal[int(rng.integers(len(legal)))] if legal else ""
        seen = plain.step(actions)
        if not plain.agents:
            break
        other = redrawn.step({seat: actions.get(seat, "") for seat in redrawn.agents})
        if any("invalid" in info for info in other[-1].values()):
            break  # a move legal in one world only: the two games part here
    return compared
