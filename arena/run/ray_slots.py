"""The driver's view of :class:`~parley.arena.run.ray_runner.RayRunner`'s worker actors: a
:class:`Slot` per actor, the :class:`Slice` of plans each call plays, the :class:`SliceQueue`
of slices still to play, and :func:`replace_off_loop`, which kills a lost worker and starts
its replacement on a thread of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from parley.arena.run.episode import EpisodePlan
from parley.arena.run.ray_cluster import head_refuses

__all__ = ["Slice", "SliceQueue", "Slot", "replace_off_loop"]


@dataclass
class Slot:
    """One worker actor as the driver sees it."""

    name: str
    actor: Any  # None while a replacement is being created (replace_off_loop)
    started: concurrent.futures.Future[Any] | None  # of start(): where the worker runs
    where: dict[str, Any] = field(default_factory=dict)
    in_flight: int = 0
    alive: bool = True


@dataclass
class Slice:
    """Plans played in one actor call, and how often a worker died playing them."""

    plans: list[EpisodePlan]
    attempts: int = 0
    reasons: list[str] = field(default_factory=list)


class SliceQueue:
    """Slices still to play: those given back (their worker died; played first), then
    fresh ones cut from the lazy plan as they are taken (never the whole plan at once)."""

    def __init__(self, fresh: Iterator[list[EpisodePlan]]) -> None:
        self._back: deque[Slice] = deque()
        self._fresh = fresh
        self._next: list[EpisodePlan] | None = None

    def __bool__(self) -> bool:
        if self._back:
            return True
        if self._next is None:
            self._next = next(self._fresh, None)
        return self._next is not None

    def popleft(self) -> Slice:
        if self._back:
            return self._back.popleft()
        if not self or self._next is None:
            raise IndexError("no slice left to play")
        piece, self._next = self._next, None
        return Slice(piece)

    def appendleft(self, piece: Slice) -> None:
        self._back.appendleft(piece)


def replace_off_loop(ray: Any, lost: Slot, slot: Slot, create: Callable[[Any], Any]) -> None:
    """Kill ``lost``'s actor and start ``create(ray)``'s as ``slot`` on a daemon thread.

    Both calls block on the head: with the head going away but its GCS port still accepting
    :func:`head_refuses`'s probe, they held the event loop for Ray's 60 s, so
    :class:`~parley.arena.run.ray_cluster.HeadWatch` never ended the run (the process died,
    rc 1). ``slot.started`` completes once the new worker has started, with a ``RayError``
    when it could not be created, or when the head refuses connections (``slot.alive`` is
    false first: nothing replaces it). Called from the event loop that owns ``slot``.
    """
    loop = asyncio.get_running_loop()
    started = slot.started
    if started is None:
        raise ValueError("a replacement slot needs a start future")

    def refused() -> None:
        slot.alive = False
        started.set_exception(ray.exceptions.RaySystemError("the Ray head refuses connections"))

    def replace() -> None:
        if head_refuses(ray):
            loop.call_soon_threadsafe(refused)
            return
        with contextlib.suppress(Exception):  # already dead, or unreachable: it ends anyway
            ray.kill(lost.actor)
        try:
            slot.actor = create(ray)
            ref = slot.actor.start.remote().future()
        except Exception as exc:  # a worker that could not be created is lost
            error = exc if isinstance(exc, ray.exceptions.RayError) else (
                ray.exceptions.RaySystemError(f"{type(exc).__name__}: {exc}")
            )  # fmt: skip
            started.set_exception(error)
            return
        ref.add_done_callback(lambda done: _copy_outcome(done, started))

    threading.Thread(target=replace, name=f"parley-{slot.name}", daemon=True).start()


def _copy_outcome(done: concurrent.futures.Future[Any], to: concurrent.futures.Future[Any]) -> None:
    if done.cancelled():
        to.cancel()
    elif done.exception() is not None:
        to.set_exception(done.exception())
    else:
        to.set_result(done.result())
