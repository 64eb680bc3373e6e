"""The parley message bus: named asyncio endpoints over ZeroMQ.

An :class:`Endpoint` is one named participant (an agent, the arena, the pool, a trainer).
It may ``bind`` (a ZeroMQ ROUTER socket that many peers connect to) and ``connect`` (one
DEALER socket per remote endpoint), in any combination, over ``inproc://``, ``ipc://`` or
``tcp://`` with the same API. Every frame is an :class:`~parley.protocols.messages.Envelope`
encoded by :class:`~parley.protocols.codec.Codec`; ``protocols/PROTOCOL.md`` documents the
wire format for implementers in other languages.

Example::

    async with Endpoint("arena") as arena, Endpoint("alice") as alice:
        async def act(env: Envelope) -> Action:
            return Action(agent="alice", text="I accept")

        alice.on(Observation, act)
        address = await arena.bind("ipc:///tmp/parley-arena")  # or tcp://127.0.0.1:0
        await alice.connect(address)  # returns "arena"
        action = await arena.request("alice", Observation(agent="alice", text="Offer?"))

Contracts
---------
* **Handshake.** ``connect`` sends ``Hello`` and returns the remote name once the remote's
  ``Hello`` reply arrives. A bound endpoint refuses a name that is already connected and
  alive (``Error(duplicate_name)``) and a peer that does not speak this schema version
  (``Error(unsupported_version)``). Any other message from a socket that has not said
  ``Hello`` is answered with ``Error(hello_required)``.
* **Requests.** ``request`` returns the reply body, or raises :class:`RemoteError` (the
  peer answered ``Error``), :class:`PeerDead` (the peer died or said ``Bye`` while the request
  was pending) or :class:`RequestTimeout`. Every request ends in exactly one of these.
  Either side of a connection may send requests. Handlers registered with :meth:`Endpoint.on`
  answer them: a handler returning ``None`` replies ``Ok``; a handler raising replies
  ``Error(handler_failed)``; an unknown kind gets ``Error(no_handler)``.
* **Handlers run eagerly.** A handler's coroutine is started inside the receive loop; if it
  finishes without suspending (the common case: a table lookup, a queue put) its reply is
  sent at once and no task is created; if it suspends, it continues as a task, so a slow
  handler never blocks the receive loop. Handlers therefore must not block the thread.
* **Liveness.** Each side sends ``Heartbeat`` when it has sent nothing else to a peer for
  ``heartbeat_interval``. A peer not heard from for longer than ``peer_timeout`` (at least
  2.5 of its announced heartbeat intervals) is dead: its pending requests fail with
  :class:`PeerDead` and it leaves :attr:`Endpoint.peers`. A ``Bye`` has the same effect at
  once; so does a bound socket finding the peer's connection gone when it sends to it
  (ZeroMQ's ``EHOSTUNREACH``). A connecting endpoint whose peer died keeps its socket and
  repeats the handshake when the peer comes back (ZeroMQ reconnects by itself).
* **Broadcast.** ``subscribe(prefix, handler)`` tells every peer (and every later peer, in
  its ``Hello``) to forward broadcasts whose channel starts with ``prefix``; ``publish``
  sends one copy to each peer that asked. Broadcast is one hop: an endpoint does not relay.
* **CURVE.** With ``BusConfig.curve_secret_key`` set, ``tcp://`` binds are CURVE servers that
  admit only ``curve_allowed_clients`` (checked by a ZAP handler), and ``tcp://`` connects
  authenticate with the server's public key ``curve_server_key``. A peer without the right
  keys completes no handshake, so it can neither send nor receive. Without keys ``tcp://``
  is plain text: keep it on trusted networks (or 127.0.0.1).
* **Identity.** A connecting DEALER's routing id is ``"<name>/<random hex>"``: stable across
  ZeroMQ's automatic reconnects, new for a new process, so a restarted peer is a new
  connection that a bound endpoint can tell from a live duplicate (it probes the old one).

Bounds, and why
---------------
* ``LINGER 0`` on every socket: closing an endpoint never waits on unsent messages (a dead
  peer must not hang shutdown). ``close()`` sends ``Bye`` first, best effort.
* ``hwm`` (default 10,000 messages, each direction, per connection) caps what ZeroMQ
  buffers for a slow or dead peer: with 4 KB messages ~40 MB, far above one scenario's
  traffic yet small enough that a stuck peer cannot exhaust memory. A send that finds the
  queue full waits (with back-off) up to the request timeout, then fails with
  :class:`BusError`; a reply that finds it full is retried the same way in a task.
* ``max_pending`` (10,000) bounds requests awaiting replies: past it ``request`` raises
  :class:`BusError` at once instead of queueing without limit (the caller is outpacing the
  peer and should await earlier replies).
* ``max_handlers`` (1,000) bounds handler tasks running at once; beyond it requests are
  answered ``Error(overloaded, retryable=True)`` so a flood cannot grow tasks without end.

Implementation notes: each socket has one receive loop, :meth:`Endpoint._drain`. The event
loop runs it when the socket's ZeroMQ descriptor turns readable (``loop.add_reader``); it then
drains every queued message with non-blocking ``recv`` calls, resolving reply futures and
starting handlers in place. A per-message ``await recv()`` costs ~11x more, and a task that
awaits a poll costs an extra event-loop round per wake. ZeroMQ's descriptor is
edge-triggered and a send can consume the edge, so a send made outside the loop queues one
more drain for the end of the current event-loop round.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, cast

import msgspec
import zmq
import zmq.backend as _zmq_backend

from parley.protocols.codec import DEFAULT_MAX_MESSAGE_BYTES, Codec, Frame
from parley.protocols.errors import (
    BusError,
    ConfigError,
    PeerDead,
    ProtocolError,
    RemoteError,
    RequestTimeout,
)
from parley.protocols.messages import (
    SCHEMA_VERSION,
    AnyBody,
    Body,
    Bye,
    Envelope,
    Error,
    Heartbeat,
    Hello,
    Ok,
    Subscribe,
)

__all__ = ["BusConfig", "BusStats", "Endpoint", "Handler"]

log = logging.getLogger(__name__)


def _any(body: Body) -> AnyBody:
    """``body`` as the envelope's union type, for the type checker.

    The public API takes any :class:`Body`; a subclass outside the protocol's union still
    encodes, and the receiver refuses it with ``bad_message`` when it decodes.
    """
    return cast("AnyBody", body)


Handler = Callable[[Envelope], Awaitable[Body | None]]
"""``async def handler(env) -> Body | None``: answers requests, receives one-way sends."""

# The hot path calls pyzmq's Cython socket methods directly with plain-int options: the
# Python wrappers and enum conversions cost about as much again as the calls themselves.
_send = _zmq_backend.Socket.send
_recv = _zmq_backend.Socket.recv
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_SNDMORE = int(zmq.SNDMORE)
_RCVMORE = int(zmq.RCVMORE)
_ZAP_DOMAIN = "parley"  # the ZAP domain of CURVE binds, where the allowed client keys apply
_BATCH = 2000  # messages read per receive-loop round before yielding to other tasks


@dataclass(frozen=True, kw_only=True)
class BusConfig:
    """Timing, bounds and keys of an :class:`Endpoint` (see the module docstring for why)."""

    heartbeat_interval: float = 1.0
    """Seconds of silence towards a peer after which a ``Heartbeat`` is sent."""
    peer_timeout: float = 5.0
    """Seconds without hearing from a peer after which it is declared dead."""
    request_timeout: float = 30.0
    """Default timeout of ``request`` (and of a send that finds the queue full)."""
    connect_timeout: float = 10.0
    """Default timeout of ``connect`` (handshake included)."""
    hwm: int = 10_000
    """ZeroMQ send and receive high-water mark, in messages, per connection."""
    max_pending: int = 10_000
    """Most requests awaiting a reply at once; more raise ``BusError``."""
    max_handlers: int = 1_000
    """Most request handlers suspended at once; more are answered ``overloaded``."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest message accepted or sent (all frames)."""
    curve_public_key: bytes | None = None
    """This endpoint's CURVE public key (Z85, from ``zmq.curve_keypair()``)."""
    curve_secret_key: bytes | None = None
    """This endpoint's CURVE secret key; setting it turns CURVE on for ``tcp://``."""
    curve_server_key: bytes | None = None
    """Public key of the endpoint that ``connect`` reaches over ``tcp://``."""
    curve_allowed_clients: tuple[bytes, ...] | None = None
    """Client public keys a CURVE bind admits; ``None`` admits any client key."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval", "peer_timeout", "request_timeout", "connect_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"BusConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("hwm", "max_pending", "max_handlers", "max_message_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"BusConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.peer_timeout <= self.heartbeat_interval:
            raise ConfigError(
                f"peer_timeout ({self.peer_timeout}) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}); use at least 2.5x"
            )
        if (self.curve_secret_key is None) != (self.curve_public_key is None):
            raise ConfigError("set curve_public_key and curve_secret_key together")

    @property
    def curve(self) -> bool:
        """Whether CURVE is on for ``tcp://``."""
        return self.curve_secret_key is not None


@dataclass
class BusStats:
    """Counters of one endpoint (monotonic; read them, do not write them)."""

    sent: int = 0
    received: int = 0
    bad_messages: int = 0
    unhandled: int = 0
    late_replies: int = 0
    handler_errors: int = 0
    dead_peers: int = 0


class _Head(msgspec.Struct):
    """The envelope fields a receiver salvages from an undecodable message."""

    id: int = 0
    reply_to: int = 0
    expects_reply: bool = False


_salvage = msgspec.msgpack.Decoder(_Head)


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


class _Sock:
    """A ZeroMQ socket plus its receive loop state."""

    def __init__(self, z: zmq.Socket[bytes], address: str, *, router: bool) -> None:
        self.z = z
        self.address = address
        self.router = router
        self.fd: int = int(z.getsockopt(zmq.FD))
        self.links: dict[bytes, _Link] = {}  # ROUTER: routing id -> link
        self.link: _Link | None = None  # DEALER: the one remote peer
        self.reading = False  # registered with the event loop
        self.draining = False  # inside the receive loop right now
        self.scheduled = False  # a drain is queued with call_soon


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """Drive ``coro`` on from its first suspension point (``yielded``) inside a task."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # forwarded into the handler, which decides
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


class Endpoint:
    """A named participant on the bus; see the module docstring for the contracts.

    ``context`` is the ZeroMQ context to create sockets in; endpoints that talk over
    ``inproc://`` must share one. Without it the endpoint makes (and later terminates) its
    own. All methods must be called from the event loop that first used the endpoint.
    """

    def __init__(
        self,
        name: str,
        *,
        config: BusConfig | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        if not name or len(name.encode()) > 200 or "\x00" in name:
            raise ConfigError(f"endpoint name must be 1-200 bytes without NUL, got {name!r}")
        self.name = name
        self.config = config or BusConfig()
        self.stats = BusStats()
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._codec = Codec(max_message_bytes=self.config.max_message_bytes)
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
        self._auth: Any = None
        self._closed = False
        self._now = 0.0  # event-loop clock, read once per receive round and tick

    # --- public API ------------------------------------------------------------------

    @property
    def peers(self) -> list[str]:
        """Names of the peers currently connected and alive."""
        return [name for name, link in self._links.items() if link.alive]

    def on(self, body_type: type[Body], handler: Handler, *, task: bool = False) -> None:
        """Handle messages whose body is a ``body_type`` (replacing an earlier handler).

        The handler starts inline, in the receive loop, and moves into a task at its first
        suspending ``await`` (see "Handlers run eagerly"). Code that needs to run inside a
        task from its first line (``asyncio.timeout``, ``asyncio.TaskGroup``,
        ``asyncio.current_task``) works after that first ``await``; or pass ``task=True``
        to start the handler in its own task (one more event-loop round per message).
        """
        if body_type in (Hello, Heartbeat, Bye, Subscribe):
            raise ConfigError(f"{body_type.__name__} is handled by the bus itself")
        self._handlers[body_type] = _in_task(handler) if task else handler

    async def bind(self, address: str) -> str:
        """Listen on ``address`` (``tcp://127.0.0.1:0`` picks a port); returns the address."""
        self._start()
        z = self._socket(zmq.ROUTER)
        z.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer raises instead of dropping
        z.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnect with the same id takes over
        if address.startswith("tcp://") and self.config.curve:
            await self._start_authenticator()
            z.setsockopt(zmq.CURVE_SERVER, 1)
            z.setsockopt(zmq.CURVE_SECRETKEY, self.config.curve_secret_key or b"")
            z.setsockopt(zmq.CURVE_PUBLICKEY, self.config.curve_public_key or b"")
            z.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN.encode())
        try:
            z.bind(address)
        except zmq.ZMQError as exc:
            z.close(0)
            raise BusError(f"cannot bind {address}: {exc}; is another endpoint there?") from exc
        resolved = z.getsockopt_string(zmq.LAST_ENDPOINT)
        self._add_sock(_Sock(z, resolved, router=True))
        return resolved

    async def connect(
        self,
        address: str,
        timeout: float | None = None,  # noqa: ASYNC109 -- per-call timeouts are the bus contract
        *,
        server_key: bytes | None = None,
    ) -> str:
        """Connect to the endpoint bound at ``address``; returns its name after ``Hello``.

        ``server_key`` overrides ``BusConfig.curve_server_key`` for this ``tcp://`` address.
        Raises :class:`RequestTimeout` when no handshake completes within ``timeout`` (no one
        bound there, or CURVE keys that do not match), :class:`RemoteError` when refused.
        """
        self._start()
        z = self._socket(zmq.DEALER)
        z.setsockopt(zmq.IMMEDIATE, 1)  # never queue for a connection that does not exist
        z.setsockopt(zmq.ROUTING_ID, f"{self.name}/{os.urandom(4).hex()}".encode())
        if address.startswith("tcp://") and self.config.curve:
            key = server_key or self.config.curve_server_key
            if key is None:
                z.close(0)
                raise ConfigError(f"CURVE is on: pass the public key of {address} (server_key)")
            z.setsockopt(zmq.CURVE_SERVERKEY, key)
            z.setsockopt(zmq.CURVE_SECRETKEY, self.config.curve_secret_key or b"")
            z.setsockopt(zmq.CURVE_PUBLICKEY, self.config.curve_public_key or b"")
        try:
            z.connect(address)
        except zmq.ZMQError as exc:
            z.close(0)
            raise BusError(f"cannot connect to {address}: {exc}") from exc
        sock = _Sock(z, address, router=False)
        link = _Link(sock, None)
        sock.link = link
        self._add_sock(sock)
        limit = self.config.connect_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(self._handshake(link), limit)
        except TimeoutError:
            await self._drop_sock(sock)
            raise RequestTimeout(
                f"no Hello from {address} within {limit:g} s: is an endpoint bound there "
                "(and, over tcp, do the CURVE keys match)?"
            ) from None
        except BaseException:
            await self._drop_sock(sock)
            raise

    async def request(
        self,
        peer: str,
        body: Body,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 -- per-call timeouts are the bus contract
        episode: str = "",
        turn: int = 0,
    ) -> Body:
        """Send ``body`` to ``peer`` and return its reply body (see the module contracts)."""
        link = self._live_link(peer)
        if self._n_pending >= self.config.max_pending:
            raise BusError(
                f"{self._n_pending} requests already pending (max_pending); await earlier "
                "replies before sending more or raise BusConfig.max_pending"
            )
        loop = self._loop
        assert loop is not None  # _live_link found a link, so the endpoint is started
        rid = next(self._ids)
        env = Envelope(
            body=_any(body),
            sender=self.name,
            id=rid,
            expects_reply=True,
            episode=episode,
            turn=turn,
        )
        frames = self._encode(env)
        fut: asyncio.Future[Body] = loop.create_future()
        link.pending[rid] = fut
        self._n_pending += 1
        limit = self.config.request_timeout if timeout is None else timeout
        timer = loop.call_later(limit, self._expire, link, rid, limit)
        try:
            if not self._send_now(link, frames):
                await self._send_later(link, frames, limit)
            return await fut
        finally:
            timer.cancel()
            link.pending.pop(rid, None)
            self._n_pending -= 1

    async def send(self, peer: str, body: Body, *, episode: str = "", turn: int = 0) -> None:
        """Send ``body`` to ``peer`` without waiting for an answer (order kept per peer)."""
        link = self._live_link(peer)
        frames = self._encode(
            Envelope(body=_any(body), sender=self.name, episode=episode, turn=turn)
        )
        if not self._send_now(link, frames):
            await self._send_later(link, frames, self.config.request_timeout)

    async def publish(self, channel: str, body: Body, *, episode: str = "", turn: int = 0) -> int:
        """Send ``body`` on ``channel`` to every peer subscribed to it; returns how many."""
        env = Envelope(
            body=_any(body), sender=self.name, channel=channel, episode=episode, turn=turn
        )
        frames = self._encode(env)
        count = 0
        for link in list(self._links.values()):
            if link.alive and any(channel.startswith(p) for p in link.subscriptions):
                try:
                    if not self._send_now(link, frames):
                        await self._send_later(link, frames, self.config.request_timeout)
                except PeerDead:
                    continue  # a dead subscriber is not the publisher's failure
                count += 1
        return count

    def subscribe(
        self, channel: str, handler: Handler, *, task: bool = False
    ) -> asyncio.Future[None]:
        """Receive broadcasts whose channel starts with ``channel`` (``""``: all of them).

        Returns a future that is done once every peer connected now has acknowledged; peers
        that connect later learn the subscription from this endpoint's ``Hello``. ``task``
        is as for :meth:`on`.
        """
        self._start()
        known = {prefix for prefix, _ in self._subs}
        self._subs.append((channel, _in_task(handler) if task else handler))
        if channel in known:
            return self._done_future()
        return self._announce(Subscribe(channels=[channel]))

    def unsubscribe(self, channel: str) -> asyncio.Future[None]:
        """Stop receiving broadcasts for the prefix ``channel`` (all its handlers)."""
        self._start()
        self._subs = [(p, h) for p, h in self._subs if p != channel]
        return self._announce(Subscribe(channels=[channel], unsubscribe=True))

    async def wait_for_peer(self, name: str, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Return once ``name`` is a live peer; raise :class:`RequestTimeout` after ``timeout``."""
        self._start()

        async def wait() -> None:
            while name not in self._links or not self._links[name].alive:
                assert self._peer_change is not None
                await asyncio.shield(self._peer_change)

        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise RequestTimeout(f"peer {name!r} did not connect within {timeout} s") from None

    async def close(self) -> None:
        """Say ``Bye`` to every peer, fail pending requests, close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        bye = self._codec.encode(Envelope(body=Bye(reason="closed"), sender=self.name))
        for link in list(self._links.values()):
            if link.alive:
                self._try_send(link, bye)
            self._fail_link(link, BusError(f"endpoint {self.name} closed"))
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        if self._ticker is not None:
            tasks.append(self._ticker)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in list(self._socks):
            self._close_sock(sock)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._own_context:
            self._ctx.term()

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- setup -----------------------------------------------------------------------

    def _start(self) -> None:
        if self._closed:
            raise BusError(f"endpoint {self.name} is closed; make a new one")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._peer_change = self._loop.create_future()
            self._ticker = self._loop.create_task(self._tick())

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        z: zmq.Socket[bytes] = zmq.Socket(self._ctx, kind)
        z.setsockopt(zmq.LINGER, 0)
        z.setsockopt(zmq.SNDHWM, self.config.hwm)
        z.setsockopt(zmq.RCVHWM, self.config.hwm)
        z.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes + 1024)
        return z

    def _add_sock(self, sock: _Sock) -> None:
        assert self._loop is not None
        self._socks.append(sock)
        self._loop.add_reader(sock.fd, self._drain, sock)
        sock.reading = True
        self._wake(sock)  # messages may have queued before the reader was registered

    async def _drop_sock(self, sock: _Sock) -> None:
        self._close_sock(sock)

    def _close_sock(self, sock: _Sock) -> None:
        for link in [*sock.links.values(), *([sock.link] if sock.link else [])]:
            self._fail_link(link, BusError(f"socket {sock.address} closed"))
            if self._links.get(link.name) is link:
                del self._links[link.name]
        if sock in self._socks:
            self._socks.remove(sock)
        if sock.reading and self._loop is not None:
            self._loop.remove_reader(sock.fd)
            sock.reading = False
        sock.z.close(0)

    async def _start_authenticator(self) -> None:
        if self._auth is not None:
            return
        from zmq.auth import CURVE_ALLOW_ANY
        from zmq.auth.asyncio import AsyncioAuthenticator

        allowed = self.config.curve_allowed_clients
        auth = AsyncioAuthenticator(self._ctx)
        try:
            auth.start()
        except zmq.ZMQError as exc:
            raise ConfigError(
                "another CURVE endpoint already runs a ZAP handler in this ZeroMQ context; "
                f"give this endpoint its own context ({exc})"
            ) from exc
        if allowed is None:
            auth.configure_curve(domain="*", location=CURVE_ALLOW_ANY)
        else:
            auth.configure_curve_callback(
                domain=_ZAP_DOMAIN, credentials_provider=_KeyList(allowed)
            )
        self._auth = auth

    # --- receiving -------------------------------------------------------------------

    def _drain(self, sock: _Sock) -> None:
        """The one receive loop of ``sock``: drain it with non-blocking reads.

        The event loop calls this when the socket's descriptor turns readable (and
        :meth:`_wake` when a send may have swallowed that signal). Running as a reader
        callback rather than a task that awaits a poll saves one event-loop round per wake,
        which is most of a round trip's Python overhead. At most ``_BATCH`` messages are
        read per call so a flood cannot starve other tasks; the rest are read next round.
        """
        sock.scheduled = False
        if sock.draining or not sock.reading:
            return
        sock.draining = True
        assert self._loop is not None
        self._now = self._loop.time()  # one clock read per round, not per message
        # Parts are read one by one as zmq.Frame objects, whose ``more`` flag is a cheap
        # C call: recv_multipart, or bytes plus getsockopt(RCVMORE), cost ~1.5x as much.
        # A multipart message arrives whole or not at all, so only the first read may fail.
        z = sock.z
        recv_bytes: Callable[[], bytes] = functools.partial(_recv, z, _NOBLOCK)
        recv_frame: Callable[[], zmq.Frame] = functools.partial(_recv, z, _NOBLOCK, False)  # type: ignore[assignment]
        router = sock.router
        on_frames = self._on_frames
        try:
            for _ in range(_BATCH):
                try:
                    if router:  # a ROUTER message is the routing id, then at least one part
                        rid: bytes | None = recv_bytes()
                        part = recv_frame()
                    else:
                        rid = None
                        part = recv_frame()
                except zmq.Again:
                    return
                frames = [part.bytes]
                while part.more:
                    part = recv_frame()
                    frames.append(part.bytes)
                on_frames(sock, rid, frames)
            self._wake(sock)  # more may be waiting: continue after other callbacks ran
        except zmq.ZMQError as exc:
            log.warning("%s: receive on %s failed: %s", self.name, sock.address, exc)
        finally:
            sock.draining = False

    def _wake(self, sock: _Sock) -> None:
        """Queue a drain of ``sock`` (a no-op if one is queued already)."""
        if not sock.scheduled and self._loop is not None:
            sock.scheduled = True
            self._loop.call_soon(self._drain, sock)

    def _on_frames(self, sock: _Sock, rid: bytes | None, frames: list[bytes]) -> None:
        """Handle one received message; never raises (a bad peer must not stop the loop)."""
        self.stats.received += 1
        link = sock.link if rid is None else sock.links.get(rid)
        try:
            env = self._codec.decode(frames)
        except ProtocolError as exc:
            self._bad_message(sock, rid, link, frames, exc)
            return
        try:
            self._dispatch(sock, rid, link, env)
        except Exception:  # a bug in dispatch must not end the receive loop
            log.exception("%s: failed to dispatch a %s from %s", self.name, env.kind, env.sender)

    def _dispatch(self, sock: _Sock, rid: bytes | None, link: _Link | None, env: Envelope) -> None:
        body = env.body
        kind = type(body)
        if link is None:  # a ROUTER peer that has not said Hello (yet, or since it died)
            if kind is Hello:
                self._accept_hello(sock, rid, env)
            elif kind is not Bye and (env.expects_reply or kind is Heartbeat):
                message = f"say Hello first: {self.name} does not know this connection"
                self._answer(sock, rid, env, Error(code="hello_required", message=message))
            return
        assert self._loop is not None
        link.last_heard = self._now
        if not link.alive and not sock.router and link.name:
            self._start_rehello(link)
        if env.reply_to:
            fut = link.pending.pop(env.reply_to, None)
            if fut is None or fut.done():
                self.stats.late_replies += 1
            elif isinstance(body, Error):
                fut.set_exception(RemoteError(body.code, body.message, peer=link.name))
                if body.code == "hello_required" and not sock.router and link.name:
                    self._start_rehello(link)  # the bound side forgot us: introduce again
            else:
                fut.set_result(body)
            return
        if kind is Heartbeat:
            return
        if env.channel:
            self._deliver_broadcast(env)
            return
        if kind is Hello or kind is Subscribe or kind is Bye or kind is Error:
            self._control(sock, rid, link, env)
            return
        handler = self._handlers.get(kind)
        if env.expects_reply:
            self._run_request(link, env, handler)
        elif handler is None:
            self.stats.unhandled += 1
            log.debug("%s: no handler for one-way %s from %s", self.name, env.kind, link.name)
        else:
            self._run_oneway(handler, env)

    def _control(self, sock: _Sock, rid: bytes | None, link: _Link, env: Envelope) -> None:
        body = env.body
        if isinstance(body, Hello):
            if sock.router:
                self._accept_hello(sock, rid, env)
        elif isinstance(body, Subscribe):
            if body.unsubscribe:
                link.subscriptions.difference_update(body.channels)
            else:
                link.subscriptions.update(body.channels)
            if env.expects_reply:
                self._answer(sock, rid, env, Ok())
        elif isinstance(body, Bye):
            self._peer_died(link, f"{link.name} said goodbye ({body.reason or 'no reason'})")
        elif isinstance(body, Error):
            if body.code == "hello_required" and not sock.router and link.name:
                self._start_rehello(link)
            else:
                log.warning(
                    "%s: %s sent error %s: %s", self.name, link.name, body.code, body.message
                )

    def _accept_hello(self, sock: _Sock, rid: bytes | None, env: Envelope) -> None:
        hello = env.body
        assert isinstance(hello, Hello)
        assert rid is not None
        name = hello.name
        refusal: Error | None = None
        existing = self._links.get(name)
        if SCHEMA_VERSION not in hello.schemas:
            refusal = Error(
                code="unsupported_version",
                message=f"{self.name} speaks schema {SCHEMA_VERSION}, you offered {hello.schemas}",
            )
        elif not name or name == self.name:
            refusal = Error(code="bad_name", message=f"peer name {name!r} is empty or mine")
        elif (
            existing is not None
            and existing.alive
            and not (existing.sock is sock and existing.rid == rid)
        ):
            if existing.rid is not None and not self._probe(existing):
                self._peer_died(existing, f"{name} reconnected from a new socket")
            else:
                refusal = Error(
                    code="duplicate_name",
                    message=f"a peer named {name!r} is already connected to {self.name}; "
                    "give each endpoint a unique name",
                )
        if refusal is not None:
            self._answer(sock, rid, env, refusal)
            return
        link = sock.links.get(rid)
        if link is None:
            link = _Link(sock, rid, name=name)
            sock.links[rid] = link
        self._admit(link, hello)
        self._answer(sock, rid, env, self._hello())

    def _admit(self, link: _Link, hello: Hello) -> None:
        assert self._loop is not None
        link.alive = True
        link.name = hello.name
        link.last_heard = self._loop.time()
        link.timeout = max(self.config.peer_timeout, 2.5 * hello.heartbeat_interval)
        link.subscriptions = set(hello.subscriptions)
        self._links[hello.name] = link
        self._peers_changed()

    def _probe(self, link: _Link) -> bool:
        """Whether a ROUTER peer's connection still exists (sends it a heartbeat)."""
        frames = self._codec.encode(Envelope(body=Heartbeat(), sender=self.name))
        try:
            link.sock.z.send_multipart([link.rid or b"", *frames], _NOBLOCK)
        except zmq.Again:
            return True  # connected but its queue is full: alive
        except zmq.ZMQError:
            return False
        return True

    def _hello(self) -> Hello:
        return Hello(
            name=self.name,
            schemas=[SCHEMA_VERSION],
            heartbeat_interval=self.config.heartbeat_interval,
            subscriptions=sorted({prefix for prefix, _ in self._subs}),
        )

    def _bad_message(
        self,
        sock: _Sock,
        rid: bytes | None,
        link: _Link | None,
        frames: Sequence[Frame],
        exc: ProtocolError,
    ) -> None:
        self.stats.bad_messages += 1
        if self.stats.bad_messages <= 10 or self.stats.bad_messages % 1000 == 0:
            who = link.name if link is not None else repr(rid)
            log.warning(
                "%s: bad message #%d from %s: %s",
                self.name,
                self.stats.bad_messages,
                who,
                exc.reason,
            )
        head = _Head()
        if frames:
            try:
                head = _salvage.decode(frames[0])
            except (msgspec.DecodeError, ValueError, TypeError):
                head = _Head()
        if link is not None and head.reply_to:
            fut = link.pending.pop(head.reply_to, None)
            if fut is not None and not fut.done():
                fut.set_exception(RemoteError(exc.code, exc.reason, peer=link.name))
            return
        if sock.router and rid is None:
            return
        error = Envelope(
            body=Error(code=exc.code, message=exc.reason[:1000]),
            sender=self.name,
            reply_to=head.id if head.expects_reply else 0,
        )
        self._raw_send(sock, rid, self._codec.encode(error))

    # --- handlers --------------------------------------------------------------------

    def _run_request(self, link: _Link, env: Envelope, handler: Handler | None) -> None:
        if handler is None:
            message = f"{self.name} has no handler for {env.kind!r}"
            self._reply(link, env, Error(code="no_handler", message=message))
            return
        if self._n_handlers >= self.config.max_handlers:
            message = f"{self.name} is running {self._n_handlers} handlers; retry later"
            self._reply(link, env, Error(code="overloaded", message=message, retryable=True))
            return
        try:
            coro = handler(env)
            yielded = coro.send(None) if isinstance(coro, types.CoroutineType) else None
        except StopIteration as stop:
            self._reply(link, env, stop.value)
            return
        except Exception as exc:
            self._reply(link, env, self._handler_failed(env, exc))
            return
        self._n_handlers += 1  # counted from now: the bound covers tasks not yet started
        self._spawn(self._finish_request(link, env, coro, yielded))

    async def _finish_request(
        self, link: _Link, env: Envelope, coro: Awaitable[Any], yielded: Any
    ) -> None:
        try:
            if isinstance(coro, types.CoroutineType):
                result = await _resume(coro, yielded)
            else:
                result = await coro
        except Exception as exc:
            result = self._handler_failed(env, exc)
        finally:
            self._n_handlers -= 1
        if link.alive:
            self._reply(link, env, result)

    def _run_oneway(self, handler: Handler, env: Envelope) -> None:
        try:
            coro = handler(env)
            yielded = coro.send(None) if isinstance(coro, types.CoroutineType) else None
        except StopIteration:
            return
        except Exception as exc:
            self._handler_failed(env, exc)
            return
        self._spawn(self._finish_oneway(env, coro, yielded))

    async def _finish_oneway(self, env: Envelope, coro: Awaitable[Any], yielded: Any) -> None:
        try:
            if isinstance(coro, types.CoroutineType):
                await _resume(coro, yielded)
            else:
                await coro
        except Exception as exc:
            self._handler_failed(env, exc)

    def _handler_failed(self, env: Envelope, exc: Exception) -> Error:
        self.stats.handler_errors += 1
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, RuntimeError) and "inside a task" in str(exc):
            message += (
                " (this handler needs a task before its first await: register it with task=True)"
            )
        log.warning(
            "%s: handler for %s from %s failed: %s", self.name, env.kind, env.sender, message
        )
        return Error(code="handler_failed", message=message)

    def _deliver_broadcast(self, env: Envelope) -> None:
        delivered = False
        for prefix, handler in self._subs:
            if env.channel.startswith(prefix):
                delivered = True
                self._run_oneway(handler, env)
        if not delivered:
            self.stats.unhandled += 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- sending ---------------------------------------------------------------------

    def _encode(self, env: Envelope) -> list[Frame]:
        if self._closed:
            raise BusError(f"endpoint {self.name} is closed")
        frames: list[Frame] = self._codec.encode(env)
        return frames

    def _live_link(self, peer: str) -> _Link:
        link = self._links.get(peer)
        if link is None:
            raise BusError(
                f"{self.name} has no peer named {peer!r} (peers: {sorted(self.peers)}); "
                "connect to it or wait_for_peer first"
            )
        if not link.alive:
            raise PeerDead(f"peer {peer!r} is dead (no heartbeat or said goodbye)")
        return link

    def _send_now(self, link: _Link, frames: list[Frame]) -> bool:
        """Send without waiting; False if the queue is full. Raises PeerDead if gone."""
        sock = link.sock
        z = sock.z
        try:
            if link.rid is not None:
                _send(z, link.rid, _NOBLOCK_MORE)  # all parts go, or none: zmq is atomic
                if len(frames) == 1:
                    _send(z, frames[0], _NOBLOCK)
                else:
                    self._send_tail(z, frames)
            elif len(frames) == 1:
                _send(z, frames[0], _NOBLOCK)
            else:
                self._send_tail(z, frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise BusError(f"send to {link.name} failed: {exc}") from exc
            self._peer_died(link, f"{link.name} disconnected")
            raise PeerDead(f"peer {link.name!r} disconnected") from None
        assert self._loop is not None
        link.last_sent = self._now  # the clock of this loop round
        self.stats.sent += 1
        if not sock.draining:
            # The send may have consumed the descriptor's edge: look again once this
            # event-loop round is over (one look per round, however many sends).
            self._wake(sock)
        return True

    def _send_tail(self, z: zmq.Socket[bytes], frames: list[Frame]) -> None:
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            flags = 0 if i == last else zmq.SNDMORE
            z.send(frame, flags, copy=len(frame) < self._codec.zero_copy_bytes)

    async def _send_later(self, link: _Link, frames: list[Frame], limit: float) -> None:
        """Retry a send whose queue was full, backing off, for up to ``limit`` seconds."""
        assert self._loop is not None
        deadline = self._loop.time() + limit
        delay = 0.0005
        while True:
            await asyncio.sleep(delay)
            if not link.alive:
                raise PeerDead(f"peer {link.name!r} died before the message could be sent")
            if self._send_now(link, frames):
                return
            if self._loop.time() > deadline:
                raise BusError(
                    f"queue to {link.name!r} stayed full for {limit:g} s (hwm "
                    f"{self.config.hwm}); the peer is not keeping up"
                )
            delay = min(delay * 2, 0.05)

    def _try_send(self, link: _Link, frames: list[Frame]) -> None:
        with contextlib.suppress(BusError, zmq.ZMQError):  # best effort: heartbeats, goodbyes
            self._send_now(link, frames)

    def _raw_send(self, sock: _Sock, rid: bytes | None, frames: list[Frame]) -> None:
        """Best-effort send to a connection that may have no link (errors, refusals)."""
        try:
            if rid is not None:
                sock.z.send_multipart([rid, *frames], _NOBLOCK)
            else:
                sock.z.send_multipart(frames, _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("%s: could not answer %r: %s", self.name, rid, exc)
            return
        if not sock.draining:
            self._wake(sock)

    def _answer(self, sock: _Sock, rid: bytes | None, env: Envelope, body: Body) -> None:
        reply = Envelope(
            body=_any(body), sender=self.name, reply_to=env.id if env.expects_reply else 0
        )
        self._raw_send(sock, rid, self._codec.encode(reply))

    def _reply(self, link: _Link, env: Envelope, body: Body | None) -> None:
        if body is None:
            body = Ok()
        elif not isinstance(body, Body):
            body = Error(
                code="handler_failed",
                message=f"handler returned {type(body).__name__}, not a message body",
            )
        reply = Envelope(body=_any(body), sender=self.name, reply_to=env.id, episode=env.episode)
        try:
            frames = self._codec.encode(reply)
        except ProtocolError as exc:
            frames = self._codec.encode(
                Envelope(
                    body=Error(code="bad_message", message=f"reply not sendable: {exc.reason}"),
                    sender=self.name,
                    reply_to=env.id,
                )
            )
        try:
            if not self._send_now(link, frames):
                self._spawn(self._reply_later(link, frames))
        except BusError as exc:
            log.debug("%s: reply to %s lost: %s", self.name, link.name, exc)

    async def _reply_later(self, link: _Link, frames: list[Frame]) -> None:
        try:
            await self._send_later(link, frames, self.config.request_timeout)
        except BusError as exc:
            log.warning("%s: reply to %s lost: %s", self.name, link.name, exc)

    # --- liveness --------------------------------------------------------------------

    async def _handshake(self, link: _Link) -> str:
        """Send Hello until the bound side answers; admit it; return its name."""
        assert self._loop is not None
        delay = 0.001
        while True:
            rid = next(self._ids)
            fut: asyncio.Future[Body] = self._loop.create_future()
            link.pending[rid] = fut
            frames = self._codec.encode(
                Envelope(body=self._hello(), sender=self.name, id=rid, expects_reply=True)
            )
            try:
                sent = self._send_now(link, frames)
                if sent:
                    # Wait a while for the answer, then say Hello again (the first one may
                    # have gone to a peer that restarted in between).
                    done, _ = await asyncio.wait([fut], timeout=max(delay * 50, 0.5))
                    if done:
                        break
                else:
                    await asyncio.sleep(delay)  # not connected yet (IMMEDIATE)
                    delay = min(delay * 2, 0.1)
            finally:
                link.pending.pop(rid, None)
                if fut.done() and not fut.cancelled():
                    # close() may fail this future while the handshake is being cancelled:
                    # mark its exception as seen, or asyncio logs it as never retrieved.
                    fut.exception()
        reply = fut.result()  # raises RemoteError on a refusal
        if not isinstance(reply, Hello):
            raise BusError(f"expected Hello from {link.sock.address}, got {type(reply).__name__}")
        existing = self._links.get(reply.name)
        if existing is not None and existing is not link and existing.alive:
            raise BusError(f"already connected to a peer named {reply.name!r}")
        self._admit(link, reply)
        return str(reply.name)

    def _start_rehello(self, link: _Link) -> None:
        if (link.rehello is None or link.rehello.done()) and self._loop is not None:
            link.rehello = self._loop.create_task(self._rehello(link))
            self._tasks.add(link.rehello)
            link.rehello.add_done_callback(self._tasks.discard)

    async def _rehello(self, link: _Link) -> None:
        try:
            await asyncio.wait_for(self._handshake(link), self.config.peer_timeout)
        except (BusError, TimeoutError) as exc:
            log.debug("%s: handshake again with %s failed: %s", self.name, link.name, exc)
        else:
            log.info("%s: %s is back", self.name, link.name)

    async def _tick(self) -> None:
        """Send heartbeats, declare silent peers dead, retry handshakes with dead ones."""
        assert self._loop is not None
        interval = self.config.heartbeat_interval
        period = min(interval, self.config.peer_timeout / 4) / 2
        beat = self._codec.encode(Envelope(body=Heartbeat(), sender=self.name))
        while True:
            await asyncio.sleep(period)
            for sock in list(self._socks):
                # Read what is waiting first: after the loop was blocked for a while, a
                # peer's heartbeats may sit unread, and a silent-looking peer is not dead.
                # This also covers a descriptor edge that was missed.
                self._drain(sock)
            now = self._now = self._loop.time()
            for sock in list(self._socks):
                links = list(sock.links.values()) if sock.router else [sock.link]
                for link in links:
                    if link is None or not link.name:
                        continue
                    if link.alive and now - link.last_heard > link.timeout:
                        self._peer_died(link, f"no message from {link.name} for {link.timeout:g} s")
                    elif link.alive and now - link.last_sent >= interval:
                        self._try_send(link, beat)
                    elif not link.alive and not sock.router:
                        self._start_rehello(link)

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

    # --- subscriptions ---------------------------------------------------------------

    def _announce(self, body: Subscribe) -> asyncio.Future[None]:
        links = [link.name for link in self._links.values() if link.alive]
        if not links:
            return self._done_future()

        async def tell_all() -> None:
            results = await asyncio.gather(
                *(self.request(name, body) for name in links), return_exceptions=True
            )
            for name, result in zip(links, results, strict=True):
                if isinstance(result, BaseException) and not isinstance(result, PeerDead):
                    log.warning("%s: %s did not take subscription: %r", self.name, name, result)

        task = asyncio.ensure_future(tell_all())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _done_future(self) -> asyncio.Future[None]:
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        fut.set_result(None)
        return fut


def _in_task(handler: Handler) -> Handler:
    """``handler``, made to suspend at once so that all of its body runs inside a task."""

    async def in_task(env: Envelope) -> Body | None:
        await asyncio.sleep(0)
        return await handler(env)

    return in_task


class _KeyList:
    """ZAP credentials provider admitting a fixed set of CURVE client keys."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        self.keys = frozenset(keys)

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys
