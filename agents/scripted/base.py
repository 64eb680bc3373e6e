"""The common shape of scripted agents: a pure decision from the observation, seeded RNG."""

from __future__ import annotations

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

    # Class defaults: a subclass whose __init__ skips ours still gets a working generator.
    _rng: np.random.Generator | None = None
    _seed: int | None = None

    def __init__(self) -> None:
        self.new_episode()

    # Made on first use, from the last reset's seed (the same stream as one made at reset:
    # nothing drew in between), else from OS entropy. A generator costs ~20 us to make, per
    # agent and episode in a run; most scripted agents never draw.
    @property
    def rng(self) -> np.random.Generator:
        """The agent's generator: :meth:`reset` seeds it; until then, OS entropy."""
        rng = self._rng
        if rng is None:
            rng = self._rng = np.random.default_rng(self._seed)
        return rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value

    def reset(self, seed: int | None = None) -> None:
        if type(seed) is int and seed >= 0:  # seeded on first use
            self._rng, self._seed = None, seed
        else:  # None (fresh entropy) or numpy's other seed types, or their error, now
            self._rng = np.random.default_rng(seed)
        self.new_episode()

    def new_episode(self) -> None:
        """Forget per-episode memory."""

    @abstractmethod
    def decide(self, observation: Observation) -> str:
        """The action text for ``observation``."""

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text=self.decide(observation))
