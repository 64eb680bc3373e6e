"""Refused moves use up the turn: the rule every scenario's v1 (or later) plays by.

A move the action space refuses (not a string, longer than ``max_action_length``,
characters outside the charset) is an invalid move in every version. In the first
versions it changed nothing else, so a seat that writes only such moves (an untrained
model emitting non-ASCII bytes) never used up its turns and its episode never ended. From
v1 on, the scenario plays it as the empty move ``""`` (invalid in every scenario, with its
usual consequence: a lost turn, a lost round, a failed answer), so the scenario's own
limits (``max_turns``, ``max_steps``, ``max_rounds``) bound every episode. The recorded
reason stays the refusal's.
"""

from __future__ import annotations

from typing import ClassVar

from parley.scenarios.base import Scenario

__all__ = ["RefusedMoveTakesTurn"]


class RefusedMoveTakesTurn(Scenario):
    """Mixin (put it first among the bases): a refused move is played as ``""``
    (:attr:`Scenario.refused_move_takes_turn`)."""

    refused_move_takes_turn: ClassVar[bool] = True
