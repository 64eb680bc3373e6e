"""What every part of an endpoint shares: connections, routes, and the endpoint's facts.

A connection to a named peer is a :class:`Link`; a ZeroMQ socket with its receive-loop
flags is a :class:`Sock` (a bound ROUTER holds many links, a connecting DEALER one).
:class:`Routes` holds the handlers registered with ``on`` and ``subscribe``. :class:`Shared`
holds the facts every part reads: the endpoint's name, config, stats and codec, its event
loop and the clock of the current receive round, whether it is closed, and its background
tasks. These hold state and a few one-line operations on it; the behaviour lives in the
parts that :class:`~parley.protocols.bus.Endpoint` composes (the package docstring lists
them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import zmq
import zmq.backend as zmq_backend

from parley.protocols.bus.config import BusConfig, BusStats
from parley.protocols.codec import Codec
from parley.protocols.messages import AnyBody, Body, Envelope, kind_of

log = logging.getLogger("parley.protocols.bus")
LOG_PERIOD = 1.0
"""Seconds between two warnings of one kind about bad peers."""

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


def any_body(body: Body) -> AnyBody:
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
zmq_send = zmq_backend.Socket.send
zmq_recv = zmq_backend.Socket.recv
NOBLOCK = int(zmq.NOBLOCK)
NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


@dataclass(eq=False)
class Link:
    """One live (or dead, for a connecting socket) connection to a named peer."""

    sock: Sock
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
    unwanted: int = 0  # large messages in a row nobody asked for (refuse.py)
    bad: int = 0  # messages in a row that did not decode (refuse.py)
    farewell: str | None = None  # the reason of its last Bye, if it said one (links.py)


class Sock:
    """A ZeroMQ socket plus its receive loop state.

    ``drain`` is the socket's receive loop (:meth:`ReceiveLoop.drain
    <parley.protocols.bus.receive.ReceiveLoop.drain>`); :meth:`wake` queues a run of it.
    """

    def __init__(
        self,
        z: zmq.Socket[bytes],
        address: str,
        *,
        router: bool,
        loop: asyncio.AbstractEventLoop,
        drain: Callable[[Sock], None],
    ) -> None:
        self.z = z
        self.address = address
        self.router = router
        self.loop = loop
        self.drain = drain
        self.inproc = address.startswith("inproc://")  # peers in this process
        self.curve = False  # a CURVE server: every message carries its client's key
        self.user: str | None = None  # that key, for the message being handled
        self.fd: int = int(z.getsockopt(zmq.FD))
        self.links: dict[bytes, Link] = {}  # ROUTER: routing id -> link
        self.shunned: dict[bytes, None] = {}  # ROUTER: connections read no more (refuse.py)
        self.link: Link | None = None  # DEALER: the one remote peer
        self.reading = False  # registered with the event loop
        self.draining = False  # inside the receive loop right now
        self.scheduled = False  # a drain is queued with call_soon

    def all_links(self) -> list[Link]:
        """Every link of this socket (a ROUTER's many, a DEALER's one)."""
        if self.router:
            return list(self.links.values())
        return [] if self.link is None else [self.link]

    def wake(self) -> None:
        """Queue a drain of this socket (a no-op if one is queued already)."""
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.drain, self)


class Routes:
    """Where received messages go: a handler per body type, handlers per broadcast prefix.

    ``handlers`` is changed in place, never replaced (the receive loop holds it).
    """

    def __init__(self) -> None:
        self.handlers: dict[type[Body], Handler] = {}
        self.subs: list[tuple[str, Handler]] = []

    def takes(self, kind: str) -> bool:
        """Whether a handler is registered for the body kind ``kind``."""
        return any(kind_of(cls) == kind for cls in self.handlers)

    def subscribed(self, channel: str) -> bool:
        """Whether a broadcast on ``channel`` has a handler."""
        return any(channel.startswith(prefix) for prefix, _ in self.subs)

    def prefixes(self) -> set[str]:
        """The broadcast prefixes subscribed to."""
        return {prefix for prefix, _ in self.subs}


class Shared:
    """The endpoint's facts every part reads (see the module docstring).

    ``loop`` is set when the endpoint is first used in an event loop; ``now`` is that loop's
    clock, read once per receive round and tick; ``closed`` once ``close`` began.
    """

    def __init__(self, name: str, config: BusConfig, codec: Codec) -> None:
        self.name = name
        self.config = config
        self.codec = codec
        self.stats = BusStats()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.now = 0.0
        self.closed = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self._log_gate: dict[str, tuple[float, int]] = {}  # kind -> (last logged, suppressed)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task that ``close`` cancels."""
        assert self.loop is not None
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def log_limited(self, kind: str, message: str, *args: Any, exc_info: bool = False) -> None:
        """Log a warning about a bad peer at most once per second per ``kind``.

        A hostile or broken peer can make every message it sends go wrong; logging each one
        (with a traceback) would let it fill the disk and slow the receive loop.
        """
        now = time.monotonic()
        last, suppressed = self._log_gate.get(kind, (-LOG_PERIOD, 0))
        if now - last < LOG_PERIOD:
            self._log_gate[kind] = (last, suppressed + 1)
            return
        self._log_gate[kind] = (now, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {now - last:.0f} s not logged)"
        log.warning(message, *args, exc_info=exc_info)
