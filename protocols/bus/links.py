"""Liveness: the ``Hello`` handshake, heartbeats, and retrying the handshake with a peer
that came back.

The connecting side sends ``Hello`` until the bound side answers with its own; the bound side
admits a name once (refusing a live duplicate, probing whether the old connection still
exists). A ticker sends ``Heartbeat`` to peers that have heard nothing for a while and
declares a peer dead when its connection is gone (checked once it has been silent for
:data:`SUSPECT_HEARTBEATS` heartbeat intervals) or when it stays silent past its timeout with
the connection open.

Busy is not dead: a process whose event loop or model holds it for seconds still has its
connection (ZeroMQ's I/O thread and the kernel keep it), so only the generous
``peer_timeout`` (60 s by default) ends it, while a process that died is noticed within a
few heartbeats, by its closed connection.
"""

from __future__ import annotations

import asyncio

import zmq

from parley.protocols.bus.core import (
    NOBLOCK,
    Admission,
    Link,
    Routes,
    Shared,
    Sock,
    log,
    subscriptions_problem,
    valid_name,
)
from parley.protocols.bus.registry import Registry
from parley.protocols.bus.requests import Requests
from parley.protocols.bus.send import Sender
from parley.protocols.codec import Frame
from parley.protocols.errors import BusError
from parley.protocols.messages import SCHEMA_VERSION, Bye, Envelope, Error, Heartbeat, Hello

PROBE_EVERY_S = 0.05
"""Least time between two probes of one peer prompted by duplicate Hellos."""

SUSPECT_HEARTBEATS = 2.5
"""Heartbeat intervals of silence after which a peer's connection is checked each tick."""

GOODBYE_WAIT_S = 1.0
"""Longest wait, when closing, for the peers to acknowledge the ``Bye`` (all at once)."""

MAX_HEARTBEAT_INTERVAL = 60.0
"""Longest heartbeat interval a peer's ``Hello`` may announce; longer counts as this."""


class Liveness:
    """Who is connected: admits peers by their ``Hello``, handshakes, heartbeats, declares
    silent or vanished peers dead, says goodbye. ``admission`` is the policy of
    :meth:`Endpoint.set_admission <parley.protocols.bus.Endpoint.set_admission>`."""

    def __init__(
        self,
        shared: Shared,
        registry: Registry,
        sender: Sender,
        requests: Requests,
        routes: Routes,
    ) -> None:
        self._shared = shared
        self._registry = registry
        self._sender = sender
        self._requests = requests
        self._routes = routes
        self.admission: Admission | None = None

    def accept_hello(self, sock: Sock, rid: bytes | None, env: Envelope) -> None:
        """Admit the ``Hello`` in ``env`` from a bound socket's connection ``rid``, or
        answer why not (a bad name, a live duplicate, an unsupported version, ...)."""
        hello = env.body
        assert isinstance(hello, Hello)
        assert rid is not None
        own = self._shared.name
        if self._shared.closed:  # it said Bye to everyone: a Hello now would undo that for one
            return
        name = hello.name
        user = sock.user if sock.curve else None
        refusal: Error | None = None
        existing = self._registry.links.get(name)
        limit = self._shared.config.max_subscriptions
        if SCHEMA_VERSION not in hello.schemas:
            refusal = Error(
                code="unsupported_version",
                message=f"{own} speaks schema {SCHEMA_VERSION}, you offered {hello.schemas}",
            )
        elif not valid_name(name) or name == own:
            refusal = Error(
                code="bad_name",
                message=f"peer name {name[:200]!r} is empty, mine, over 200 bytes or has a NUL",
            )
        elif problem := subscriptions_problem(hello.subscriptions, limit):
            refusal = Error(code="too_many_subscriptions", message=problem)
        elif (known := sock.links.get(rid)) is not None and known.name and known.name != name:
            # One connection, one name: a rename would leave it holding two (two seats).
            refusal = Error(
                code="bad_name",
                message=f"this connection is {known.name!r}; connect again to be {name!r}",
            )
        elif self.admission is not None and (reason := self.admission(name, user)):
            refusal = Error(code="not_admitted", message=reason)
        elif (
            existing is not None
            and existing.alive
            and not (existing.sock is sock and existing.rid == rid)
        ):
            if existing.rid is not None and not self._probe(existing):
                self._registry.peer_died(existing, f"{name} reconnected from a new socket")
            else:
                refusal = Error(
                    code="duplicate_name",
                    message=f"a peer named {name!r} is already connected to {own}; "
                    "give each endpoint a unique name",
                )
        if refusal is not None:
            self._sender.answer(sock, rid, env, refusal)
            return
        link = sock.links.get(rid)
        if link is None:
            link = Link(sock, rid, name=name)
            sock.links[rid] = link
        link.user = user
        self._admit(link, hello)
        self._sender.answer(sock, rid, env, self._hello())

    def said_goodbye(self, link: Link, reason: str) -> None:
        """``link``'s peer said ``Bye`` with ``reason``: it is gone (and said so)."""
        link.farewell = reason
        self._registry.peer_died(link, f"{link.name} said goodbye ({reason or 'no reason'})")

    def _admit(self, link: Link, hello: Hello) -> None:
        loop = self._shared.loop
        assert loop is not None
        config = self._shared.config
        link.alive = True
        link.name = hello.name
        link.last_heard = loop.time()
        # A peer's announced interval stretches its timeout, up to a bound: an infinite (or
        # NaN) one would make a peer that goes silent never die.
        interval = hello.heartbeat_interval
        if not 0 < interval <= MAX_HEARTBEAT_INTERVAL:  # (NaN fails every comparison)
            interval = MAX_HEARTBEAT_INTERVAL if interval > 0 else config.heartbeat_interval
        link.timeout = max(config.peer_timeout, 2.5 * interval)
        link.subscriptions = set(hello.subscriptions)
        self._registry.admit(link)

    def _probe(self, link: Link) -> bool:
        """Whether a ROUTER peer's connection still exists (sends it a heartbeat). At most
        one probe per :data:`PROBE_EVERY_S`: a stranger's duplicate Hellos had made 193,800
        heartbeats to the live peer in 10 s; within it, the last answer holds."""
        assert self._shared.loop is not None
        now = self._shared.loop.time()
        if now - link.probed_at < PROBE_EVERY_S:
            return True  # (a failed probe declares the link dead: this one was alive)
        link.probed_at = now
        frames = self._shared.codec.encode(Envelope(body=Heartbeat(), sender=self._shared.name))
        try:
            link.sock.z.send_multipart([link.rid or b"", *frames], NOBLOCK)
        except zmq.Again:
            return True  # connected but its queue is full: alive
        except zmq.ZMQError:
            return False
        return True

    def _hello(self) -> Hello:
        return Hello(
            name=self._shared.name,
            schemas=[SCHEMA_VERSION],
            heartbeat_interval=self._shared.config.heartbeat_interval,
            subscriptions=sorted(self._routes.prefixes()),
        )

    async def handshake(self, link: Link) -> str:
        """Send Hello on a connecting ``link`` until the bound side answers; admit it;
        return its name. Raises :class:`RemoteError` when refused."""
        delay = 0.001
        while True:
            rid, fut = self._requests.open(link)
            frames = self._shared.codec.encode(
                Envelope(body=self._hello(), sender=self._shared.name, id=rid, expects_reply=True)
            )
            try:
                sent = self._sender.send_now(link, frames)
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
                # (close() may fail this future while the handshake is being cancelled.)
                self._requests.settle(link, rid, fut)
        reply = fut.result()  # raises RemoteError on a refusal
        if not isinstance(reply, Hello):
            raise BusError(f"expected Hello from {link.sock.address}, got {type(reply).__name__}")
        problem = subscriptions_problem(reply.subscriptions, self._shared.config.max_subscriptions)
        if not valid_name(reply.name) or problem:
            raise BusError(
                f"{link.sock.address} answered Hello as {reply.name[:200]!r}: "
                f"{problem or 'not a valid peer name'}"
            )
        existing = self._registry.links.get(reply.name)
        if existing is not None and existing is not link and existing.alive:
            raise BusError(f"already connected to a peer named {reply.name!r}")
        self._admit(link, reply)
        return str(reply.name)

    async def goodbye(self, link: Link) -> None:
        """Say ``Bye`` on ``link`` as a request, and wait up to :data:`GOODBYE_WAIT_S` for its
        ``Ok``: a goodbye lost on a loaded host (or while this process was paused) makes the
        peer take this endpoint for lost rather than closed (``parley agent`` then waits for
        it and exits non-zero). A peer that does not answer in time is left as it is. (Not
        ``request``: this endpoint is closed to new requests already.)"""
        rid, fut = self._requests.open(link)
        bye = Envelope(
            body=Bye(reason="closed"), sender=self._shared.name, id=rid, expects_reply=True
        )
        try:
            if self._sender.send_now(link, self._shared.codec.encode(bye)):  # (full: no Bye)
                await asyncio.wait([fut], timeout=GOODBYE_WAIT_S)
        except BusError:
            pass  # the peer is gone already: nobody to say goodbye to
        finally:
            self._requests.settle(link, rid, fut)  # (an Error reply, or the peer died)

    def start_rehello(self, link: Link) -> None:
        """Repeat the handshake on a connecting ``link`` in a task, unless one runs."""
        if (link.rehello is None or link.rehello.done()) and self._shared.loop is not None:
            link.rehello = self._shared.spawn(self._rehello(link))

    async def _rehello(self, link: Link) -> None:
        name = self._shared.name
        try:
            await asyncio.wait_for(self.handshake(link), self._shared.config.peer_timeout)
        except (BusError, TimeoutError) as exc:
            log.debug("%s: handshake again with %s failed: %s", name, link.name, exc)
        else:
            log.info("%s: %s is back", name, link.name)

    def _connected(self, link: Link, beat: list[Frame]) -> bool:
        """Whether ``link``'s connection still exists, told by ZeroMQ's I/O thread, which
        neither a busy event loop nor a busy model starves: sends ``beat`` to it.

        A bound ROUTER raises ``EHOSTUNREACH`` for a vanished connection (``send_now``
        declares the peer dead); a connecting DEALER (``IMMEDIATE``) cannot queue when it
        has no connection. Its queue being full at the high-water mark looks the same to a
        DEALER: a peer that let 10,000 messages pile up unread is not counted alive.
        """
        try:
            return self._sender.send_now(link, beat)
        except BusError:
            return False

    async def tick(self) -> None:
        """The ticker: send heartbeats, declare dead the peers whose connection is gone or
        who stayed silent past their timeout, retry handshakes with dead ones.

        Silence counts only while this event loop runs on time. When the ticker wakes late
        (the process was stalled: a loaded host, a VM pause, a long synchronous stretch),
        the lateness is credited to every link: peers in this process were stalled too, and
        remote peers' heartbeats sat unread. Peers over ``inproc://`` live in this process
        and never die of silence; they leave by ``Bye`` or by closing their socket.
        """
        shared = self._shared
        loop = shared.loop
        assert loop is not None
        interval = shared.config.heartbeat_interval
        period = min(interval, shared.config.peer_timeout / 4) / 2
        # Past this much silence a peer's connection is checked on each tick: a process that
        # died closed it (its kernel did), while a busy or paused one keeps it open.
        suspect = SUSPECT_HEARTBEATS * interval
        beat = shared.codec.encode(Envelope(body=Heartbeat(), sender=shared.name))
        last = loop.time()
        while True:
            await asyncio.sleep(period)
            woke = loop.time()
            stall, last = max(0.0, woke - last - period), woke
            for sock in list(self._registry.socks):
                # Read what is waiting first: after the loop was blocked for a while, a
                # peer's heartbeats may sit unread, and a silent-looking peer is not dead.
                # This also covers a descriptor edge that was missed. Whatever a message
                # does, the ticker must live on: without it no peer is ever declared dead.
                try:
                    sock.drain(sock)
                except Exception:
                    shared.log_limited("tick_drain", "%s: receive failed in the ticker",
                                       shared.name, exc_info=True)  # fmt: skip
            now = shared.now = loop.time()
            for sock in list(self._registry.socks):
                for link in sock.all_links():
                    if not link.name:
                        continue
                    if stall:
                        link.last_heard = min(now, link.last_heard + stall)
                    silent = 0.0 if sock.inproc else now - link.last_heard
                    if link.alive and silent > link.timeout:
                        self._registry.peer_died(
                            link,
                            f"no message from {link.name} for {link.timeout:g} s although its "
                            "connection is open (raise BusConfig.peer_timeout, --peer-timeout, "
                            "if it is only busy)",
                        )
                    elif link.alive and silent > suspect and not self._connected(link, beat):
                        self._registry.peer_died(link, f"lost the connection to {link.name}")
                    elif link.alive and now - link.last_sent >= interval:
                        self._sender.try_send(link, beat)
                    elif not link.alive and not sock.router:
                        self.start_rehello(link)
