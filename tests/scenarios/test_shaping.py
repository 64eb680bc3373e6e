"""Reward shaping: sum of w_c * r_c and alpha * team + individual, per agent."""

from __future__ import annotations

import math

import pytest

from parley.protocols.errors import ConfigError
from parley.scenarios import ShapedRewards, ShapingConfig, make, shape
from parley.scenarios.shaping import load_shaping

COMPONENTS = {"a": {"task": 1.0, "invalid": -0.5}, "b": {"task": 0.0, "message_cost": -0.1}}


def test_default_config_is_the_plain_sum() -> None:
    assert shape(COMPONENTS, ShapingConfig()) == pytest.approx({"a": 0.5, "b": -0.1})


def test_component_weights() -> None:
    cfg = ShapingConfig(weights={"invalid": 2.0}, default_weight=0.0)
    assert shape(COMPONENTS, cfg) == pytest.approx({"a": -1.0, "b": 0.0})


def test_team_and_individual_terms_per_agent() -> None:
    configs = {"a": ShapingConfig(alpha=1.0, individual=0.0), "b": ShapingConfig(alpha=0.5)}
    shaped = shape(COMPONENTS, configs)
    team = (0.5 + -0.1) / 2
    assert shaped["a"] == pytest.approx(team)
    assert shaped["b"] == pytest.approx(0.5 * team - 0.1)


def test_config_validation_and_loading() -> None:
    with pytest.raises(ConfigError):
        ShapingConfig(alpha=math.nan)
    with pytest.raises(ConfigError, match="known"):
        ShapingConfig.from_dict({"alpah": 1.0})
    loaded = load_shaping({"*": {"alpha": 0.5, "weights": {"task": 2.0}}})
    assert loaded["*"].weigh({"task": 1.0, "x": 1.0}) == 3.0


def test_wrapper_rewards_equal_shape_of_infos() -> None:
    env = ShapedRewards(
        make("collaboration/hidden-profile-v0", n_agents=2, message_cost=0.1),
        {"*": ShapingConfig(weights={"message_cost": 0.0})},
    )
    env.reset(seed=0)
    _, rewards, _, _, infos = env.step({"agent_0": "hello", "agent_1": "pass"})
    assert infos["agent_0"]["components"] == {"message_cost": -0.1}
    assert rewards == {"agent_0": 0.0, "agent_1": 0.0}
