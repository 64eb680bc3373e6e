"""The one interface every agent implements.

A scripted bot, an LLM agent, an agent in another process and a human at the terminal are
interchangeable in any seat: the runner only ever calls :meth:`Agent.reset` and
:meth:`Agent.act`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from parley.protocols.messages import Action, Observation

__all__ = ["Agent"]


class Agent(ABC):
    """A player of one seat of a scenario.

    Override :meth:`act` (and :meth:`reset` if the agent keeps per-episode state). An agent
    instance plays one episode at a time; the runner creates one instance per seat per
    concurrent episode.
    """

    name: str = "agent"

    def reset(self, seed: int | None = None) -> None:
        """Forget the previous episode; ``seed`` drives any randomness of the next one."""

    @abstractmethod
    async def act(self, observation: Observation) -> Action:
        """Return this agent's action for ``observation``.

        Must not raise on odd observations: an agent that cannot decide returns an action
        anyway (the scenario records an invalid move). Exceptions are treated as the agent
        failing, and end the episode as failed.
        """

    async def close(self) -> None:
        """Release what the agent holds (connections, processes). Idempotent."""
