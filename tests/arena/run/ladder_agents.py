"""Tic-tac-toe agents of graded strength (openspiel:tic_tac_toe) for the tournament tests.

``Perfect`` plays a minimax move; ``Half`` plays it with probability 1/2 and a random legal
move otherwise; ``Random`` plays random legal moves. Each reads the board from the first
three lines of its observation and its moves from ``info["view"]["legal"]``.

Sore losers play random legal moves until their position is lost (the opponent can force a
win), then fail the game instead of losing it: ``SoreLoser`` raises, with a message that
blames the other seat in the failure reason's own format; ``Staller`` never answers.
"""

from __future__ import annotations

import asyncio
import functools

from parley.agents.scripted.base import ScriptedAgent
from parley.agents.scripted.imported import legal_moves
from parley.protocols.messages import Action, Observation

_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def _winner(board: str) -> str:
    for a, b, c in _LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return ""


@functools.cache
def _value(board: str, me: str) -> int:
    """+1 when ``me`` (to move) wins with best play, 0 draw, -1 loss."""
    other = "o" if me == "x" else "x"
    if _winner(board):
        return -1  # the previous mover (other) won
    empty = [k for k, c in enumerate(board) if c == "."]
    if not empty:
        return 0
    return max(-_value(board[:k] + me + board[k + 1 :], other) for k in empty)


def _position(observation: Observation) -> tuple[str, str]:
    """The board (9 characters) and the mover's mark."""
    return "".join(observation.text.split("\n")[:3]), legal_moves(observation)[0][0]


def best_move(observation: Observation) -> str:
    legal = legal_moves(observation)
    board, me = _position(observation)
    other = "o" if me == "x" else "x"

    def score(move: str) -> int:
        row, col = int(move[2]), int(move[4])
        k = 3 * row + col
        return -_value(board[:k] + me + board[k + 1 :], other)

    return max(legal, key=score)


class Perfect(ScriptedAgent):
    name = "perfect"

    def decide(self, observation: Observation) -> str:
        return best_move(observation) if legal_moves(observation) else ""


class Half(ScriptedAgent):
    name = "half"

    def decide(self, observation: Observation) -> str:
        legal = legal_moves(observation)
        if not legal:
            return ""
        if self.rng.random() < 0.5:
            return best_move(observation)
        return legal[int(self.rng.integers(len(legal)))]


class Random(ScriptedAgent):
    name = "random"

    def decide(self, observation: Observation) -> str:
        legal = legal_moves(observation)
        return legal[int(self.rng.integers(len(legal)))] if legal else ""


def _lost(observation: Observation) -> bool:
    return bool(legal_moves(observation)) and _value(*_position(observation)) < 0


class SoreLoser(Random):
    name = "sore-loser"

    def decide(self, observation: Observation) -> str:
        if _lost(observation):
            raise RuntimeError("resigns; player_0: agent_error: x; player_1: timeout: y")
        return super().decide(observation)


class Staller(Random):
    name = "staller"

    async def act(self, observation: Observation) -> Action:
        if _lost(observation):
            await asyncio.sleep(3600)
        return await super().act(observation)
