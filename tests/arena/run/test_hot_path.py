"""The runner's fast paths change no outcome (issue 11 §5).

- In-process agents see, through the short msgpack round trip, exactly what the codec's
  full round trip gives them (the bus's view), or the same error, whatever a hostile
  scenario puts in ``info``;
- the GC freeze of a run is undone when it ends, leaves a process's own freeze alone, and
  still collects the cycles the run makes;
- ``summary["timing"]`` says how long play took apart from binding and joining.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import numpy as np
import pytest

from parley.agents.base import Agent
from parley.arena.run.agent_host import AgentHost
from parley.arena.run.config import RunConfig
from parley.arena.run.direct import DirectAgents
from parley.arena.run.process import frozen_heap
from parley.arena.run.runner import run
from parley.protocols.codec import Codec
from parley.protocols.errors import ProtocolError
from parley.protocols.messages import Action, Observation
from tests.arena.run.test_runner import SCENARIO


class _Keep(Agent):
    """Keeps what it was shown; answers with a fixed move."""

    seen: list[Observation] = []  # noqa: RUF012 -- shared on purpose: the test reads it

    async def act(self, observation: Observation) -> Action:
        _Keep.seen.append(observation)
        return Action(agent=observation.agent, text="ok")


class _Opaque:
    pass


def _nested(depth: int) -> list[Any]:
    value: list[Any] = [1]
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_INFOS: list[dict[str, Any]] = [
    {},
    {"pair": (1, 2), "nested": {"a": [(3, {"b": (4.5, None)})]}},
    {"big": 2**64 - 1, "neg": -(2**63), "f": float("nan"), "inf": float("inf")},
    {"too_big": 2**64},
    {"too_small": -(2**63) - 1},
    {"text": "caf\u00e9 \u2603 \U0001f600", "\u00e9": 1},
    {"surrogate": "\ud800"},
    {"array": np.arange(6, dtype=np.int32).reshape(2, 3)},
    {"scalar": np.float64(1.5)},
    {"object": _Opaque()},
    {"set": {1, 2}},
    {"bytes": b"\x00\xff"},
    {"deep": _nested(40)},
    {"deeper": _nested(2_000)},
    {"huge": "x" * 70_000},
    {"bool": True, "none": None, "str_sub": type("S", (str,), {})("sub")},
]


def _through_codec(codec: Codec, obs: Observation) -> Any:
    from parley.protocols.messages import Envelope

    try:
        return codec.decode(codec.encode(Envelope(body=obs, sender="arena", episode="e"))).body
    except ProtocolError:
        return ProtocolError


@pytest.mark.timeout(30)
@pytest.mark.parametrize("info", HOSTILE_INFOS, ids=range(len(HOSTILE_INFOS)))
@pytest.mark.parametrize("text", ["go", "\u00e9t\u00e9", "y" * 70_000])
def test_the_agent_sees_what_the_bus_would_deliver_or_the_same_error(
    info: dict[str, Any], text: str
) -> None:
    codec = Codec(max_message_bytes=100_000)
    direct = DirectAgents(AgentHost(None, {"a": _Keep}), codec, name="arena-agents")
    obs = Observation(agent="a", text=text, scenario="s", reward=0.5, info=info)
    expected = _through_codec(Codec(max_message_bytes=100_000), obs)
    _Keep.seen.clear()

    async def ask() -> Any:
        return await direct.ask_all([obs], timeout=5, episode="e", sender="arena")

    (result,) = asyncio.run(ask())
    if expected is ProtocolError:
        assert isinstance(result, ProtocolError)
        assert _Keep.seen == []
        return
    assert isinstance(result, Action)
    (seen,) = _Keep.seen
    assert seen is not obs
    assert repr(seen) == repr(expected)  # same types too (lists, not tuples; no arrays)
    if info:
        assert seen.info is not obs.info


@pytest.mark.timeout(30)
def test_a_run_freezes_the_old_heap_only_while_it_runs_and_collects_its_cycles() -> None:
    assert gc.get_freeze_count() == 0
    made: list[weakref.ref[Any]] = []

    class _Cyclic(Agent):
        async def act(self, observation: Observation) -> Action:
            assert gc.get_freeze_count() > 0  # the old heap is frozen during play
            node: dict[str, Any] = {}
            node["self"] = node  # a cycle only the collector frees
            made.append(weakref.ref(_Box(node)))
            return Action(agent=observation.agent, text="ok")

    result = run(
        RunConfig(scenario=SCENARIO, episodes=3, progress=False),
        agents={"a": _Cyclic, "b": _Cyclic},
    )
    assert result.summary["episodes"]["ok"] == 3
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert made
    assert all(ref() is None for ref in made)


class _Box:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.me = self


@pytest.mark.timeout(30)
def test_a_process_that_froze_its_heap_keeps_its_freeze() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


@pytest.mark.timeout(30)
def test_timing_says_how_long_play_took_apart_from_joining() -> None:
    result = run(RunConfig(scenario=SCENARIO, episodes=4, progress=False))
    timing = result.summary["timing"]
    assert 0 < timing["play_s"] <= timing["wall_s"] + 1e-3
    assert 0 < timing["agents_s"] <= timing["play_s"]
