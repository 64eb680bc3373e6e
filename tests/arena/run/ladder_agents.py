"""Tic-tac-toe agents of graded strength (openspiel:tic_tac_toe) for the tournament tests.

``Perfect`` plays a minimax move; ``Half`` plays it with probability 1/2 and a random legal
move otherwise; ``Random`` plays random legal moves. Each reads the board from the first
three lines of its observation and its moves from ``info["view"]["legal"]``.

Sore losers play random legal moves until their position is lost (the opponent can force a
win), then fail the game instead of losing it: ``SoreLoser`` raises, with a message that
blames the other seat in the failure reason's own format; ``Staller`` never answers.

Red-team sore losers (tests/arena/run/test_forfeit_attacks.py) fail a lost game in other
ways, hoping it is counted as the scenario's, the bus's or both agents' failure:
``Stubborn`` answers invalid moves; ``Forger`` raises with newlines, tabs and separators
that name the other seat;
``Unsendable`` answers an action the wire cannot carry (a lone surrogate, a ``str``
subclass, tokens of no protocol type, as ``UNSENDABLE`` picks); ``NotText`` answers an
``Action`` whose text is an int; ``Unprintable`` raises an exception whose ``str`` raises;
``SelfCancel`` raises ``CancelledError`` from ``act``. ``LoopBlocker`` (any game) blocks the
arena's thread once the other seat of a simultaneous move is asked, and ``SlowHonest``
takes 0.3 s over several awaits (an LLM streaming its answer).

For leagues of several games (tests/load/test_busy_tournament.py), ``PerfectAnyGame`` and
``HalfAnyGame`` play as ``Perfect`` and ``Half`` on tic-tac-toe and the first legal move in
any other game (``Perfect`` reads a tic-tac-toe board whatever the game, and fails there).
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import threading
import time

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


class Forger(Random):
    name = "forger"

    def decide(self, observation: Observation) -> str:
        if _lost(observation):
            raise RuntimeError(
                "x\nplayer_0: agent_error: y;\tplayer_1;\r\nplayer_0: timeout: z;"
                "  player_0: timeout: q; player_0: agent_error: w"
            )
        return super().decide(observation)


class Stubborn(Random):
    name = "stubborn"

    def decide(self, observation: Observation) -> str:
        return "resign? never" if _lost(observation) else super().decide(observation)


class _Evil(str):
    """A text whose every use the scenario might make raises."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __hash__(self) -> int:
        raise RuntimeError("hash")

    def strip(self, chars: str | None = None) -> str:
        raise RuntimeError("strip")


UNSENDABLE = {
    "surrogate": lambda seat: Action(agent=seat, text="\ud800"),
    "str-subclass": lambda seat: Action(agent=seat, text=_Evil("x(0,0)")),
    "tokens": lambda seat: Action(agent=seat, text="x(0,0)", tokens=[object()]),  # type: ignore[list-item]
}


class Unsendable(Random):
    name = "unsendable"
    kind = "surrogate"

    async def act(self, observation: Observation) -> Action:
        if _lost(observation):
            return UNSENDABLE[self.kind](observation.agent)
        return await super().act(observation)


class UnsendableStr(Unsendable):
    kind = "str-subclass"


class UnsendableTokens(Unsendable):
    kind = "tokens"


class NotText(Random):
    name = "not-text"

    async def act(self, observation: Observation) -> Action:
        if _lost(observation):
            return Action(agent=observation.agent, text=12345)  # type: ignore[arg-type]
        return await super().act(observation)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Unprintable(Random):
    name = "unprintable"

    def decide(self, observation: Observation) -> str:
        if _lost(observation):
            raise _Unprintable
        return super().decide(observation)


class SelfCancel(Random):
    name = "self-cancel"

    async def act(self, observation: Observation) -> Action:
        if _lost(observation):
            raise asyncio.CancelledError
        return await super().act(observation)


class SlowHonest(Random):
    name = "slow-honest"

    async def act(self, observation: Observation) -> Action:
        for _ in range(6):
            await asyncio.sleep(0.05)
        return await super().act(observation)


class LoopBlocker(Random):
    name = "loop-blocker"
    block_s = 1.5

    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(0)  # the other seat is asked meanwhile
        time.sleep(self.block_s)  # noqa: ASYNC251 -- the attack: the arena's thread stops
        return await super().act(observation)


class PausesArena(Random):
    """Honest and quick, but each of its acts stops the arena's process (``ARENA_PID``) for
    ``PAUSE_S`` seconds, as a loaded host would, its reply sent at once (test machinery for
    a paused arena, not an attack: the reply sits in the arena's socket meanwhile)."""

    name = "pauses-arena"

    async def act(self, observation: Observation) -> Action:
        pid, pause = int(os.environ["ARENA_PID"]), float(os.environ.get("PAUSE_S", "3"))
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(pause, os.kill, (pid, signal.SIGCONT)).start()
        return await super().act(observation)


class LoopBlockerResigns(LoopBlocker):
    """:class:`LoopBlocker`, then raises: both seats failed, it hopes (not scored)."""

    name = "loop-blocker-resigns"

    def decide(self, observation: Observation) -> str:
        raise RuntimeError("resigns")


_CELL = re.compile(r"[xo]\(\d,\d\)")


def _first_unless_tic_tac_toe(observation: Observation) -> str | None:
    """The first legal move in a game other than tic-tac-toe ("" when none); None in
    tic-tac-toe (its moves are cells such as ``x(0,2)``)."""
    legal = legal_moves(observation)
    if legal and _CELL.fullmatch(legal[0]):
        return None
    return legal[0] if legal else ""


class PerfectAnyGame(Perfect):
    name = "perfect-any-game"

    def decide(self, observation: Observation) -> str:
        first = _first_unless_tic_tac_toe(observation)
        return super().decide(observation) if first is None else first


class HalfAnyGame(Half):
    name = "half-any-game"

    def decide(self, observation: Observation) -> str:
        first = _first_unless_tic_tac_toe(observation)
        return super().decide(observation) if first is None else first
