"""The public :class:`Endpoint`: bind, connect, request, send, publish, subscribe, close.

The contracts (handshake, requests, handlers, liveness, broadcast, CURVE, identity) and the
bounds are documented in the package docstring, :mod:`parley.protocols.bus`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Self

import zmq

from parley.protocols.bus.auth import ZapHandler, curve_client, curve_server, is_loopback
from parley.protocols.bus.core import (
    Admission,
    Handler,
    _any,
    _Link,
    _Sock,
    log,
    subscriptions_problem,
)
from parley.protocols.bus.receive import _in_task, _Receiver
from parley.protocols.codec import DEFAULT_MAX_MESSAGE_BYTES
from parley.protocols.errors import BusError, ConfigError, PeerDead, RequestTimeout
from parley.protocols.messages import Body, Bye, Envelope, Heartbeat, Hello, Subscribe, kind_of

GOODBYE_LINGER_MS = 200
"""How long closing sockets may still deliver what was just sent (ZeroMQ ``LINGER``), such as
a ``Bye`` whose acknowledgement did not come in time."""


class Endpoint(_Receiver):
    """A named participant on the bus; see the package docstring for the contracts.

    ``Endpoint(name, *, config=None, context=None)``: ``context`` is the ZeroMQ context to
    create sockets in; endpoints that talk over ``inproc://`` must share one. Without it the
    endpoint makes (and later terminates) its own. All methods must be called from the event
    loop that first used the endpoint.
    """

    # --- public API ------------------------------------------------------------------

    @property
    def peers(self) -> list[str]:
        """Names of the peers currently connected and alive."""
        return [name for name, link in self._links.items() if link.alive]

    def peer_key(self, name: str) -> str | None:
        """The CURVE public key (Z85) the peer ``name`` said Hello with; ``None`` when it
        has none (no CURVE on its connection) or is not connected. A handler asks it with
        ``env.sender``, which the bus sets to the name the connection said Hello with."""
        link = self._links.get(name)
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
        self._handlers[body_type] = _in_task(handler) if task else handler

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
        sock = _Sock(z, resolved, router=True)
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
        self._admission = policy

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
        sock = _Sock(z, address, router=False)
        link = _Link(sock, None)
        sock.link = link
        self._add_sock(sock)
        limit = self.config.connect_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(self._handshake(link), limit)
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
        self._arm(link, rid, limit)
        try:
            if not self._send_now(link, frames):
                await self._send_later(link, frames, limit)
            return await fut
        finally:
            link.pending.pop(rid, None)
            self._n_pending -= 1
            if fut.done() and not fut.cancelled():
                # The peer died while the send waited for room: its death failed this
                # future too, and nobody awaits it. Seen, or asyncio prints "Future
                # exception was never retrieved" when it is collected.
                fut.exception()

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
        problem = subscriptions_problem(sorted(known | {channel}), self.config.max_subscriptions)
        if problem is not None:  # (peers would refuse it: BusConfig.max_subscriptions)
            raise ConfigError(f"cannot subscribe to {channel[:100]!r}: {problem}")
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
        await asyncio.gather(*(self._goodbye(link) for link in self._links.values() if link.alive))
        for link in list(self._links.values()):
            self._fail_link(link, BusError(f"endpoint {self.name} closed"))
        self._disarm()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        if self._ticker is not None:
            tasks.append(self._ticker)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in list(self._socks):
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
        # ZeroMQ drops the connection of a part over MAXMSGSIZE, telling nobody: set it at
        # the most any parley peer sends (the bus default, 64 MiB, or more), so a message
        # over this endpoint's own lower limit is read and refused bad_message instead.
        largest = max(self.config.max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES)
        z.setsockopt(zmq.MAXMSGSIZE, largest + 1024)
        return z

    def _add_sock(self, sock: _Sock) -> None:
        assert self._loop is not None
        self._socks.append(sock)
        self._loop.add_reader(sock.fd, self._drain, sock)
        sock.reading = True
        self._wake(sock)  # messages may have queued before the reader was registered

    def _close_sock(self, sock: _Sock, linger_ms: int = 0) -> None:
        for link in [*sock.links.values(), *([sock.link] if sock.link else [])]:
            self._fail_link(link, BusError(f"socket {sock.address} closed"))
            if self._links.get(link.name) is link:
                del self._links[link.name]
        if sock in self._socks:
            self._socks.remove(sock)
        if sock.reading and self._loop is not None:
            self._loop.remove_reader(sock.fd)
            sock.reading = False
        sock.z.close(linger_ms)

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
