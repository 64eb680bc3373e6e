"""Every registered baseline: constructible with no arguments, an Agent, plays its seat."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from parley.agents.base import Agent
from parley.agents.scripted.base import ScriptedAgent
from parley.agents.scripted.collaboration import encode
from parley.protocols.messages import Observation
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


class _Draws(ScriptedAgent):
    """Draws three numbers per move; its __init__ skips ScriptedAgent's, as a user's may."""

    def __init__(self, label: str = "x") -> None:
        self.label = label

    def decide(self, observation: Observation) -> str:
        return " ".join(str(int(v)) for v in self.rng.integers(0, 10**9, size=3))


def _moves(agent: ScriptedAgent, n: int = 3) -> list[str]:
    return [agent.decide(Observation(agent="a", text="go")) for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 7, 2**40])
def test_a_seeded_reset_draws_the_stream_of_that_seed_made_at_first_use(seed: int) -> None:
    agent = _Draws()
    agent.reset(seed)
    expected = np.random.default_rng(seed).integers(0, 10**9, size=9).tolist()
    assert " ".join(_moves(agent)).split() == [str(v) for v in expected]
    agent.reset(seed)  # a second episode with the same seed replays it, even mid-stream
    assert " ".join(_moves(agent)).split() == [str(v) for v in expected]


def test_the_generator_follows_every_kind_of_reset_and_can_be_replaced() -> None:
    agent = _Draws()
    first = _moves(agent)  # never reset: OS entropy, not an error
    agent.reset(None)
    assert _moves(agent) != first  # fresh entropy each time
    agent.reset(np.random.SeedSequence(5))  # numpy's other seed types still work
    assert _moves(agent) == _moves(_seeded(np.random.SeedSequence(5)))
    with pytest.raises(ValueError):
        agent.reset(-1)  # numpy's own error, at reset
    agent.rng = np.random.default_rng(3)
    assert " ".join(_moves(agent, 1)).split() == [
        str(v) for v in np.random.default_rng(3).integers(0, 10**9, size=3)
    ]


def _seeded(seed: Any) -> ScriptedAgent:
    agent = _Draws()
    agent.reset(seed)
    return agent
