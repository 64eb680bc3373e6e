"""Batched remote frames (``RunConfig.batch_frames``): one message per agent process, not
one per seat and episode.

With many episodes in flight, the runner asks each remote agent process for many actions at
about the same time. :class:`FrameBatcher` holds the observations asked for within one turn
of the event loop and sends each peer one ``ObservationBatch`` with all of its own, across
episodes; the peer answers with one ``ActionBatch`` (see :mod:`parley.arena.run.agent_host`).
Each caller awaits its own observation as it would a single request
(:meth:`FrameBatcher.request` is a drop-in for ``Endpoint.request`` on this path): an
``Action``, or the same exception a single request would raise — the item's ``Error`` as
:class:`~parley.protocols.errors.RemoteError` (so an agent that raises fails its own seat
and episode only), an item still running at the batch's ``timeout`` as
:class:`~parley.protocols.errors.RequestTimeout` (the agent process answers the batch then, so
one agent that hangs fails its own episode only), or, when the whole batch fails (the peer
died, could not answer, refused it as ``overloaded``), that failure for each of its items:
every one of them was that peer's. A batch is answered when its slowest item is: agents of
very uneven latency hold their batch-mates' episodes back (up to the act timeout).

With batched frames, :class:`~parley.arena.run.seats.BusSeats` (the runner's transport to
the seats over the bus) calls :meth:`FrameBatcher.request` instead of ``Endpoint.request``
and nothing else changes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from parley.protocols.bus import Endpoint
from parley.protocols.errors import ProtocolError, RemoteError, RequestTimeout
from parley.protocols.messages import (
    MAX_LIST_ITEMS,
    ActionBatch,
    Body,
    Error,
    Observation,
    ObservationBatch,
)

__all__ = ["FrameBatcher", "REPLY_GRACE_S"]

REPLY_GRACE_S = 5.0
"""Seconds past a batch's ``timeout`` the runner waits for its reply: the agent process
answers at ``timeout`` with the items still running as timed out (one agent that hangs
fails its own episode only); only a process that cannot answer at all fails them all."""


@dataclass
class _Item:
    obs: Observation
    episode: str
    timeout: float
    reply: asyncio.Future[Body]


class FrameBatcher:
    """Sends the observations asked for within one event-loop turn as one
    ``ObservationBatch`` per peer (at most ``MAX_LIST_ITEMS`` each) over ``arena``."""

    def __init__(self, arena: Endpoint) -> None:
        self._arena = arena
        self._queued: dict[str, list[_Item]] = {}
        self._flushing = False
        self._batches: set[asyncio.Task[None]] = set()  # (a task is kept only if referenced)
        self.batches_sent = 0
        """``ObservationBatch`` messages sent (a work count for tests and benches)."""

    async def request(
        self,
        peer: str,
        obs: Observation,
        *,
        timeout: float,  # noqa: ASYNC109 -- the act timeout, as for Endpoint.request
        episode: str,
    ) -> Body:
        """``obs``'s reply from ``peer``, as ``Endpoint.request`` returns or raises it.

        The batch waits for the longest ``timeout`` of its items: the runner's items of one
        turn are all fresh steps (the same ``act_timeout``), or retries after ``overloaded``.
        """
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Body] = loop.create_future()
        self._queued.setdefault(peer, []).append(_Item(obs, episode, timeout, reply))
        if not self._flushing:
            # After every episode this turn resumed has asked: they all run before this.
            self._flushing = True
            loop.call_soon(self._flush)
        return await reply

    def _flush(self) -> None:
        self._flushing = False
        queued, self._queued = self._queued, {}
        for peer, items in queued.items():
            for start in range(0, len(items), MAX_LIST_ITEMS):
                piece = items[start : start + MAX_LIST_ITEMS]
                task = asyncio.ensure_future(self._send(peer, piece))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _send(self, peer: str, items: list[_Item]) -> None:
        items = [item for item in items if not item.reply.done()]  # (a cancelled episode)
        try:
            if items:
                await self._ask(peer, items)
        finally:  # (cancelled by close(): so are the callers still waiting)
            for item in items:
                item.reply.cancel()  # a no-op for settled ones

    async def _ask(self, peer: str, items: list[_Item]) -> None:
        timeout = max(item.timeout for item in items)
        batch = ObservationBatch(
            observations=[item.obs for item in items],
            episodes=[item.episode for item in items],
            timeout=timeout,
        )
        self.batches_sent += 1
        try:
            reply = await self._arena.request(peer, batch, timeout=timeout + REPLY_GRACE_S)
        except ProtocolError:
            # Too large for one message, or a reply that does not decode: each item goes on
            # its own, and ends as it would have without batching.
            await asyncio.gather(*(self._single(peer, item) for item in items))
            return
        except Exception as exc:  # the peer's failure is each item's (RequestTimeout, ...)
            for item in items:
                _settle(item.reply, exc)
            return
        if not isinstance(reply, ActionBatch) or len(reply.results) != len(items):
            got = type(reply).__name__
            size = len(reply.results) if isinstance(reply, ActionBatch) else 0
            error = ProtocolError(
                f"{peer} answered {len(items)} observations with {got} of {size} results"
            )
            for item in items:
                _settle(item.reply, error)
            return
        for item, result in zip(items, reply.results, strict=True):
            if isinstance(result, Error) and result.code == "timeout":  # (hung past timeout)
                late = f"no reply from {peer!r} within {timeout:g} s ({result.message[:200]})"
                _settle(item.reply, RequestTimeout(late))
            elif isinstance(result, Error):  # as the bus raises an Error reply
                remote = RemoteError(
                    result.code, result.message, peer=peer, retryable=result.retryable
                )
                _settle(item.reply, remote)
            elif not item.reply.done():
                item.reply.set_result(result)

    async def _single(self, peer: str, item: _Item) -> None:
        try:
            reply = await self._arena.request(
                peer, item.obs, timeout=item.timeout, episode=item.episode
            )
        except Exception as exc:
            _settle(item.reply, exc)
        else:
            if not item.reply.done():
                item.reply.set_result(reply)

    async def close(self) -> None:
        """Cancel the batches in flight (their callers get ``CancelledError``)."""
        for task in list(self._batches):
            task.cancel()
        await asyncio.gather(*self._batches, return_exceptions=True)
        for items in self._queued.values():
            for item in items:
                item.reply.cancel()
        self._queued.clear()


def _settle(reply: asyncio.Future[Body], error: BaseException) -> None:
    if not reply.done():
        reply.set_exception(error)
