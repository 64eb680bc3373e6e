"""The common shape of scripted agents: a pure decision from the observation, seeded RNG."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation
from parley.scenarios.helpers import LazyRng

__all__ = ["ScriptedAgent"]


class ScriptedAgent(LazyRng, Agent):
    """An agent whose move is a synchronous function of its observation.

    Subclasses override :meth:`decide` (and :meth:`new_episode` for per-episode memory).
    All randomness comes from ``self.rng``, seeded by :meth:`reset`.
    """

    name = "scripted"
    privileged: ClassVar[bool] = False
    """True for oracles that read the scenario's privileged data (``info["oracle"]``, see
    :meth:`parley.scenarios.base.Scenario.oracle`). The runner adds it to the observations
    of in-process agents of such classes only; a remote agent never receives it."""

    def __init__(self) -> None:
        self.new_episode()

    def reset(self, seed: int | None = None) -> None:
        self.seed_rng(seed)  # (made on first use: most scripted agents never draw)
        self.new_episode()

    def new_episode(self) -> None:
        """Forget per-episode memory."""

    @abstractmethod
    def decide(self, observation: Observation) -> str:
        """The action text for ``observation``."""

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text=self.decide(observation))
