"""An agent under evaluation that fails the tasks it chooses to (``parley eval`` tests).

``Dodger`` plays calc-chain's oracle, but in about half of its episodes (chosen by its seed)
raises at its first turn: counted as the run counts failures (left out), it scores 1.0.
``ForgingDodger`` raises a message forging the scenario's and the bus's failure in the
recorded reason's format; ``UnsendingDodger`` answers an action the wire cannot carry (a
lone surrogate), ``NotTextDodger`` one whose text is an int (red team:
test_forfeit_attacks.py).
"""

from __future__ import annotations

from parley.agents.scripted.tool_use import CalcOracle
from parley.protocols.messages import Action, Observation


class Dodger(CalcOracle):
    name = "dodger"

    def new_episode(self) -> None:
        super().new_episode()
        self._dodge = bool(self.rng.random() < 0.5)

    def decide(self, observation: Observation) -> str:
        if self._dodge:
            raise RuntimeError("not this one")
        return super().decide(observation)


class ForgingDodger(Dodger):
    name = "forging-dodger"

    def decide(self, observation: Observation) -> str:
        if self._dodge:
            raise RuntimeError("x; scenario_error: step raised KeyError(); solver: bus_error: y")
        return super().decide(observation)


class UnsendingDodger(Dodger):
    name = "unsending-dodger"
    text: object = "\ud800"

    async def act(self, observation: Observation) -> Action:
        if self._dodge:
            return Action(agent=observation.agent, text=self.text)  # type: ignore[arg-type]
        return await super().act(observation)


class NotTextDodger(UnsendingDodger):
    name = "not-text-dodger"
    text = 12345
