"""A hostile agent for the viewer's tests: its messages are markup that must stay text."""

from __future__ import annotations

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation

PAYLOAD = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


class MarkupAgent(Agent):
    """Says the XSS payload, then gives up (``<selection>`` then no agreement)."""

    def reset(self, seed: int | None = None) -> None:
        self.turns = 0

    async def act(self, observation: Observation) -> Action:
        self.turns += 1
        view = observation.info.get("view", {})
        if view.get("phase") == "choose":
            return Action(agent=observation.agent, text="no agreement")
        if self.turns > 2:
            return Action(agent=observation.agent, text="<selection>")
        return Action(agent=observation.agent, text=PAYLOAD)
