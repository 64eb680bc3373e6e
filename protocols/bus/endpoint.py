"""The public :class:`Endpoint`: bind, connect, request, send, publish, subscribe, close.

The contracts (handshake, requests, handlers, liveness, broadcast, CURVE, identity) and the
bounds are documented in the package docstring, :mod:`parley.protocols.bus`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Self

import zmq

from parley.protocols.bus.auth import ZapHandler, curve_client, curve_server, is_loopback
from parley.protocols.bus.config import BusConfig, BusStats
from parley.protocols.bus.core import (
    Admission,
    Handler,
    Link,
    Routes,
    Shared,
    Sock,
    any_body,
    log,
    subscriptions_problem,
    valid_name,
)
from parley.protocols.bus.links import Liveness
from parley.protocols.bus.receive import ReceiveLoop, in_task
from parley.protocols.bus.refuse import RefusalPolicy
from parley.protocols.bus.registry import Registry
from parley.protocols.bus.requests import Requests
from parley.protocols.bus.send import Sender
from parley.protocols.codec import DEFAULT_MAX_MESSAGE_BYTES, Codec
from parley.protocols.errors import BusError, ConfigError, PeerDead, RequestTimeout
from parley.protocols.messages import Body, Bye, Envelope, Heartbeat, Hello, Subscribe, kind_of

GOODBYE_LINGER_MS = 200
"""How long closing sockets may still deliver what was just sent (ZeroMQ ``LINGER``), such as
a ``Bye`` whose acknowledgement did not come in time."""


class Endpoint:
    """A named participant on the bus; see the package docstring for the contracts.

    ``Endpoint(name, *, config=None, context=None)``: ``context`` is the ZeroMQ context to
    create sockets in; endpoints that talk over ``inproc://`` must share one. Without it the
    endpoint makes (and later terminates) its own. All methods must be called from the event
    loop that first used the endpoint.

    It holds its parts (the package docstring says what each does) and owns the sockets:
    it makes them, registers them with the event loop and closes them.
    """

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
        config = config or BusConfig()
        codec = Codec(max_message_bytes=config.max_message_bytes, accept=config.accept)
        self._shared = shared = Shared(name, config, codec)
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._auth: ZapHandler | None = None  # the ZAP handler of a CURVE bind
        self._ticker: asyncio.Task[None] | None = None
        self._routes = routes = Routes()
        self._registry = registry = Registry(shared)
        self._sender = sender = Sender(shared, registry)
        self._requests = requests = Requests(shared, sender)
        self._liveness = liveness = Liveness(shared, registry, sender, requests, routes)
        refusals = RefusalPolicy(shared, registry, sender, routes)
        self._receiver = ReceiveLoop(shared, routes, registry, sender, liveness, refusals)

    # --- public API ------------------------------------------------------------------

    @property
    def config(self) -> BusConfig:
        """Timing, bounds and keys. Replacing it changes them for what happens next (its
        message size limit and accepted kinds stay those the endpoint was made with)."""
        return self._shared.config

    @config.setter
    def config(self, config: BusConfig) -> None:
        self._shared.config = config

    @property
    def stats(self) -> BusStats:
        """Counters of what this endpoint sent, received, refused and dropped."""
        return self._shared.stats

    @property
    def peers(self) -> list[str]:
        """Names of the peers currently connected and alive."""
        return self._registry.alive()

    def farewell(self, peer: str) -> str | None:
        """The reason ``peer`` gave in the last ``Bye`` it sent this endpoint (``""`` for
        none given), or ``None`` when it never said goodbye (it is connected, was lost to a
        closed connection or silence, or was never known). It stays said when the peer comes
        back. Only for peers this endpoint connected to: a bound side forgets its dead
        peers."""
        return self._registry.farewell(peer)

    def peer_key(self, name: str) -> str | None:
        """The CURVE public key (Z85) the peer ``name`` said Hello with; ``None`` when it
        has none (no CURVE on its connection) or is not connected. A handler asks it with
        ``env.sender``, which the bus sets to the name the connection said Hello with."""
        link = self._registry.links.get(name)
        return None if link is None else link.user

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
        accept = self.config.accept
        if accept is not None and kind_of(body_type) not in accept:
            raise ConfigError(
                f"this endpoint's BusConfig.accept ({sorted(accept)}) leaves out "
                f"{kind_of(body_type)!r}: its messages would be refused unread; add it"
            )
        self._routes.handlers[body_type] = in_task(handler) if task else handler

    async def bind(self, address: str) -> str:
        """Listen on ``address`` (``tcp://127.0.0.1:0`` picks a port); returns the address.

        Over ``tcp://`` or ``ipc://`` with CURVE keys in the config, only listed client keys
        can connect.
        A non-loopback ``tcp://`` address without keys raises :class:`ConfigError` unless
        ``BusConfig.allow_insecure_tcp`` is set.
        """
        self._start()
        tcp = address.startswith("tcp://")
        insecure = tcp and not self.config.curve and not self.config.allow_insecure_tcp
        if insecure and not is_loopback(address):
            raise ConfigError(
                f"refusing to listen on {address} without CURVE keys: anyone who can "
                "reach it could connect and take a seat. Make keys (`parley keys new`) "
                "and pass them, bind 127.0.0.1, or allow plain text on a network you "
                "trust (--insecure, BusConfig.allow_insecure_tcp)"
            )
        # CURVE runs over ipc:// as over tcp://: a keyed ipc:// arena had bound in plain text
        # and refused every agent ("bound to another CURVE key": a plain link has no key).
        curve = self.config.curve and (tcp or address.startswith("ipc://"))
        if curve and self.config.curve_allowed_clients is None and not self.config.curve_allow_any:
            raise ConfigError(
                "a CURVE bind needs the client keys it admits (curve_allowed_clients); set "
                "curve_allow_any=True to admit any key (encryption without authentication)"
            )
        z = self._socket(zmq.ROUTER)
        z.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer raises instead of dropping
        # No handover: a connection presenting the routing id of a live one is refused by
        # ZeroMQ, so nobody can take over a peer's connection by copying its id.
        z.setsockopt(zmq.ROUTER_HANDOVER, 0)
        if curve:
            if self._auth is None:
                self._auth = ZapHandler(self._ctx, self.config)
            curve_server(z, self.config)
        try:
            z.bind(address)
        except zmq.ZMQError as exc:
            z.close(0)
            raise BusError(f"cannot bind {address}: {exc}; is another endpoint there?") from exc
        resolved = z.getsockopt_string(zmq.LAST_ENDPOINT)
        sock = self._new_sock(z, resolved, router=True)
        sock.curve = curve
        self._add_sock(sock)
        return resolved

    def set_admission(self, policy: Admission | None) -> None:
        """Decide who may join: ``policy(name, client_key)`` returns ``None`` to admit a
        ``Hello`` or a reason to refuse it (``Error(not_admitted, reason)``).

        ``client_key`` is the CURVE public key (Z85) the connection authenticated with, or
        ``None`` on a socket without CURVE; every later message of that connection is
        checked against it, so a name, once admitted, cannot be used from another key.
        """
        self._liveness.admission = policy

    async def connect(
        self,
        address: str,
        timeout: float | None = None,  # noqa: ASYNC109 -- per-call timeouts are the bus contract
        *,
        server_key: bytes | None = None,
    ) -> str:
        """Connect to the endpoint bound at ``address``; returns its name after ``Hello``.

        ``server_key`` overrides ``BusConfig.curve_server_key`` for this address (``tcp://``
        needs one when CURVE is on; ``ipc://`` uses CURVE when one is known).
        Raises :class:`RequestTimeout` when no handshake completes within ``timeout`` (no one
        bound there, or CURVE keys that do not match), :class:`RemoteError` when refused.
        """
        self._start()
        z = self._socket(zmq.DEALER)
        z.setsockopt(zmq.IMMEDIATE, 1)  # never queue for a connection that does not exist
        # A routing id nobody can guess: 128 random bits (see "Identity" in the package doc).
        z.setsockopt(zmq.ROUTING_ID, f"{self.name}/{os.urandom(16).hex()}".encode())
        key = server_key or self.config.curve_server_key
        if address.startswith("tcp://") and self.config.curve:
            if key is None:
                z.close(0)
                raise ConfigError(f"CURVE is on: pass the public key of {address} (server_key)")
            curve_client(z, self.config, key)
        elif address.startswith("ipc://") and self.config.curve and key is not None:
            curve_client(z, self.config, key)  # (no server key: a plain ipc:// peer, as before)
        try:
            z.connect(address)
        except zmq.ZMQError as exc:
            z.close(0)
            raise BusError(f"cannot connect to {address}: {exc}") from exc
        sock = self._new_sock(z, address, router=False)
        link = Link(sock, None)
        sock.link = link
        self._add_sock(sock)
        limit = self.config.connect_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(self._liveness.handshake(link), limit)
        except TimeoutError:
            self._close_sock(sock)
            raise RequestTimeout(
                f"no Hello from {address} within {limit:g} s: is an endpoint bound there "
                "(and, over tcp, do the CURVE keys match)?"
            ) from None
        except BaseException:
            self._close_sock(sock)
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
        link = self._registry.live(peer)
        return await self._requests.request(link, body, timeout=timeout, episode=episode, turn=turn)

    async def send(self, peer: str, body: Body, *, episode: str = "", turn: int = 0) -> None:
        """Send ``body`` to ``peer`` without waiting for an answer (order kept per peer)."""
        link = self._registry.live(peer)
        sender = self._sender
        frames = sender.encode(
            Envelope(body=any_body(body), sender=self.name, episode=episode, turn=turn)
        )
        if not sender.send_now(link, frames):
            await sender.send_later(link, frames, self.config.request_timeout)

    async def publish(self, channel: str, body: Body, *, episode: str = "", turn: int = 0) -> int:
        """Send ``body`` on ``channel`` to every peer subscribed to it; returns how many."""
        env = Envelope(
            body=any_body(body), sender=self.name, channel=channel, episode=episode, turn=turn
        )
        sender = self._sender
        frames = sender.encode(env)
        count = 0
        for link in self._registry.alive_links():
            if any(channel.startswith(p) for p in link.subscriptions):
                try:
                    if not sender.send_now(link, frames):
                        await sender.send_later(link, frames, self.config.request_timeout)
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
        known = self._routes.prefixes()
        problem = subscriptions_problem(sorted(known | {channel}), self.config.max_subscriptions)
        if problem is not None:  # (peers would refuse it: BusConfig.max_subscriptions)
            raise ConfigError(f"cannot subscribe to {channel[:100]!r}: {problem}")
        self._routes.subs.append((channel, in_task(handler) if task else handler))
        if channel in known:
            return self._done_future()
        return self._announce(Subscribe(channels=[channel]))

    def unsubscribe(self, channel: str) -> asyncio.Future[None]:
        """Stop receiving broadcasts for the prefix ``channel`` (all its handlers)."""
        self._start()
        self._routes.subs = [(p, h) for p, h in self._routes.subs if p != channel]
        return self._announce(Subscribe(channels=[channel], unsubscribe=True))

    async def wait_for_peer(self, name: str, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Return once ``name`` is a live peer; raise :class:`RequestTimeout` after ``timeout``."""
        self._start()

        try:
            await asyncio.wait_for(self._registry.wait_for(name), timeout)
        except TimeoutError:
            raise RequestTimeout(f"peer {name!r} did not connect within {timeout} s") from None

    async def close(self) -> None:
        """Say ``Bye`` to every peer, fail pending requests, close the sockets. Idempotent."""
        if self._shared.closed:
            return
        self._shared.closed = True
        registry = self._registry
        await asyncio.gather(*(self._liveness.goodbye(link) for link in registry.alive_links()))
        for link in list(registry.links.values()):
            registry.fail(link, BusError(f"endpoint {self.name} closed"))
        self._requests.close()
        current = asyncio.current_task()
        tasks = [t for t in self._shared.tasks if t is not current]
        if self._ticker is not None:
            tasks.append(self._ticker)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in list(registry.socks):
            self._close_sock(sock, linger_ms=GOODBYE_LINGER_MS)
        if self._auth is not None:
            self._auth.close()
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
        if self._shared.closed:
            raise BusError(f"endpoint {self.name} is closed; make a new one")
        if self._shared.loop is None:
            loop = self._shared.loop = asyncio.get_running_loop()
            self._registry.start(loop)
            self._ticker = loop.create_task(self._liveness.tick())

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        z: zmq.Socket[bytes] = zmq.Socket(self._ctx, kind)
        z.setsockopt(zmq.LINGER, 0)
        z.setsockopt(zmq.SNDHWM, self.config.hwm)
        z.setsockopt(zmq.RCVHWM, self.config.hwm)
        # ZeroMQ drops the connection of a part over MAXMSGSIZE, telling nobody: set it at
        # the most any parley peer sends (the bus default, 64 MiB, or more), so a message
        # over this endpoint's own lower limit is read and refused bad_message instead.
        largest = max(self.config.max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES)
        z.setsockopt(zmq.MAXMSGSIZE, largest + 1024)
        return z

    def _new_sock(self, z: zmq.Socket[bytes], address: str, *, router: bool) -> Sock:
        assert self._shared.loop is not None
        drain = self._receiver.drain
        return Sock(z, address, router=router, loop=self._shared.loop, drain=drain)

    def _add_sock(self, sock: Sock) -> None:
        self._registry.socks.append(sock)
        sock.loop.add_reader(sock.fd, sock.drain, sock)
        sock.reading = True
        sock.wake()  # messages may have queued before the reader was registered

    def _close_sock(self, sock: Sock, linger_ms: int = 0) -> None:
        self._registry.forget_sock(sock)
        if sock.reading:
            sock.loop.remove_reader(sock.fd)
            sock.reading = False
        sock.z.close(linger_ms)

    # --- subscriptions ---------------------------------------------------------------

    def _announce(self, body: Subscribe) -> asyncio.Future[None]:
        links = self._registry.alive()
        if not links:
            return self._done_future()

        async def tell_all() -> None:
            results = await asyncio.gather(
                *(self.request(name, body) for name in links), return_exceptions=True
            )
            for name, result in zip(links, results, strict=True):
                if isinstance(result, BaseException) and not isinstance(result, PeerDead):
                    log.warning("%s: %s did not take subscription: %r", self.name, name, result)

        return self._shared.spawn(tell_all())

    def _done_future(self) -> asyncio.Future[None]:
        assert self._shared.loop is not None
        fut: asyncio.Future[None] = self._shared.loop.create_future()
        fut.set_result(None)
        return fut
