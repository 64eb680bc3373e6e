"""referential-v0: the scripted code is perfect; a blind listener is at chance."""

from __future__ import annotations

import numpy as np
import pytest

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Observation
from parley.scenarios import make
from parley.scenarios.conformance import baseline_agents, play_episode

ID = "collaboration/referential-v0"


class Guesser(ScriptedAgent):  # type: ignore[misc]
    def decide(self, observation: Observation) -> str:
        choices = observation.info["constraint"]["choices"]
        return str(choices[int(self.rng.integers(len(choices)))])


def _success(agents_fn, episodes: int, **kwargs) -> float:  # type: ignore[no-untyped-def]
    wins = []
    for seed in range(episodes):
        env = make(ID, **kwargs)
        play_episode(ID, seed=seed, env=env, agents=agents_fn())
        wins.append(env.episode_metrics()["success"])
    return float(np.mean(wins))


@pytest.mark.parametrize("k", [2, 4])
def test_scripted_code_always_succeeds(k: int) -> None:
    assert _success(lambda: None, 100, n_candidates=k) == 1.0


@pytest.mark.parametrize("k", [2, 4])
def test_guessing_listener_is_near_chance(k: int) -> None:
    def agents() -> dict[str, object]:
        return {**baseline_agents(ID, ["speaker"]), "listener": Guesser()}

    assert abs(_success(agents, 300, n_candidates=k) - 1 / k) < 0.1


def test_observations_constraints_and_invalid_message() -> None:
    env = make(ID, n_candidates=3)
    obs, infos = env.reset(seed=0)
    assert obs["speaker"].startswith("Target: ")
    assert infos["speaker"]["to_act"]
    assert len(infos["speaker"]["constraint"]["choices"]) == 64
    obs, _, _, _, infos = env.step({"speaker": "zz!", "listener": ""})
    assert "invalid" in infos["speaker"]
    assert obs["listener"].startswith("Message: -\n1 ")
    assert infos["listener"]["constraint"] == {"type": "choice", "choices": ["1", "2", "3"]}
    _, rewards, terms, _, infos = env.step({"speaker": "", "listener": "7"})
    assert "invalid" in infos["listener"]
    assert all(terms.values())
    assert rewards == {"speaker": 0.0, "listener": 0.0}


def test_large_message_spaces_use_a_regex_constraint() -> None:
    env = make(ID, vocab_size=26, message_length=3)
    _, infos = env.reset(seed=0)
    assert infos["speaker"]["constraint"] == {
        "type": "regex",
        "pattern": "[abcdefghijklmnopqrstuvwxyz]{3}",
    }


@pytest.mark.parametrize("k", [2, 4])
def test_name_answers_scripted_code_succeeds_and_guessing_is_chance(k: int) -> None:
    kwargs = {"n_candidates": k, "answer": "name"}
    assert _success(lambda: None, 100, **kwargs) == 1.0

    def agents() -> dict[str, object]:
        return {**baseline_agents(ID, ["speaker"]), "listener": Guesser()}

    assert abs(_success(agents, 300, **kwargs) - 1 / k) < 0.1


def test_name_answers_observation_constraint_and_invalid_pick() -> None:
    env = make(ID, n_candidates=3, n_attributes=1, answer="name")
    env.reset(seed=0)
    obs, _, _, _, infos = env.step({"speaker": "ab", "listener": ""})
    names = infos["listener"]["constraint"]["choices"]
    assert obs["listener"] == f"Message: ab\nCandidates: {', '.join(names)}\nPick one:"
    assert infos["listener"]["view"]["answer"] == "name"
    assert len(set(names)) == 3
    _, rewards, _, _, infos = env.step({"speaker": "", "listener": "1"})
    assert "invalid" in infos["listener"]  # a number is no name
    assert rewards == {"speaker": 0.0, "listener": 0.0}


def test_unknown_answer_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="answer"):
        make(ID, answer="letter")


def test_show_others_false_hides_the_distractors_from_the_speaker() -> None:
    env = make(ID, n_candidates=4, n_attributes=1, answer="name", show_others=False)
    obs, infos = env.reset(seed=0)
    assert obs["speaker"].startswith("Target: ")
    assert "Others" not in obs["speaker"]
    assert len(infos["speaker"]["view"]["others"]) == 3  # scripted agents still know them
    assert _success(lambda: None, 50, n_candidates=4, answer="name", show_others=False) == 1.0
