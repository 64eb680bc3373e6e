"""What agents play: scenarios as PettingZoo parallel envs over text, and their registry.

    >>> from parley.scenarios import make
    >>> env = make("negotiation/deal-or-no-deal-v0")
    >>> observations, infos = env.reset(seed=0)

Scenario modules are imported only when :func:`make` builds one.
"""

from typing import TYPE_CHECKING

from parley.protocols.lazy import lazy_exports

# Eager: the registry is light, and ``registry`` (the function) must win over the submodule
# of the same name.
from parley.scenarios.registry import ScenarioSpec, make, register, registry, spec

if TYPE_CHECKING:
    from parley.scenarios.base import CHARSET, Event, Scenario, split_address
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

_WHERE: dict[str, str] = {
    "CHARSET": "parley.scenarios.base",
    "Event": "parley.scenarios.base",
    "Scenario": "parley.scenarios.base",
    "split_address": "parley.scenarios.base",
    "ShapedRewards": "parley.scenarios.shaping",
    "ShapingConfig": "parley.scenarios.shaping",
    "shape": "parley.scenarios.shaping",
}
"""Public name -> module; imported on first use (PEP 562), so importing this package (for
``parley --help``, ``parley list``) costs nothing until a name is used."""

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, __all__)
