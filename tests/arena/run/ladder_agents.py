"""Tic-tac-toe agents of graded strength (openspiel:tic_tac_toe) for the tournament tests.

``Perfect`` plays a minimax move; ``Half`` plays it with probability 1/2 and a random legal
move otherwise; ``Random`` plays random legal moves. Each reads the board from the first
three lines of its observation and its moves from ``info["view"]["legal"]``.
"""

from __future__ import annotations

import functools

from parley.agents.scripted.base import ScriptedAgent
from parley.agents.scripted.imported import legal_moves
from parley.protocols.messages import Observation

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


def best_move(observation: Observation) -> str:
    legal = legal_moves(observation)
    board = "".join(observation.text.split("\n")[:3])
    me = legal[0][0]
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
