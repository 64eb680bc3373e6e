"""The text of observations and actions: printable ASCII plus newline, and escaping into it.

Observations must lie in their ``Text`` space whatever an agent smuggles in (JSON ``\\u``
escapes decode to NUL, ESC, non-ASCII, lone surrogates): :func:`printable` escapes every
character outside :data:`CHARSET`, visibly and reversibly (``\\x1b``, ``\\u00e9``).
"""

from __future__ import annotations

import re

__all__ = ["CHARSET", "OUTSIDE_CHARSET", "printable"]

CHARSET: str = "".join(chr(code) for code in range(32, 127)) + "\n"
"""Characters of every observation and action: printable ASCII plus newline."""

OUTSIDE_CHARSET = re.compile(r"[^\x20-\x7e\n]")
"""Matches one character outside :data:`CHARSET`."""


def printable(text: str) -> str:
    """``text`` with every character outside :data:`CHARSET` escaped (``\\x1b``, ``\\u00e9``);
    text already inside the charset is returned as it is."""
    # The common case, text inside the charset, is decided at C speed. Up to _SHORT
    # characters: ASCII printable but for newlines is the charset (a call 120 ns for 34
    # characters against 175 for the bytes check below, whose two copies cost more than the
    # scans; even at ~95); beyond, deleting the charset's bytes leaves none (0.3-0.4 µs for 400-850
    # characters with lines, against 0.6-1.6 for isprintable on a copy with spaces for them;
    # 1.2-1.6 for the regex scan).
    if len(text) <= _SHORT:
        if text.isascii() and text.replace("\n", " ").isprintable():
            return text
    elif text.isascii() and not text.encode("ascii").translate(None, _INSIDE):
        return text
    return OUTSIDE_CHARSET.sub(_escape, text)


_SHORT = 96
"""The longest text :func:`printable` checks with ``str.isprintable`` (the bytes check wins
beyond; ``Scenario.tell`` uses the same bound)."""

_INSIDE = CHARSET.encode("ascii")
"""The bytes of :data:`CHARSET`, for ``bytes.translate`` to delete."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
