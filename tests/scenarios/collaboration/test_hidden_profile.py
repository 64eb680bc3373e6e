"""hidden-profile-v0: sharing facts finds the best option; hoarding stays near chance."""

from __future__ import annotations

import numpy as np
import pytest

from parley.agents.scripted.collaboration import FactHoarder
from parley.scenarios import make
from parley.scenarios.collaboration.hidden_profile import deal_facts, parse_facts, tally
from parley.scenarios.conformance import play_episode

ID = "collaboration/hidden-profile-v0"


@pytest.mark.parametrize("n", [2, 3, 5])
def test_each_agent_alone_sees_a_tie_and_pooled_facts_show_the_best(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(20):
        best, held = deal_facts(rng, n, "ABC", 2)
        for own in held:
            assert set(tally(own, "ABC").values()) == {2}
        pooled = tally([f for own in held for f in own], "ABC")
        assert max(pooled, key=lambda o: pooled[o]) == best
        assert pooled[best] == 2 * n


def _success(n: int, episodes: int, hoard: bool) -> tuple[float, float]:
    wins, messages = [], []
    for seed in range(episodes):
        env = make(ID, n_agents=n)
        agents = {seat: FactHoarder() for seat in env.possible_agents} if hoard else None
        play_episode(ID, seed=seed, env=env, agents=agents)
        metrics = env.episode_metrics()
        wins.append(metrics["success"])
        messages.append(metrics["messages"])
    return float(np.mean(wins)), float(np.mean(messages))


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_sharers_always_find_the_best_option(n: int) -> None:
    success, messages = _success(n, 30, hoard=False)
    assert success == 1.0
    assert messages == n


def test_hoarders_stay_near_chance() -> None:
    success, messages = _success(3, 300, hoard=True)
    assert messages == 0.0
    assert abs(success - 1 / 3) < 0.1


def test_messages_cost_and_private_messages_stay_private() -> None:
    env = make(ID, n_agents=3, message_cost=0.05)
    env.reset(seed=0)
    obs, rewards, _, _, infos = env.step(
        {"agent_0": "@agent_1: psst", "agent_1": "pass", "agent_2": ""}
    )
    assert "psst" in obs["agent_1"]
    assert "psst" not in obs["agent_2"]
    assert rewards == {"agent_0": -0.05, "agent_1": 0.0, "agent_2": 0.0}
    env.step(dict.fromkeys(env.possible_agents, "pass"))
    _, rewards, terms, _, infos = env.step({"agent_0": "A", "agent_1": "vote B", "agent_2": "Z"})
    assert "invalid" in infos["agent_2"]
    assert all(terms.values())
    assert set(infos["agent_0"]["components"]) == {"task"}


def test_parse_facts_reads_shared_lines() -> None:
    facts = parse_facts("My facts: [F07] option B: +1 (x) [F12] option A: +1 (y)")
    assert [(f.id, f.option, f.value) for f in facts] == [(7, "B", 1), (12, "A", 1)]
