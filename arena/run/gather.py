"""Awaiting many requests together without a task each.

Every acting seat's observation is sent first, then the actions are gathered
(:meth:`~parley.arena.run.seats.SeatTransport.ask` with ``pipeline``).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, cast

from parley.protocols.messages import Body

__all__ = ["send_all_then_gather"]


async def send_all_then_gather(
    calls: list[Coroutine[Any, Any, Body]],
) -> list[Body | BaseException]:
    """Await ``calls`` together, like ``gather(..., return_exceptions=True)``, without a task
    each: every call first runs up to its first suspension (a bus request suspends once its
    message is sent, on its reply future), then each is driven on in turn inside the caller's
    task.

    ``Exception``s are results; anything else (cancellation) closes the calls not yet done
    and propagates.
    """
    # Run on every step of the runner: no task per call, and replies that came in together
    # are collected without another event-loop round (one round, not one per seat).
    results: list[Body | BaseException] = []
    started: list[tuple[int, Coroutine[Any, Any, Body], Any]] = []
    try:
        for coro in calls:
            try:
                yielded = coro.send(None)
            except StopIteration as stop:
                results.append(stop.value)
            except Exception as exc:
                results.append(exc)
            else:
                results.append(_PENDING)  # replaced below
                started.append((len(results) - 1, coro, yielded))
        for index, coro, yielded in started:
            try:
                results[index] = await _drive(coro, yielded)
            except Exception as exc:
                results[index] = exc
    finally:
        for coro in calls:
            coro.close()  # a no-op for finished ones; a cancelled wait releases the rest
    return results


_PENDING = RuntimeError("internal: request not driven to its end")


@types.coroutine
def _drive(coro: Coroutine[Any, Any, Body], yielded: Any) -> Generator[Any, Any, Body]:
    """Drive ``coro`` on from its suspension at ``yielded`` inside the calling task."""
    while True:
        if asyncio.isfuture(yielded) and yielded.done():
            # Already resolved: resume at once instead of a loop round through the task
            # (what the task would do: clear the flag, send None).
            yielded._asyncio_future_blocking = False
            try:
                yielded = coro.send(None)
            except StopIteration as stop:
                return cast(Body, stop.value)
            continue
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # cancellation: the call decides, as inside a task
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return cast(Body, stop.value)
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return cast(Body, stop.value)
