"""What agents play: scenarios as PettingZoo parallel envs over text, and their registry.

    >>> from parley.scenarios import make
    >>> env = make("negotiation/deal-or-no-deal-v0")
    >>> observations, infos = env.reset(seed=0)

Scenario modules are imported only when :func:`make` builds one.
"""

from parley.scenarios.base import CHARSET, Event, Scenario, split_address
from parley.scenarios.registry import ScenarioSpec, make, register, registry, spec
from parley.scenarios.shaping import ShapedRewards, ShapingConfig, shape

__all__ = [
    # building scenarios
    "make",
    "spec",
    "register",
    "registry",
    "ScenarioSpec",
    # writing scenarios
    "Scenario",
    "CHARSET",
    "Event",
    "split_address",
    # reward shaping
    "ShapingConfig",
    "shape",
    "ShapedRewards",
]
