"""The ``difficulty`` argument of scenarios with generated tasks (issue 32 s6).

A scenario whose tasks can be generated takes ``difficulty``: None (its default) plays its
fixed task set as it always did; an integer from 0 to the scenario's maximum draws a new
task from every seed, harder as the integer grows (calc-chain, retail-desk-v3,
code/debug-v3). Such a scenario reports the level in its metrics under ``difficulty``, so
that ``parley train``'s curriculum (:mod:`parley.arena.training.curriculum`) counts each
finished episode for the level it was played at.
"""

from __future__ import annotations

from parley.protocols.errors import ConfigError

__all__ = ["check_difficulty"]


def check_difficulty(difficulty: int | None, maximum: int) -> None:
    """Raise ``ValueError`` unless ``difficulty`` is None or an integer in 0..``maximum``."""
    if difficulty is None:
        return
    if isinstance(difficulty, bool) or not isinstance(difficulty, int):
        raise ConfigError(f"difficulty must be an integer or None, got {difficulty!r}")
    if not 0 <= difficulty <= maximum:
        raise ConfigError(f"difficulty must be between 0 and {maximum}, got {difficulty}")
