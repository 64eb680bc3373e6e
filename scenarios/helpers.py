"""Small helpers of :mod:`parley.scenarios.base` (kept apart for its line budget)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

__all__ = ["NoDraws", "all_clean", "json_default"]


class NoDraws:
    """``new_episode``'s ``rng`` where the class says it draws nothing: any use is its bug."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __getattr__(self, name: str) -> Any:
        raise TypeError(
            f"{self.cls.__name__}.new_episode used rng.{name}, but the class sets "
            "new_episode_draws = False (use self.rng, or leave it True)"
        )


def all_clean(actions: Collection[Any], limit: int) -> bool:
    """Whether every action is printable ASCII and all of them together fit in ``limit``."""
    try:
        joined = "".join(actions)
    except TypeError:  # not all strings: the per-action check names the culprit
        return False
    return len(joined) <= limit and joined.isascii() and joined.isprintable()


def json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"state holds a {type(value).__name__}, which has no JSON form")
