"""An agent under evaluation that fails the tasks it chooses to (``parley eval`` tests).

``Dodger`` plays calc-chain's oracle, but in about half of its episodes (chosen by its seed)
raises at its first turn: counted as the run counts failures (left out), it scores 1.0.
"""

from __future__ import annotations

from parley.agents.scripted.tool_use import CalcOracle
from parley.protocols.messages import Observation


class Dodger(CalcOracle):
    name = "dodger"

    def new_episode(self) -> None:
        super().new_episode()
        self._dodge = bool(self.rng.random() < 0.5)

    def decide(self, observation: Observation) -> str:
        if self._dodge:
            raise RuntimeError("not this one")
        return super().decide(observation)
