"""Who acts: the :class:`Agent` interface, the LLM agent, scripted baselines.

Scripted baselines live in :mod:`parley.agents.scripted` (one module per scenario family)
and are named by each scenario's registry spec.
"""

from parley.agents.base import Agent
from parley.agents.llm import BusPoolClient, LLMAgent, LLMAgentConfig, PoolClient

__all__ = [
    # the interface
    "Agent",
    # agents driven by a model through the inference pool
    "LLMAgent",
    "LLMAgentConfig",
    "PoolClient",
    "BusPoolClient",
]
