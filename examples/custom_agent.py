"""A custom parley agent in plain Python: it accepts the partner's first proposal.

Plays either seat of ``negotiation/deal-or-no-deal-v3`` (and every earlier version). In
the talk phase it asks for a proposal, and as soon as the partner has made one it ends the
talk with ``<selection>``; in the choose phase it claims what the partner's proposal leaves
it.

In the arena's process (``examples/`` on the import path)::

    PYTHONPATH=examples parley run negotiation/deal-or-no-deal-v3 \\
        --agents custom_agent:Accommodating,scripted --episodes 20

From another process (or host), joining a running arena::

    parley run negotiation/deal-or-no-deal-v3 --agents remote,scripted \\
        --listen tcp://127.0.0.1:5555 --episodes 20
    PYTHONPATH=examples parley agent --connect tcp://127.0.0.1:5555 \\
        --seat player_0 --agent custom_agent:Accommodating
"""

from __future__ import annotations

import re
from typing import Any

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation

PROPOSAL = re.compile(r"book=(\d+) hat=(\d+) ball=(\d+)")


class Accommodating(Agent):
    """Takes whatever the partner's last proposal leaves it."""

    name = "accommodating"

    def reset(self, seed: int | None = None) -> None:
        # One instance plays one episode; reset runs before its first observation.
        self.partner_takes: list[int] | None = None

    async def act(self, observation: Observation) -> Action:
        # ``info["view"]`` is the scenario's structured view of this seat (see its docs);
        # ``observation.text`` is the same information as prose, for language models.
        view: dict[str, Any] = observation.info.get("view", {})
        match = PROPOSAL.search(view.get("last_message", ""))
        if match is not None:
            self.partner_takes = [int(n) for n in match.groups()]
        if view.get("phase") == "choose":
            text = self.claim(view.get("counts", [0, 0, 0]))
        elif self.partner_takes is not None:
            text = "<selection>"
        else:
            text = "What would you like? Propose it as: book=N hat=N ball=N"
        return Action(agent=observation.agent, text=text)

    def claim(self, counts: list[int]) -> str:
        if self.partner_takes is None:
            return "no agreement"
        mine = [c - t for c, t in zip(counts, self.partner_takes, strict=True)]
        if min(mine) < 0:
            return "no agreement"
        return "book={} hat={} ball={} / book={} hat={} ball={}".format(*mine, *self.partner_takes)
