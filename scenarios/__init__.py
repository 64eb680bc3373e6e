"""What agents play: scenarios as PettingZoo parallel envs over text, and their registry.

    >>> from parley.scenarios import make
    >>> env = make("negotiation/deal-or-no-deal-v0")
    >>> observations, infos = env.reset(seed=0)

An author subclasses :class:`Scenario` once per version (``MyGameV0``), declares its spec
beside it with :func:`registered`, and runs :func:`check_scenario` over its id. Everything
else (rule helpers, tools, the sandbox) is imported by its module path.

Scenario modules are imported only when :func:`make` builds one.
"""

from typing import TYPE_CHECKING

from parley.protocols.errors import ConfigError
from parley.protocols.lazy import lazy_exports

# Eager: the registry is light, and ``registry`` (the function) must win over the submodule
# of the same name.
from parley.scenarios.registry import (
    ScenarioSpec,
    make,
    register,
    registered,
    registry,
    spec,
    spec_of,
)

if TYPE_CHECKING:
    from parley.scenarios.base import CHARSET, Event, Scenario, split_address
    from parley.scenarios.conformance import check_scenario
    from parley.scenarios.shaping import ShapedRewards, ShapingConfig, shape

__all__ = [
    # building scenarios
    "make",
    "spec",
    "register",
    "registry",
    "ScenarioSpec",
    "ConfigError",
    # writing scenarios
    "Scenario",
    "registered",
    "spec_of",
    "check_scenario",
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
    "check_scenario": "parley.scenarios.conformance",
    "ShapedRewards": "parley.scenarios.shaping",
    "ShapingConfig": "parley.scenarios.shaping",
    "shape": "parley.scenarios.shaping",
}
"""Public name -> module; imported on first use (PEP 562), so importing this package (for
``parley --help``, ``parley list``) costs nothing until a name is used."""

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, __all__)
