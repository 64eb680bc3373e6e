"""Legal moves as text, shared by the adapters whose libraries list their legal moves
(OpenSpiel, PettingZoo): the strings a seat may answer, and the rule for anything else."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from parley.scenarios.charset import printable

__all__ = ["LegalMoves", "choose"]

MAX_SHOWN = 200
"""Legal moves listed in a prompt or a reason (the choice constraint has them all)."""


@dataclasses.dataclass(frozen=True, eq=False)
class LegalMoves:
    """One seat's legal moves now: the shown text of each, and text (lower case) -> id.

    Made by :meth:`of`, which returns the same object for the same texts and ids (a game's
    positions repeat their move lists), so one is shared between seats and episodes: it is
    never changed after it is made."""

    shown: tuple[str, ...]
    by_text: dict[str, int]
    listing: str
    """:meth:`listed`'s text."""

    @classmethod
    def of(cls, texts: Sequence[str], actions: Sequence[int]) -> LegalMoves:
        """The moves named ``texts`` (the library's names, made printable); a name that is
        empty, spans lines or is shared by several moves gets ``#ID`` after it, so every
        shown text names one move."""
        return _legal_moves(tuple(texts), tuple(actions))

    def listed(self) -> str:
        """The shown texts, comma-separated (at most :data:`MAX_SHOWN`)."""
        return self.listing

    def find(self, action: str) -> int | None:
        """The id of the move ``action`` names (spaces around it and letter case aside), or
        ``None``."""
        return self.by_text.get(action.strip().lower())


@functools.lru_cache(maxsize=4096)
def _legal_moves(texts: tuple[str, ...], actions: tuple[int, ...]) -> LegalMoves:
    clean = [printable(text).strip() for text in texts]
    counts: dict[str, int] = {}
    for text in clean:
        counts[text.lower()] = counts.get(text.lower(), 0) + 1
    shown = tuple(
        text if text and counts[text.lower()] == 1 and "\n" not in text else f"{text} #{a}"
        for text, a in zip(clean, actions, strict=True)
    )
    more = len(shown) - MAX_SHOWN
    listing = ", ".join(shown[:MAX_SHOWN]) + (f" (and {more} more)" if more > 0 else "")
    by_text = {text.lower(): int(a) for text, a in zip(shown, actions, strict=True)}
    return LegalMoves(shown, by_text, listing)


def choose(
    moves: LegalMoves, action: str, misses: int, tries: int, rng: np.random.Generator
) -> tuple[int | None, str | None, int]:
    """``(action id or None, invalid-move reason or None, misses after this move)``.

    A text naming a legal move (spaces around it and letter case aside) is that move.
    Anything else is invalid; the ``tries``-th invalid text in a row plays a legal move
    drawn from ``rng`` (so an episode always ends within the game's own length).
    """
    chosen = moves.find(action)
    if chosen is not None:
        return chosen, None, 0
    misses += 1
    reason = f"{action.strip()[:60]!r} is not a legal move; legal: {moves.listed()}"
    if misses < tries:
        return None, reason, misses
    picked = moves.shown[int(rng.integers(len(moves.shown)))]
    reason += f"; {tries} invalid in a row: played {picked!r}"
    return moves.by_text[picked.lower()], reason, 0
