"""Every registered baseline: constructible with no arguments, an Agent, plays its seat."""

from __future__ import annotations

import asyncio

import pytest

from parley.agents.base import Agent
from parley.agents.scripted.collaboration import encode
from parley.scenarios import make, registry
from parley.scenarios.conformance import baseline_agents, play_episode
from parley.scenarios.registry import load_attr

# The built-in scenarios (other test modules register test/ ones for the whole session).
SCENARIOS = sorted(i for i, s in registry().items() if not s.entry_point.startswith("tests."))


@pytest.mark.parametrize("scenario_id", SCENARIOS)
def test_baselines_are_agents_that_finish_episodes_without_invalid_moves(scenario_id: str) -> None:
    refs = set(registry()[scenario_id].baselines.values())
    assert all(issubclass(load_attr(ref), Agent) for ref in refs)
    for seed in range(3):
        env = make(scenario_id)
        play_episode(scenario_id, seed=seed, env=env)
        assert env.agents == []
        assert env.episode_metrics()["invalid_moves"] == 0.0


def test_agents_reset_their_memory_between_episodes() -> None:
    agents = baseline_agents("negotiation/deal-or-no-deal-v0", ["player_0", "player_1"])
    first = play_episode("negotiation/deal-or-no-deal-v0", seed=4, agents=agents)
    again = play_episode("negotiation/deal-or-no-deal-v0", seed=4, agents=agents)
    assert first == again
    asyncio.run(agents["player_0"].close())


def test_code_is_lossless_when_the_message_space_is_large_enough() -> None:
    codes = {encode([a, b], 4, "abcdefgh", 2) for a in range(4) for b in range(4)}
    assert len(codes) == 16
    assert encode([0, 0], 4, "ab", 1) == "a"
