"""The lanes of the inference pool: one queue and scheduler per backend.

A :class:`Lane` holds the requests waiting for its backend and runs them, statically
batched or one call each on a continuous backend (the scheduling rules are the pool's:
see :mod:`parley.arena.inference.pool`). A :class:`Pending` is one request between receipt
and answer. Split from the pool module by role; the pool owns the lanes and their counters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.arena.inference.backends.errors import RequestError
from parley.arena.inference.gate import Gate
from parley.arena.inference.service import PoolError
from parley.protocols.messages import GenerateRequest, GenerateResult

if TYPE_CHECKING:
    from parley.arena.inference.backends.base import Backend, TokenSink
    from parley.arena.inference.pool import InferencePool

__all__ = ["Lane", "Pending"]


@dataclass(eq=False)
class Pending:
    """One request between receipt and answer."""

    request: GenerateRequest
    future: asyncio.Future[GenerateResult]
    arrived: float
    waiting: bool = True  # counted in the pool's queue (received, not started, not answered)
    task: asyncio.Task[None] | None = None  # continuous lanes: the call running it
    on_tokens: TokenSink | None = None  # streaming callers: receives tokens as generated


class Lane:
    """The queue and the scheduler of one backend (shared by the policies it serves)."""

    def __init__(self, backend: Backend, pool: InferencePool) -> None:
        self.backend = backend
        self.pool = pool
        self.queue: deque[Pending] = deque()
        self.gate = Gate()
        self._wake = asyncio.Event()
        self._in_flight = asyncio.Semaphore(pool.config.max_in_flight)
        self._calls: set[asyncio.Task[None]] = set()
        self.worker: asyncio.Task[None] | None = None

    @property
    def continuous(self) -> bool:
        return bool(getattr(self.backend, "continuous_batching", False))

    def start(self) -> None:
        if self.worker is None:
            loop = self._static_loop() if not self.continuous else self._continuous_loop()
            self.worker = asyncio.get_running_loop().create_task(loop)

    def put(self, item: Pending) -> None:
        self.queue.append(item)
        self._wake.set()

    def pop(self) -> Pending:
        item = self.queue.popleft()
        self.pool._unqueue(item)
        return item

    def discard(self, item: Pending) -> None:
        """Forget a request that was answered early (timeout, cancel); drop it if waiting."""
        if item.waiting:
            self.pool._unqueue(item)
            with contextlib.suppress(ValueError):
                self.queue.remove(item)
        if item.task is not None and not item.task.done():
            item.task.cancel()

    async def _next_item(self) -> None:
        while not self.queue:
            self._wake.clear()
            await self._wake.wait()

    async def _static_loop(self) -> None:
        cfg = self.pool.config
        loop = asyncio.get_running_loop()
        while True:
            await self._next_item()
            # Wait for more requests until the batch is full or the oldest waited max_wait.
            deadline = self.queue[0].arrived + cfg.max_wait
            while len(self.queue) < cfg.max_batch_size and (left := deadline - loop.time()) > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            batch: list[Pending] = []
            while self.queue and len(batch) < cfg.max_batch_size:
                item = self.pop()
                if not item.future.done():  # answered already (timeout, cancel): drop it
                    batch.append(item)
            if batch:
                await self._run(batch)

    async def _continuous_loop(self) -> None:
        while True:
            await self._next_item()
            await self._in_flight.acquire()
            item = self.pop() if self.queue else None
            if item is None or item.future.done():
                self._in_flight.release()
                continue
            item.task = asyncio.get_running_loop().create_task(self._run_one(item))
            self._calls.add(item.task)
            item.task.add_done_callback(self._calls.discard)

    async def _run_one(self, item: Pending) -> None:
        try:
            await self._run([item])
        finally:
            self._in_flight.release()

    async def _run(self, batch: list[Pending]) -> None:
        """One backend call for ``batch``; answers every future that is still open."""
        pool = self.pool
        pool.stats.backend_calls += 1
        pool.stats.batches += 1
        pool.stats.batched_requests += len(batch)
        pool.stats.max_batch_size = max(pool.stats.max_batch_size, len(batch))
        try:
            async with self.gate.shared():
                requests = [p.request for p in batch]
                streams = bool(getattr(self.backend, "streams_tokens", False))
                if streams and any(p.on_tokens for p in batch):
                    sinks = [p.on_tokens for p in batch]
                    generate: Any = self.backend.generate  # takes sinks= (streams_tokens)
                    results = await generate(requests, sinks=sinks)
                else:
                    results = await self.backend.generate(requests)
        except asyncio.CancelledError:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(PoolError("cancelled", "the request was cancelled"))
            raise
        except Exception as exc:  # any backend failure becomes an answer
            if len(batch) > 1:
                # One request must never fail another: retry each member on its own, so
                # only the request(s) that make the backend fail get the error.
                pool.stats.isolated_batches += 1
                for p in batch:
                    if not p.future.done():
                        # The retry is not streamed: its caller got tokens of the failed
                        # run already and checks them against the final result.
                        p.on_tokens = None
                        await self._run([p])
                return
            if isinstance(exc, RequestError):  # the backend found the request bad itself
                pool.stats.bad_requests += 1
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(PoolError("bad_request", str(exc), param=exc.field))
                return
            retryable = bool(getattr(exc, "retryable", False))
            err = PoolError(
                "backend_failed",
                f"the {type(self.backend).__name__} backend failed on this request: "
                f"{type(exc).__name__}: {exc}",
                retryable=retryable,
            )
            pool.stats.failed += sum(not p.future.done() for p in batch)
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
            return
        if len(results) != len(batch):
            err = PoolError(
                "backend_failed",
                f"{type(self.backend).__name__} returned {len(results)} results for "
                f"{len(batch)} requests (backend bug: list in, list out, same order)",
            )
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
            return
        for p, result in zip(batch, results, strict=True):
            if not p.future.done():
                pool.stats.completed += 1
                pool.stats.generated_tokens += sum(len(c.token_ids) for c in result.completions)
                p.future.set_result(result)

    async def close(self) -> None:
        tasks = [t for t in (self.worker, *self._calls) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
