"""Requests: ids, the futures awaiting replies, and their deadlines.

A request is a future in its link's ``pending`` table under a fresh id; the receive loop
resolves it with the reply (or an ``Error``), the link's death fails it (:class:`PeerDead`),
its deadline expires it (:class:`RequestTimeout`). Whichever comes first wins; the others
find the id gone.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time

from parley.protocols.bus.core import Link, Shared, any_body
from parley.protocols.bus.send import Sender
from parley.protocols.errors import BusError, RequestTimeout
from parley.protocols.messages import Body, Envelope

CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution
LATE_S = 0.05
"""How late the deadline timer may fire before it counts as the endpoint having stood still
(the process stopped or descheduled on a loaded host, or its event loop blocked)."""


class Requests:
    """An endpoint's requests in flight: ``pending`` counts them (bounded by
    ``BusConfig.max_pending``); ``deadlines`` is the heap of their expiry times, ``timer``
    the one event-loop timer set for the earliest."""

    def __init__(self, shared: Shared, sender: Sender) -> None:
        self._shared = shared
        self._sender = sender
        self._ids = itertools.count(1)
        self.pending = 0
        # A heap of (when, request id, link, limit, spare, armed) under one timer (see _arm;
        # spare: how much longer it may yet be put off for the endpoint's stalls; armed:
        # when it was sent, by the loop's clock).
        self.deadlines: list[tuple[float, int, Link, float, float, float]] = []
        self.timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    async def request(
        self,
        link: Link,
        body: Body,
        *,
        timeout: float | None,  # noqa: ASYNC109 -- per-call timeouts are the bus contract
        episode: str,
        turn: int,
    ) -> Body:
        """Send ``body`` to ``link``'s peer as a request and return its reply body (the
        contract is :meth:`Endpoint.request <parley.protocols.bus.Endpoint.request>`'s)."""
        config = self._shared.config
        if self.pending >= config.max_pending:
            raise BusError(
                f"{self.pending} requests already pending (max_pending); await earlier "
                "replies before sending more or raise BusConfig.max_pending"
            )
        loop = self._shared.loop
        assert loop is not None  # the link is live, so the endpoint is started
        rid = next(self._ids)
        env = Envelope(
            body=any_body(body),
            sender=self._shared.name,
            id=rid,
            expects_reply=True,
            episode=episode,
            turn=turn,
        )
        frames = self._sender.encode(env)
        fut: asyncio.Future[Body] = loop.create_future()
        link.pending[rid] = fut
        self.pending += 1
        limit = config.request_timeout if timeout is None else timeout
        self._arm(link, rid, limit)
        try:
            if not self._sender.send_now(link, frames):
                await self._sender.send_later(link, frames, limit)
            return await fut
        finally:
            self.pending -= 1
            self.settle(link, rid, fut)

    def open(self, link: Link) -> tuple[int, asyncio.Future[Body]]:
        """A fresh request id and the future its reply resolves, for a request the caller
        sends and waits on itself (the handshake, the goodbye); :meth:`settle` it after."""
        assert self._shared.loop is not None
        rid = next(self._ids)
        fut: asyncio.Future[Body] = self._shared.loop.create_future()
        link.pending[rid] = fut
        return rid, fut

    @staticmethod
    def settle(link: Link, rid: int, fut: asyncio.Future[Body]) -> None:
        """Forget request ``rid`` on ``link``, its outcome seen.

        Its future may have failed with nobody awaiting it (the peer died while the send
        waited for room, or while a handshake was being cancelled): marked as seen, or
        asyncio prints "Future exception was never retrieved" when it is collected.
        """
        link.pending.pop(rid, None)
        if fut.done() and not fut.cancelled():
            fut.exception()

    def _arm(self, link: Link, rid: int, limit: float) -> None:
        """Expire request ``rid`` on ``link`` after ``limit`` seconds unless it is answered.

        Every request's deadline waits in one heap of plain tuples, under one event-loop
        timer set for the earliest: a ``call_later`` per request cost ~5 µs to schedule and
        cancel (the loop orders its timers with a Python ``__lt__``), as much as sending
        the request. An answered request leaves its entry behind (it is skipped, and the
        heap is swept when such entries outnumber the live ones).
        """
        loop = self._shared.loop
        assert loop is not None
        now = loop.time()
        when = now + limit
        heap = self.deadlines
        # (rids are unique: links are never compared)
        heapq.heappush(heap, (when, rid, link, limit, limit, now))
        if when < self._timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = loop.call_at(when, self._expire_due)
            self._timer_at = when
        elif len(heap) > 2 * self.pending + 256:
            heap[:] = [entry for entry in heap if entry[1] in entry[2].pending]
            heapq.heapify(heap)

    def _expire_due(self) -> None:
        """The deadline timer: expire every request that is due, then wait for the next.

        A timer that fires more than :data:`LATE_S` late means the endpoint stood still
        (stopped, descheduled, its loop blocked) while its peers ran: their replies may be
        waiting unread in the socket, and the loop runs this timer before it reads them.
        Every deadline of a request sent before the timer was due is then put off by the
        lateness, counted from now for those already due, and so is one sent after it but
        already overdue: the loop ran callbacks ahead of the due timer (read a reply, sent
        the next request) and stood still again before the timer ran. One sent once the
        loop ran again and not yet due lived through no stall (nor did one sent in this
        very turn). The replies are read first: a stall of the waiting side is not the
        peer's timeout. Each move, the overdue time included, is charged to the request's
        allowance (its own limit), so every request ends by twice its limit plus at most
        two late firings' lateness.
        """
        loop = self._shared.loop
        assert loop is not None
        now = loop.time()
        fired_for = self._timer_at
        late = now - fired_for
        self.timer, self._timer_at = None, math.inf
        heap = self.deadlines
        if late > LATE_S:
            # The whole move is charged (an overdue one's wait from its deadline to now
            # too: a loop lagging 60 ms at every timer had a request end at 3.6x its limit).
            heap[:] = [
                (moved, rid, link, limit, max(0.0, spare - (moved - when)), armed)
                if armed <= fired_for or when <= now
                else (when, rid, link, limit, spare, armed)
                for when, rid, link, limit, spare, armed in heap
                if rid in link.pending
                for moved in (max(when, now) + min(late, spare),)
            ]
            heapq.heapify(heap)
        due = now + CLOCK_RESOLUTION  # as the event loop decides "due"
        while heap and (heap[0][0] <= due or heap[0][1] not in heap[0][2].pending):
            _, rid, link, limit, _, _ = heapq.heappop(heap)
            fut = link.pending.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(
                    RequestTimeout(
                        f"no reply from {link.name!r} within {limit:g} s (request {rid})"
                    )
                )
        if heap:
            self._timer_at = heap[0][0]
            self.timer = loop.call_at(self._timer_at, self._expire_due)

    def close(self) -> None:
        """Drop every deadline (the endpoint is closing)."""
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self._timer_at = None, math.inf
        self.deadlines.clear()
