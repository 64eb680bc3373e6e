"""Timeouts that count the time this process ran, not the time it stood still.

A server's timer is an event-loop timer: when the process is stopped (SIGSTOP, a loaded
host that does not schedule it, its loop blocked), the timer falls due during the stall
and, once the loop runs again, fires in the same turn that reads what the peers sent in
time (a request's headers, its body, a generation that finished): the wait ends as the
peer's timeout although the peer was never late. :class:`PatientTimer` is ``call_later``
with the bus's rule for this (``parley.protocols.bus.requests``): a timer that fires more
than :data:`LATE_S` late puts its deadline off by the lateness, counted from now, so the
loop first reads what came; each move, the overdue time included, is charged to an
allowance of the timer's own delay, so a timer fires at the latest twice its delay plus
the lateness of two firings after it was armed, however long or often the process stalls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

# How late a timer may fire before it counts as the process having stood still: the bus's.
from parley.protocols.bus.requests import LATE_S

T = TypeVar("T")


class PatientTimer:
    """``loop.call_later(delay, callback, *args)`` that puts itself off when it fires more
    than :data:`LATE_S` late (see the module's docstring); :meth:`cancel` as a handle's."""

    __slots__ = ("_args", "_callback", "_due", "_handle", "_loop", "_spare")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
    ) -> None:
        self._loop = loop
        self._callback, self._args = callback, args
        self._spare = delay  # how much longer it may yet be put off for stalls
        self._due = loop.time() + delay
        self._handle: asyncio.TimerHandle | None = loop.call_at(self._due, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        late = now - self._due
        if late > LATE_S and self._spare > 0:
            moved = now + min(late, self._spare)
            self._spare = max(0.0, self._spare - (moved - self._due))
            self._due = moved
            self._handle = self._loop.call_at(moved, self._fire)
            return
        self._handle = None
        self._callback(*self._args)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def patient_wait(fut: asyncio.Future[Any], seconds: float | None) -> None:
    """Wait until ``fut`` is done or ``seconds`` (None: no limit) have passed, timed by a
    :class:`PatientTimer`, as ``asyncio.wait({fut}, timeout=seconds)``: ``fut`` is neither
    cancelled nor its result read. Works where the caller is not a task."""
    if seconds is None:
        await asyncio.wait({fut})
        return
    expired: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    timer = PatientTimer(expired.get_loop(), seconds, _settle, expired)
    try:
        await asyncio.wait({fut, expired}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        expired.cancel()


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def patient_wait_for(aw: Awaitable[T], seconds: float) -> T:
    """``asyncio.wait_for(aw, seconds)`` timed by a :class:`PatientTimer`: raises
    :class:`TimeoutError` (``aw`` cancelled) when it is not done in time, stalls of this
    process not counted (within the timer's bound)."""
    call = asyncio.ensure_future(aw)
    try:
        await patient_wait(call, seconds)
    finally:
        finished = call.done()
        if not finished:  # timed out, or the caller went away
            call.cancel()
    if not finished:
        raise TimeoutError(f"not done within {seconds:g} s")
    return call.result()
