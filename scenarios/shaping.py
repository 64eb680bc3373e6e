"""Per-agent reward shaping from per-component rewards.

Scenarios report each step's rewards per agent and per component in
``infos[agent]["components"]``. Shaping re-weighs them, per agent, from config:

* individual reward of agent *i*:  ``ind_i = Σ_c w_c · r_{i,c}``  (weights of *i*'s config,
  ``default_weight`` for components the config does not name);
* team reward seen by *i*:  ``team_i = mean_j Σ_c w_c · r_{j,c}``  (*i*'s weights applied to
  every live agent's components — the team as *i* values it);
* shaped reward:  ``r_i = alpha · team_i + individual · ind_i``.

``alpha=0, individual=1`` (the default) with all weights 1 is the scenario's own reward.
:func:`shape` is the pure function; :class:`ShapedRewards` applies it inside a PettingZoo
wrapper so any consumer of the parallel API sees the shaped rewards.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from pettingzoo.utils.wrappers import BaseParallelWrapper

from parley.protocols.errors import ConfigError

__all__ = ["ShapingConfig", "shape", "ShapedRewards", "load_shaping"]


@dataclasses.dataclass(frozen=True)
class ShapingConfig:
    """How one agent's reward is computed from everyone's reward components."""

    weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Weight ``w_c`` per component name (e.g. ``{"task": 1.0, "invalid": 0.5}``)."""
    default_weight: float = 1.0
    """Weight of a component that ``weights`` does not name."""
    alpha: float = 0.0
    """Weight of the team term (mean over agents of their weighted rewards)."""
    individual: float = 1.0
    """Weight of the agent's own weighted reward."""

    def __post_init__(self) -> None:
        numbers = {"default_weight": self.default_weight, "alpha": self.alpha}
        numbers["individual"] = self.individual
        numbers.update({f"weights[{k!r}]": v for k, v in self.weights.items()})
        for name, value in numbers.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"shaping {name} must be a finite number, got {value!r}")
        object.__setattr__(self, "weights", dict(self.weights))

    def weigh(self, components: Mapping[str, float]) -> float:
        """``Σ_c w_c · r_c`` for one agent's components."""
        return sum(self.weights.get(c, self.default_weight) * r for c, r in components.items())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShapingConfig:
        """Build from YAML-style data; unknown keys are an error that names the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown shaping keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


def shape(
    components: Mapping[str, Mapping[str, float]],
    config: ShapingConfig | Mapping[str, ShapingConfig],
) -> dict[str, float]:
    """Shaped reward per agent from ``components[agent][component]`` (see the module doc).

    ``config`` is one config for every agent or one per agent (an agent missing from the
    mapping gets the default :class:`ShapingConfig`).
    """
    if not components:
        return {}
    shaped: dict[str, float] = {}
    for agent in components:
        cfg = config if isinstance(config, ShapingConfig) else config.get(agent, ShapingConfig())
        own = cfg.weigh(components[agent])
        team = sum(cfg.weigh(c) for c in components.values()) / len(components)
        shaped[agent] = cfg.alpha * team + cfg.individual * own
    return shaped


def load_shaping(data: Mapping[str, Mapping[str, Any]]) -> dict[str, ShapingConfig]:
    """Per-agent configs from ``{agent: {...}}``; the key ``"*"`` applies to unnamed agents."""
    return {agent: ShapingConfig.from_dict(cfg) for agent, cfg in data.items()}


class ShapedRewards(BaseParallelWrapper):  # type: ignore[misc]
    """A PettingZoo parallel wrapper whose rewards are :func:`shape` of the components."""

    def __init__(self, env: Any, config: ShapingConfig | Mapping[str, ShapingConfig]) -> None:
        super().__init__(env)
        if isinstance(config, Mapping) and "*" in config:
            fallback = config["*"]
            config = {a: config.get(a, fallback) for a in env.possible_agents}
        self.config = config

    def step(self, actions: dict[str, Any]) -> tuple[Any, ...]:
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        components = {a: infos[a].get("components", {}) for a in rewards}
        return observations, shape(components, self.config), terminations, truncations, infos
