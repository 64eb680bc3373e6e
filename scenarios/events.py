"""What passes between seats: the event log's entries and ``@seat:`` message addresses.

Scenarios record every message, notice and invalid move of an episode as an
:class:`Event`; :func:`split_address` reads the address a message may start with (the
private channel). Both are re-exported by :mod:`parley.scenarios.base`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["Event", "split_address"]

_ADDRESS = re.compile(r"^\s*@([A-Za-z0-9_,]+)\s*:?\s*", re.DOTALL)


# A named tuple: scenarios record one per message, in every step.
class Event(NamedTuple):
    """One line of the episode's record: a message, a notice, or an invalid move.

    ``to`` is empty for events everyone sees; otherwise the recipients (private channel).
    """

    turn: int
    kind: str
    sender: str
    text: str
    to: tuple[str, ...] = ()


def split_address(text: str, seats: Sequence[str]) -> tuple[list[str] | None, str]:
    """Split a leading ``@seat:`` / ``@seat1,seat2`` address off a message.

    Returns ``(recipients, body)``; ``recipients`` is ``None`` for a public message (no
    address, or ``@all``). An address naming an unknown seat is not an address: the whole text
    is a public message (a scenario that wants stricter rules checks the names itself).
    """
    match = _ADDRESS.match(text)
    if match is None:
        return None, text.strip()
    names = [name for name in match.group(1).split(",") if name]
    if names == ["all"]:
        return None, text[match.end() :].strip()
    if not names or any(name not in seats for name in names):
        return None, text.strip()
    return names, text[match.end() :].strip()
