"""The common shape of scripted agents: a pure decision from the observation, seeded RNG."""

from __future__ import annotations

import functools
from abc import abstractmethod
from typing import ClassVar

import numpy as np

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation

__all__ = ["ScriptedAgent"]


class ScriptedAgent(Agent):
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

    # Made on first use: unseeded, a generator draws OS entropy (~17 us, per agent and
    # episode in a run), and :meth:`reset` replaces it before the first move anyway.
    @functools.cached_property
    def rng(self) -> np.random.Generator:
        """The agent's generator: :meth:`reset` seeds it; until then, OS entropy."""
        return np.random.default_rng()

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.new_episode()

    def new_episode(self) -> None:
        """Forget per-episode memory."""

    @abstractmethod
    def decide(self, observation: Observation) -> str:
        """The action text for ``observation``."""

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text=self.decide(observation))
