"""What the built-in text scenarios declare alike, written once.

Every version class of the negotiation, collaboration and tool-use games declares the same
``metadata`` but for its id, a version that only turns ``quote_messages`` on describes itself
in the same words, and the games with a ``max_turns`` argument check it alike. These helpers
return exactly what those classes wrote out before (``catalog.json`` is unchanged, and
tests/scenarios/*/test_golden_transcripts.py pins every version's transcripts); the rules of
each game stay in its own file.
"""

from __future__ import annotations

from typing import Any

from parley.protocols.errors import ConfigError

__all__ = ["text_metadata", "quoted_description", "turn_limit"]


def text_metadata(name: str) -> dict[str, Any]:
    """The ``metadata`` of a text scenario class whose registry id is ``name``.

    A new dict each call: a class may extend its own without touching another's.
    """
    return {"name": name, "render_modes": ["ansi", "human"], "is_parallelizable": True}


def quoted_description(base: type) -> str:
    """The registered description of a version that is ``base`` with ``quote_messages`` on."""
    return f"{base.metadata['name']} with quote_messages on: a message cannot forge a line."  # type: ignore[attr-defined]


def turn_limit(max_turns: int) -> int:
    """``max_turns`` itself, checked: a :class:`ConfigError` below 1."""
    if max_turns < 1:
        raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
    return max_turns
