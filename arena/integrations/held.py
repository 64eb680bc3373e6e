"""The episodes a trainer integration holds for its trajectories, bounded by work, not time.

A trainer's framework (verl's tool loop, SkyRL's generator) starts an episode per trajectory
and may never end it (a trajectory cut by its length budget, a crashed rollout worker), so an
integration must let go of episodes itself. A wall clock would make load or a stopped process
look like abandonment, so :class:`HeldEpisodes` counts **calls**: an episode no call touched in
``idle_calls`` calls of its integration is idle, and past ``max_sessions`` the least recently
used go first. An episode one of whose calls is being played (a partner slow to answer) is
never idle, and is idle again only counting from that call's answer.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["HeldEpisodes"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Slot(Generic[V]):
    __slots__ = ("last_call", "playing", "value")

    def __init__(self, value: V, last_call: int) -> None:
        self.value, self.last_call, self.playing = value, last_call, 0


class HeldEpisodes(Generic[K, V]):
    """Episodes by key (``V``: what the integration keeps of one), least recently used first;
    :meth:`call` counts the integration's calls, :meth:`playing` wraps the play of one call
    of an episode, :meth:`idle` and :meth:`over` say which to end (the caller ends them and
    :meth:`pop` s them)."""

    def __init__(self, *, max_sessions: int, idle_calls: int) -> None:
        self.max_sessions, self.idle_calls = max_sessions, idle_calls
        self.calls = 0
        self._held: OrderedDict[K, _Slot[V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def __getitem__(self, key: K) -> V:
        return self._held[key].value

    def in_order(self) -> list[K]:
        """The keys held, least recently used first (a copy)."""
        return list(self._held)

    def call(self) -> None:
        """Count one call of the integration (the clock idleness is measured in)."""
        self.calls += 1

    def add(self, key: K, value: V) -> None:
        """Hold ``value`` under ``key``, touched now (the most recently used)."""
        self._held[key] = _Slot(value, self.calls)

    def pop(self, key: K) -> V | None:
        """Let go of ``key``'s episode; its value, or None when it was not held."""
        slot = self._held.pop(key, None)
        return None if slot is None else slot.value

    @contextlib.contextmanager
    def playing(self, key: K) -> Iterator[None]:
        """Around one call of ``key``'s episode (waiting its turn included): touched when it
        starts and when it ends, and never idle meanwhile."""
        slot = self._held[key]
        slot.last_call, slot.playing = self.calls, slot.playing + 1
        self._held.move_to_end(key)
        try:
            yield
        finally:
            slot.last_call, slot.playing = self.calls, slot.playing - 1
            if self._held.get(key) is slot:  # (not let go of meanwhile)
                self._held.move_to_end(key)

    def idle(self) -> list[K]:
        """The episodes no call touched in more than ``idle_calls`` calls and none of whose
        calls is being played, least recently used first."""
        out = []
        for key, slot in self._held.items():
            if self.calls - slot.last_call <= self.idle_calls:
                break  # least recently used first: the rest are more recent
            if not slot.playing:
                out.append(key)
        return out

    def over(self, room: int = 0) -> list[K]:
        """The least recently used episodes past ``max_sessions`` with ``room`` more about to
        be added (one being played among them too: capacity is a hard bound)."""
        excess = len(self._held) + room - self.max_sessions
        return list(self._held)[: max(0, excess)] if excess > 0 else []
