"""Scripted baselines for games of outside libraries (:mod:`parley.scenarios.imported`).

They read the seat's legal moves from ``info["view"]["legal"]`` (or the ``choice``
constraint), the form every adapter gives, so one agent plays every imported game.
"""

from __future__ import annotations

from typing import Any

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.messages import Observation

__all__ = ["FirstLegal", "RandomLegal", "legal_moves"]


def legal_moves(observation: Observation) -> list[str]:
    """The seat's legal moves now: the view's ``legal`` list, else the choice constraint's."""
    info: dict[str, Any] = observation.info or {}
    view = info.get("view") or {}
    legal = view.get("legal") if isinstance(view, dict) else None
    if not legal:
        constraint = info.get("constraint") or {}
        legal = constraint.get("choices") if constraint.get("type") == "choice" else None
    return [str(move) for move in legal or []]


class RandomLegal(ScriptedAgent):
    """Plays a legal move drawn uniformly from its seeded generator ("" when none is given,
    which the scenario records as an invalid move)."""

    name = "random-legal"

    def decide(self, observation: Observation) -> str:
        legal = legal_moves(observation)
        return legal[int(self.rng.integers(len(legal)))] if legal else ""


class FirstLegal(ScriptedAgent):
    """Plays the first legal move listed (deterministic; a weak, predictable opponent)."""

    name = "first-legal"

    def decide(self, observation: Observation) -> str:
        legal = legal_moves(observation)
        return legal[0] if legal else ""
