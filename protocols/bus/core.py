"""The state every layer of :class:`~parley.protocols.bus.Endpoint` shares.

A connection to a named peer is a :class:`_Link`; a ZeroMQ socket with its receive-loop
flags is a :class:`_Sock` (a bound ROUTER holds many links, a connecting DEALER one).
:class:`_Core` holds the endpoint's tables and the few operations every layer needs: find a
live link, declare one dead (failing its pending requests), expire a request, start a task.
The layers build on it in this order: ``send`` ← ``links`` ← ``receive`` ← ``endpoint``.
"""

from __future__ import annotations

import abc
import asyncio
import heapq
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import zmq
import zmq.backend as _zmq_backend

from parley.protocols.bus.config import BusConfig, BusStats
from parley.protocols.codec import Codec
from parley.protocols.errors import BusError, ConfigError, PeerDead, RequestTimeout
from parley.protocols.messages import AnyBody, Body, Envelope

log = logging.getLogger("parley.protocols.bus")
_LOG_PERIOD = 1.0  # seconds between two warnings of one kind about bad peers
_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution


MAX_PREFIX_CHARS = 256
"""Longest broadcast prefix a peer may subscribe to."""


def valid_name(name: str) -> bool:
    """Whether ``name`` can name an endpoint: 1-200 bytes (UTF-8), no NUL."""
    return bool(name) and len(name.encode()) <= 200 and "\x00" not in name


def subscriptions_problem(prefixes: list[str], limit: int) -> str | None:
    """Why a peer may not hold ``prefixes`` (too many, or one too long), or None."""
    if len(prefixes) > limit:
        return f"{len(prefixes)} subscriptions; at most {limit} per peer"
    if any(len(prefix) > MAX_PREFIX_CHARS for prefix in prefixes):
        return f"a subscription prefix over {MAX_PREFIX_CHARS} characters"
    return None


def _any(body: Body) -> AnyBody:
    """``body`` as the envelope's union type, for the type checker.

    The public API takes any :class:`Body`; a subclass outside the protocol's union still
    encodes, and the receiver refuses it with ``bad_message`` when it decodes.
    """
    return cast("AnyBody", body)


Handler = Callable[[Envelope], Awaitable[Body | None]]
"""``async def handler(env) -> Body | None``: answers requests, receives one-way sends."""

Admission = Callable[[str, "str | None"], "str | None"]
"""``policy(name, client_key) -> None | reason``: whether a peer saying ``Hello`` with
``name`` may join; ``client_key`` is the CURVE public key (Z85) its connection authenticated
with, ``None`` without CURVE. A reason refuses it with ``Error(not_admitted, reason)``."""


# The hot path calls pyzmq's Cython socket methods directly with plain-int options: the
# Python wrappers and enum conversions cost about as much again as the calls themselves.
_send = _zmq_backend.Socket.send
_recv = _zmq_backend.Socket.recv
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


@dataclass(eq=False)
class _Link:
    """One live (or dead, for a connecting socket) connection to a named peer."""

    sock: _Sock
    rid: bytes | None
    name: str = ""
    alive: bool = False
    last_heard: float = 0.0
    last_sent: float = 0.0
    timeout: float = 0.0
    subscriptions: set[str] = field(default_factory=set)
    pending: dict[int, asyncio.Future[Body]] = field(default_factory=dict)
    rehello: asyncio.Task[None] | None = None
    user: str | None = None  # the CURVE client key (Z85) its Hello came with
    replies_waiting: int = 0  # replies waiting for room in its full queue (send.py)
    probed_at: float = -1.0  # when a duplicate Hello last made us probe it (links.py)
    unwanted: int = 0  # large messages in a row nobody asked for (receive.py)
    bad: int = 0  # messages in a row that did not decode (refuse.py)
    farewell: str | None = None  # the reason of its last Bye, if it said one (links.py)


class _Sock:
    """A ZeroMQ socket plus its receive loop state."""

    def __init__(self, z: zmq.Socket[bytes], address: str, *, router: bool) -> None:
        self.z = z
        self.address = address
        self.router = router
        self.inproc = address.startswith("inproc://")  # peers in this process
        self.curve = False  # a CURVE server: every message carries its client's key
        self.user: str | None = None  # that key, for the message being handled
        self.fd: int = int(z.getsockopt(zmq.FD))
        self.links: dict[bytes, _Link] = {}  # ROUTER: routing id -> link
        self.shunned: dict[bytes, None] = {}  # ROUTER: connections read no more (receive.py)
        self.link: _Link | None = None  # DEALER: the one remote peer
        self.reading = False  # registered with the event loop
        self.draining = False  # inside the receive loop right now
        self.scheduled = False  # a drain is queued with call_soon


class _Core(abc.ABC):
    """The endpoint's state, shared by every layer (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        config: BusConfig | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        if not valid_name(name):
            raise ConfigError(f"endpoint name must be 1-200 bytes without NUL, got {name!r}")
        self.name = name
        self.config = config or BusConfig()
        self.stats = BusStats()
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._codec = Codec(
            max_message_bytes=self.config.max_message_bytes, accept=self.config.accept
        )
        self._socks: list[_Sock] = []
        self._links: dict[str, _Link] = {}
        self._handlers: dict[type[Body], Handler] = {}
        self._subs: list[tuple[str, Handler]] = []
        self._ids = itertools.count(1)
        self._n_pending = 0
        self._n_handlers = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._peer_change: asyncio.Future[None] | None = None
        self._auth: Any = None  # the ZapHandler of a CURVE bind
        self._admission: Admission | None = None
        self._closed = False
        self._now = 0.0  # event-loop clock, read once per receive round and tick
        self._log_gate: dict[str, tuple[float, int]] = {}  # kind -> (last logged, suppressed)
        # Request deadlines: a heap of (when, request id, link, limit) and one timer (_arm).
        self._deadlines: list[tuple[float, int, _Link, float]] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = math.inf

    def _log_limited(self, kind: str, message: str, *args: Any, exc_info: bool = False) -> None:
        """Log a warning about a bad peer at most once per second per ``kind``.

        A hostile or broken peer can make every message it sends go wrong; logging each one
        (with a traceback) would let it fill the disk and slow the receive loop.
        """
        now = time.monotonic()
        last, suppressed = self._log_gate.get(kind, (-_LOG_PERIOD, 0))
        if now - last < _LOG_PERIOD:
            self._log_gate[kind] = (last, suppressed + 1)
            return
        self._log_gate[kind] = (now, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {now - last:.0f} s not logged)"
        log.warning(message, *args, exc_info=exc_info)

    def _live_link(self, peer: str) -> _Link:
        link = self._links.get(peer)
        if link is None:
            alive = sorted(name for name, other in self._links.items() if other.alive)
            raise BusError(
                f"{self.name} has no peer named {peer!r} (peers: {alive}); "
                "connect to it or wait_for_peer first"
            )
        if not link.alive:
            raise PeerDead(f"peer {peer!r} is dead (no heartbeat or said goodbye)")
        return link

    def _peer_died(self, link: _Link, reason: str) -> None:
        if not link.alive:
            return
        link.alive = False
        self.stats.dead_peers += 1
        log.info("%s: peer %s is dead: %s", self.name, link.name, reason)
        self._fail_link(link, PeerDead(f"peer {link.name!r} is dead: {reason}"))
        if link.rid is not None:
            link.sock.links.pop(link.rid, None)
            if self._links.get(link.name) is link:
                del self._links[link.name]
        self._peers_changed()

    def _fail_link(self, link: _Link, exc: BusError) -> None:
        pending, link.pending = link.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(type(exc)(*exc.args))

    def _arm(self, link: _Link, rid: int, limit: float) -> None:
        """Expire request ``rid`` on ``link`` after ``limit`` seconds unless it is answered.

        Every request's deadline waits in one heap of plain tuples, under one event-loop
        timer set for the earliest: a ``call_later`` per request cost ~5 µs to schedule and
        cancel (the loop orders its timers with a Python ``__lt__``), as much as sending
        the request. An answered request leaves its entry behind (it is skipped, and the
        heap is swept when such entries outnumber the live ones).
        """
        assert self._loop is not None
        when = self._loop.time() + limit
        heap = self._deadlines
        heapq.heappush(heap, (when, rid, link, limit))  # rids are unique: links never compared
        if when < self._deadline_at:
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
            self._deadline_timer = self._loop.call_at(when, self._expire_due)
            self._deadline_at = when
        elif len(heap) > 2 * self._n_pending + 256:
            heap[:] = [entry for entry in heap if entry[1] in entry[2].pending]
            heapq.heapify(heap)

    def _expire_due(self) -> None:
        """The deadline timer: expire every request that is due, then wait for the next."""
        assert self._loop is not None
        self._deadline_timer, self._deadline_at = None, math.inf
        heap = self._deadlines
        due = self._loop.time() + _CLOCK_RESOLUTION  # as the event loop decides "due"
        while heap and (heap[0][0] <= due or heap[0][1] not in heap[0][2].pending):
            _, rid, link, limit = heapq.heappop(heap)
            self._expire(link, rid, limit)
        if heap:
            self._deadline_at = heap[0][0]
            self._deadline_timer = self._loop.call_at(self._deadline_at, self._expire_due)

    def _disarm(self) -> None:
        """Drop every deadline (the endpoint is closing)."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_timer, self._deadline_at = None, math.inf
        self._deadlines.clear()

    def _expire(self, link: _Link, rid: int, limit: float) -> None:
        fut = link.pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(
                RequestTimeout(f"no reply from {link.name!r} within {limit:g} s (request {rid})")
            )

    def _peers_changed(self) -> None:
        if self._peer_change is not None and self._loop is not None:
            fut, self._peer_change = self._peer_change, self._loop.create_future()
            fut.set_result(None)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wake(self, sock: _Sock) -> None:
        """Queue a drain of ``sock`` (a no-op if one is queued already)."""
        if not sock.scheduled and self._loop is not None:
            sock.scheduled = True
            self._loop.call_soon(self._drain, sock)

    @abc.abstractmethod
    def _drain(self, sock: _Sock) -> None:
        """The receive loop of ``sock``, provided by the receive layer."""
