"""The pool's per-lane gate: many generate calls, or one weight update, at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["Gate"]


class Gate:
    """Many generate calls or one weight update at a time; a waiting update goes first."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._active = 0
        self._updating = False
        self._waiting_updates = 0

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating and not self._waiting_updates)
            self._active += 1
        try:
            yield
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting_updates += 1
            try:
                await self._cond.wait_for(lambda: not self._updating and self._active == 0)
            finally:
                self._waiting_updates -= 1
            self._updating = True
        try:
            yield
        finally:
            async with self._cond:
                self._updating = False
                self._cond.notify_all()
