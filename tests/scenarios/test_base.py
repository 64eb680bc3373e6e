"""The Scenario machinery, on a tiny chat scenario defined here."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np
import pytest

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario, split_address


class Chat(Scenario):  # type: ignore[misc]
    """Seats take turns; "@seat: text" is private, "bad" is rejected, "end" ends it."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "test/chat-v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    default_invalid_penalty = 0.25

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(["a", "b", "c"], **kwargs)

    def new_episode(self, rng: np.random.Generator) -> None:
        self.s = {"secret": int(rng.integers(1_000_000)), "speaker": 0}
        self.tell("a", f"secret {self.s['secret']}")

    def acting(self) -> list[str]:
        return [self.possible_agents[self.s["speaker"] % 3]]

    def play(self, agent: str, action: str) -> str | None:
        self.s["speaker"] += 1
        if action == "bad":
            return "bad is not allowed"
        if action == "end":
            self.reward(agent, "task", 1.0)
            self.finish()
            return None
        to, body = split_address(action, self.possible_agents)
        self.say(agent, body, to)
        return None

    def system_prompt(self, agent: str) -> str:
        return "Chat."


def test_spaces_are_cached_and_per_instance() -> None:
    one, two = Chat(), Chat()
    assert one.action_space("a") is one.action_space("a")
    assert one.observation_space("b") is one.observation_space("b")
    assert one.action_space("a") is not two.action_space("a")
    assert one.action_space("a").contains("hello world\n!")
    assert not one.action_space("a").contains("héllo")


def test_rng_is_seeded_only_by_reset() -> None:
    env = Chat()
    env.reset(seed=7)
    first = env.s["secret"]
    env.reset(seed=7)
    assert env.s["secret"] == first
    env.reset()  # continues the generator: a new draw
    assert env.s["secret"] != first
    np.random.seed(0)  # the global generator must not matter
    env.reset(seed=7)
    assert env.s["secret"] == first


def test_public_and_private_messages_reach_the_next_observation() -> None:
    env = Chat()
    obs, infos = env.reset(seed=0)
    assert infos["a"]["to_act"]
    assert not infos["b"]["to_act"]
    assert obs["a"].startswith("secret ")
    obs, *_, infos = env.step({"a": "hello all", "b": "ignored", "c": "ignored"})
    assert "a: hello all" in obs["b"]
    assert "a: hello all" in obs["c"]
    assert "ignored" not in env.render()
    obs, *_, infos = env.step({"b": "@c: only you"})
    assert "only you" in obs["c"]
    assert "only you" not in obs["a"]
    # c was not asked before, so its lines were kept: it now sees both messages at once.
    assert "hello all" in obs["c"]


def test_invalid_moves_are_recorded_with_penalty_not_raised() -> None:
    env = Chat()
    env.reset(seed=0)
    for bad in ["bad", None, 3, "x" * 2000, "naïve"]:
        agent = env.acting()[0]
        _, rewards, _, _, infos = env.step({agent: bad})
        assert "invalid" in infos[agent], bad
        assert infos[agent]["components"] == {"invalid": -0.25}
        assert rewards[agent] == -0.25
    assert env.episode_metrics()["invalid_moves"] == 5


def test_finish_terminates_everyone_and_empties_agents() -> None:
    env = Chat()
    env.reset(seed=0)
    _, rewards, terms, truncs, _infos = env.step({"a": "end"})
    assert rewards == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert all(terms.values())
    assert not any(truncs.values())
    assert env.agents == []
    assert env.step({"a": "x"}) == ({}, {}, {}, {}, {})


def test_max_cycles_truncates() -> None:
    env = Chat(max_cycles=2)
    env.reset(seed=0)
    env.step({"a": "1"})
    *_, terms, truncs, _ = env.step({"b": "2"})
    assert all(truncs.values())
    assert not any(terms.values())
    assert env.agents == []


def test_no_episode_runs_forever_by_default() -> None:
    # Chat's rules never end an episode that nobody ends: the default cap truncates it.
    env = Chat()
    assert env.max_cycles == Scenario.default_max_cycles
    env.reset(seed=0)
    steps = 0
    while env.agents:
        (agent,) = env.acting()
        *_, terms, truncs, _ = env.step({agent: "bad"})  # invalid moves count too
        steps += 1
    assert steps == Scenario.default_max_cycles
    assert all(truncs.values())
    assert not any(terms.values())


def test_every_registered_scenario_has_a_step_cap() -> None:
    from parley.scenarios import make, registry

    # parley's own scenarios (other tests register foreign ParallelEnvs in this process).
    ours = [s.id for s in registry().values() if s.entry_point.startswith("parley.scenarios.")]
    assert len(ours) >= 15
    for name in ours:
        env = make(name)
        try:
            assert 1 <= env.max_cycles <= Scenario.default_max_cycles, name
        finally:
            env.close()


def test_state_is_ascii_json_in_state_space() -> None:
    env = Chat()
    env.reset(seed=3)
    state = env.state()
    assert env.state_space.contains(state)
    assert json.loads(state)["state"]["secret"] == env.s["secret"]


def test_constructor_rejects_unknown_render_mode() -> None:
    with pytest.raises(ConfigError):
        Chat(render_mode="rgb_array")
    assert Chat(render_mode=None).render() is None


def test_human_render_mode_prints_the_ansi_text(capsys: pytest.CaptureFixture[str]) -> None:
    human, ansi = Chat(render_mode="human"), Chat(render_mode="ansi")
    for env in (human, ansi):
        env.reset(seed=0)
    assert human.render() is None
    assert capsys.readouterr().out == ansi.render() + "\n"


@pytest.mark.parametrize(
    ("text", "to", "body"),
    [
        ("hello", None, "hello"),
        ("@a: hi", ["a"], "hi"),
        ("@a,b hi", ["a", "b"], "hi"),
        ("@all: hi", None, "hi"),
        ("@zed: hi", None, "@zed: hi"),
    ],
)
def test_split_address(text: str, to: list[str] | None, body: str) -> None:
    assert split_address(text, ["a", "b"]) == (to, body)
