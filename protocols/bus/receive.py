"""The receive loop: drain each socket, decode, dispatch, run handlers eagerly.

Each socket has one receive loop, :meth:`ReceiveLoop.drain`. The event loop runs it when the
socket's ZeroMQ descriptor turns readable (``loop.add_reader``); it then drains every queued
message with non-blocking ``recv`` calls, resolving reply futures and starting handlers in
place. A per-message ``await recv()`` costs ~11x more, and a task that awaits a poll costs an
extra event-loop round per wake. Nothing a peer sends can stop the loop: an undecodable
message is answered ``Error`` (with the request id salvaged where possible) and counted.
"""

from __future__ import annotations

import asyncio
import functools
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

import zmq

from parley.protocols.bus.core import (
    NOBLOCK,
    Handler,
    Link,
    Routes,
    Shared,
    Sock,
    log,
    subscriptions_problem,
    zmq_recv,
)
from parley.protocols.bus.links import Liveness
from parley.protocols.bus.refuse import MAX_FRAMES, PEEK_BYTES, STRANGER_ROUND, RefusalPolicy
from parley.protocols.bus.registry import Registry
from parley.protocols.bus.send import Sender
from parley.protocols.errors import ProtocolError, RemoteError
from parley.protocols.messages import (
    Body,
    Bye,
    Envelope,
    Error,
    Heartbeat,
    Hello,
    Ok,
    Subscribe,
)

_BATCH = 2000  # messages read per receive-loop round before yielding to other tasks
_BATCH_BYTES = 4 << 20  # ... or bytes: 25 large messages a round had held the loop 5 s


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


class ReceiveLoop:
    """Reads each socket, decodes, and routes every message: replies to their futures,
    session messages to :class:`~parley.protocols.bus.links.Liveness`, requests and one-way
    sends to their handlers (run eagerly), what should not have come to the
    :class:`~parley.protocols.bus.refuse.RefusalPolicy`."""

    def __init__(
        self,
        shared: Shared,
        routes: Routes,
        registry: Registry,
        sender: Sender,
        liveness: Liveness,
        refusals: RefusalPolicy,
    ) -> None:
        self._shared = shared
        self._registry = registry
        self._stats = shared.stats
        self._codec = shared.codec
        self._routes = routes
        self._handlers = routes.handlers  # (changed in place by Endpoint.on, never replaced)
        self._sender = sender
        self._liveness = liveness
        self._refusals = refusals
        self.handlers_running = 0  # bounded by BusConfig.max_handlers
        self._strangers = 0  # messages from strangers handled in this receive round

    def drain(self, sock: Sock) -> None:
        """The one receive loop of ``sock``: drain it with non-blocking reads.

        The event loop calls this when the socket's descriptor turns readable (and
        :meth:`Sock.wake` when a send may have swallowed that signal). Running as a reader
        callback rather than a task that awaits a poll saves one event-loop round per wake,
        which is most of a round trip's Python overhead. At most ``_BATCH`` messages (of
        them at most ``STRANGER_ROUND`` from strangers) are read per call so a flood cannot
        starve other tasks; the rest are read next round.
        """
        sock.scheduled = False
        if sock.draining or not sock.reading:
            return
        sock.draining = True
        self._shared.now = sock.loop.time()  # one clock read per round, not per message
        # Parts are read one by one as zmq.Frame objects, whose ``more`` flag is a cheap
        # C call: recv_multipart, or bytes plus getsockopt(RCVMORE), cost ~1.5x as much.
        # A multipart message arrives whole or not at all, so only the first read may fail.
        z = sock.z
        recv_bytes: Callable[[], bytes] = functools.partial(zmq_recv, z, NOBLOCK)
        recv_frame: Callable[[], zmq.Frame] = functools.partial(zmq_recv, z, NOBLOCK, False)  # type: ignore[assignment]
        router = sock.router
        curve = sock.curve
        on_frames = self._on_frames
        budget = _BATCH_BYTES
        self._strangers = 0
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
                if curve:  # the key the connection authenticated with, set by ZAP
                    sock.user = str(part.get("User-Id"))
                frames = [part.bytes]
                while part.more:
                    part = recv_frame()
                    frames.append(part.bytes)
                    if len(frames) > MAX_FRAMES:
                        self._refusals.too_many_frames(sock, rid, frames[0], recv_frame, part)
                        break
                else:
                    on_frames(sock, rid, frames)
                budget -= len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
                if budget <= 0 or self._strangers >= STRANGER_ROUND:
                    break
            sock.wake()  # more may be waiting: continue after other callbacks ran
        except zmq.ZMQError as exc:
            log.warning("%s: receive on %s failed: %s", self._shared.name, sock.address, exc)
        finally:
            sock.draining = False

    def _on_frames(self, sock: Sock, rid: bytes | None, frames: list[bytes]) -> None:
        """Handle one received message; never raises (a bad peer must not stop the loop)."""
        self._stats.received += 1
        link = sock.link if rid is None else sock.links.get(rid)
        if sock.curve and link is not None and link.user != sock.user:
            # The routing id of a link that said Hello with another key: its connection
            # is gone and a new one reuses the id. The old peer is dead; this one is new.
            self._registry.peer_died(link, f"{link.name}'s routing id came back with another key")
            link = None
        if link is None and rid is not None:  # a connection that has not said Hello
            self._strangers += 1  # (counted towards STRANGER_ROUND)
            if rid in sock.shunned:  # (declared dead for flooding: its messages go unread)
                self._stats.unhandled += 1
                return
            env: Envelope | None = self._refusals.stranger(sock, rid, frames)
            if env is None:
                return
        elif (
            link is not None
            and len(frames[0]) >= PEEK_BYTES
            and self._refusals.unwanted(link, frames[0])
        ):
            return
        else:
            try:
                env = self._codec.decode(frames)
            except ProtocolError as exc:
                try:
                    self._refusals.bad_message(sock, rid, link, frames, exc)
                except Exception:  # answering a bad message must not end the receive loop
                    self._shared.log_limited(
                        "bad_message_reply",
                        "%s: could not answer a bad message",
                        self._shared.name,
                        exc_info=True,
                    )
                return
            if link is not None and link.bad:
                link.bad = 0  # ("in a row": a good message in between starts the count again)
        try:
            self._dispatch(sock, rid, link, env)
        except Exception:  # a bug in dispatch must not end the receive loop
            self._shared.log_limited(
                "dispatch",
                "%s: failed to dispatch a %s from %s",
                self._shared.name,
                env.kind,
                env.sender if link is not None else "a new connection",
                exc_info=True,
            )

    def _dispatch(self, sock: Sock, rid: bytes | None, link: Link | None, env: Envelope) -> None:
        body = env.body
        kind = type(body)
        if link is None:  # a ROUTER peer that has not said Hello (yet, or since it died)
            if kind is Hello:
                self._liveness.accept_hello(sock, rid, env)
            elif kind is not Bye and (env.expects_reply or kind is Heartbeat):
                message = f"say Hello first: {self._shared.name} does not know this connection"
                self._sender.answer(sock, rid, env, Error(code="hello_required", message=message))
            return
        link.last_heard = self._shared.now
        if env.sender != link.name and link.name:  # the name it said Hello with, not a claim
            env.sender = link.name
        if not link.alive and not sock.router and link.name:
            self._liveness.start_rehello(link)
        if env.reply_to:
            fut = link.pending.pop(env.reply_to, None)
            if fut is None or fut.done():
                self._stats.late_replies += 1
            elif isinstance(body, Error):
                error = RemoteError(
                    body.code, body.message, peer=link.name, retryable=body.retryable
                )
                fut.set_exception(error)
                if body.code == "hello_required" and not sock.router and link.name:
                    self._liveness.start_rehello(link)  # the bound side forgot us: introduce again
            else:
                fut.set_result(body)
                link.unwanted = 0  # ("in a row": an answer in between starts the count again)
            return
        if kind is Heartbeat:
            if env.expects_reply:
                self._sender.reply(link, env, Ok())
            return
        if env.channel:
            if env.expects_reply:  # (a broadcast is answered by nobody: refused whole)
                refusal = "a broadcast (channel set) cannot expect a reply"
                self._sender.reply(link, env, Error(code="bad_message", message=refusal))
                return
            self._deliver_broadcast(env)
            return
        if kind is Hello or kind is Subscribe or kind is Bye or kind is Error:
            self._control(sock, rid, link, env)
            return
        handler = self._handlers.get(kind)
        if env.expects_reply:
            self._run_request(link, env, handler)
        elif handler is None:
            self._stats.unhandled += 1
            log.debug("%s: no handler for one-way %s from %s", self._shared.name, env.kind,
                      link.name)  # fmt: skip
        else:
            self._run_oneway(handler, env)

    def _control(self, sock: Sock, rid: bytes | None, link: Link, env: Envelope) -> None:
        body = env.body
        sender = self._sender
        if isinstance(body, Hello):
            if sock.router:
                self._liveness.accept_hello(sock, rid, env)
        elif isinstance(body, Subscribe):
            if body.unsubscribe:
                link.subscriptions.difference_update(body.channels)
            else:
                wanted = sorted(link.subscriptions.union(body.channels))
                problem = subscriptions_problem(wanted, self._shared.config.max_subscriptions)
                if problem is not None:
                    if env.expects_reply:
                        error = Error(code="too_many_subscriptions", message=problem)
                        sender.answer(sock, rid, env, error)
                    return
                link.subscriptions.update(body.channels)
            if env.expects_reply:
                sender.answer(sock, rid, env, Ok())
        elif isinstance(body, Bye):
            if env.expects_reply:
                sender.reply(link, env, Ok())
            self._liveness.said_goodbye(link, body.reason)
        elif isinstance(body, Error):
            if env.expects_reply:
                refusal = "an error is a reply or a one-way notice, never a request"
                sender.reply(link, env, Error(code="bad_message", message=refusal))
            if body.code == "hello_required" and not sock.router and link.name:
                self._liveness.start_rehello(link)
            else:  # (rate-limited and cut short: a peer could send these without end)
                self._shared.log_limited("peer_error", "%s: %s sent error %s: %s",
                                         self._shared.name, link.name, body.code[:100],
                                         body.message[:300])  # fmt: skip

    # --- handlers --------------------------------------------------------------------

    def _run_request(self, link: Link, env: Envelope, handler: Handler | None) -> None:
        name = self._shared.name
        if handler is None:
            message = f"{name} has no handler for {env.kind!r}"
            self._sender.reply(link, env, Error(code="no_handler", message=message))
            return
        if self.handlers_running >= self._shared.config.max_handlers:
            message = f"{name} is running {self.handlers_running} handlers; retry later"
            self._sender.reply(link, env, Error(code="overloaded", message=message, retryable=True))
            return
        try:
            coro = handler(env)
            yielded = coro.send(None) if isinstance(coro, types.CoroutineType) else None
        except StopIteration as stop:
            self._sender.reply(link, env, stop.value)
            return
        except Exception as exc:
            self._sender.reply(link, env, self._handler_failed(env, exc))
            return
        self.handlers_running += 1  # counted from now: the bound covers tasks not yet started
        self._shared.spawn(self._finish_request(link, env, coro, yielded))

    async def _finish_request(
        self, link: Link, env: Envelope, coro: Awaitable[Any], yielded: Any
    ) -> None:
        try:
            if isinstance(coro, types.CoroutineType):
                result = await _resume(coro, yielded)
            else:
                result = await coro
        except Exception as exc:
            result = self._handler_failed(env, exc)
        finally:
            self.handlers_running -= 1
        if link.alive:
            self._sender.reply(link, env, result)

    def _run_oneway(self, handler: Handler, env: Envelope) -> None:
        try:
            coro = handler(env)
            yielded = coro.send(None) if isinstance(coro, types.CoroutineType) else None
        except StopIteration:
            return
        except Exception as exc:
            self._handler_failed(env, exc)
            return
        self._shared.spawn(self._finish_oneway(env, coro, yielded))

    async def _finish_oneway(self, env: Envelope, coro: Awaitable[Any], yielded: Any) -> None:
        try:
            if isinstance(coro, types.CoroutineType):
                await _resume(coro, yielded)
            else:
                await coro
        except Exception as exc:
            self._handler_failed(env, exc)

    def _handler_failed(self, env: Envelope, exc: Exception) -> Error:
        self._stats.handler_errors += 1
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, RuntimeError) and "inside a task" in str(exc):
            message += (
                " (this handler needs a task before its first await: register it with task=True)"
            )
        log.warning(
            "%s: handler for %s from %s failed: %s",
            self._shared.name,
            env.kind,
            env.sender,
            message,
        )
        return Error(code="handler_failed", message=message)

    def _deliver_broadcast(self, env: Envelope) -> None:
        delivered = False
        for prefix, handler in self._routes.subs:
            if env.channel.startswith(prefix):
                delivered = True
                self._run_oneway(handler, env)
        if not delivered:
            self._stats.unhandled += 1


def in_task(handler: Handler) -> Handler:
    """``handler``, made to suspend at once so that all of its body runs inside a task."""

    async def in_task(env: Envelope) -> Body | None:
        await asyncio.sleep(0)
        return await handler(env)

    return in_task
