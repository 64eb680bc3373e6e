"""Games of other libraries played as parley scenarios, resolved by id on first use.

An id ``LIBRARY:GAME`` names a game of an outside library; no registration is needed and
nothing is imported until such an id is asked for (:func:`parley.scenarios.spec` calls
:func:`resolve` for ids with a known prefix):

=====================  ==========================================  =======================
id                     library                                     adapter
=====================  ==========================================  =======================
``openspiel:GAME``     OpenSpiel (``pyspiel``), ``GAME`` may carry  :mod:`.openspiel`
                       parameters: ``openspiel:leduc_poker(players=3)``
``textarena:ENV_ID``   TextArena (``textarena``)                   :mod:`.textarena`
``pettingzoo:classic/  PettingZoo's classic games (AEC envs)       :mod:`.pettingzoo`
NAME``
``nemogym:SERVER@      a NeMo Gym resources server running at      :mod:`.nemo_gym`
HOST:PORT``            HOST:PORT (a solver and a checker share it)
=====================  ==========================================  =======================

Install the libraries with ``pip install -e ".[games]"``. Every adapter follows the same
rules: the library's turn order is :meth:`~parley.scenarios.base.Scenario.acting`, a seat sees
only what the library shows that player, its legal moves are a ``choice`` constraint, the
library's returns are the ``task`` reward component, all randomness comes from
``reset(seed=...)``, and a move the library would refuse is an invalid move with its reason.

:func:`catalog` lists what an adapter accepts (with seats and a description) and what it
cannot represent (with the reason), for ``parley list --all`` and the tests.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from parley.protocols.errors import ConfigError
from parley.scenarios.registry import ScenarioSpec

__all__ = ["PREFIXES", "Entry", "catalog", "is_imported", "resolve"]

PREFIXES: dict[str, str] = {
    "openspiel": "parley.scenarios.imported.openspiel",
    "textarena": "parley.scenarios.imported.textarena",
    "pettingzoo": "parley.scenarios.imported.pettingzoo",
    "nemogym": "parley.scenarios.imported.nemo_gym",
}
"""Id prefix -> adapter module (each defines ``spec_for(name)`` and ``catalog()``)."""

_SPECS: dict[str, ScenarioSpec] = {}  # resolved ids (kept apart from the registry's list)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One game of an outside library as an adapter sees it."""

    id: str
    """The parley id (``openspiel:kuhn_poker``)."""
    seats: tuple[str, ...]
    """The seats (empty when the game is not accepted)."""
    description: str
    reason: str = ""
    """Why the adapter cannot represent the game ("" when it can)."""

    @property
    def accepted(self) -> bool:
        return not self.reason


def is_imported(id: str) -> bool:
    """Whether ``id`` names a game of an outside library (``PREFIX:NAME``)."""
    prefix, sep, name = id.partition(":")
    return bool(sep and name) and prefix in PREFIXES


def resolve(id: str) -> ScenarioSpec:
    """The spec of imported game ``id``; raises :class:`ConfigError` saying what to do when
    the library is missing or the adapter cannot represent the game."""
    found = _SPECS.get(id)
    if found is None:
        prefix, _, name = id.partition(":")
        if prefix not in PREFIXES:
            raise ConfigError(f"{id!r} has no known library prefix; use one of {sorted(PREFIXES)}")
        found = _SPECS[id] = importlib.import_module(PREFIXES[prefix]).spec_for(name)
    return found


def catalog(prefixes: tuple[str, ...] = tuple(PREFIXES)) -> list[Entry]:
    """Every game of the installed libraries, accepted or not (a library that is not
    installed gives one entry saying how to install it)."""
    out: list[Entry] = []
    for prefix in prefixes:
        module: Any = importlib.import_module(PREFIXES[prefix])
        try:
            out.extend(module.catalog())
        except ConfigError as exc:  # the library is not installed
            out.append(Entry(f"{prefix}:*", (), "", str(exc)))
    return out
