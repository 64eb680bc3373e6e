"""The sender: non-blocking sends, waiting with back-off when a queue is full, replies.

A send never blocks the event loop: :meth:`Sender.send_now` tries once without waiting and
says whether the message went; :meth:`Sender.send_later` retries with back-off up to a
deadline. A reply that finds the queue full is retried the same way in a task. A bound
socket that finds a peer's connection gone (``EHOSTUNREACH``) declares the peer dead.
"""

from __future__ import annotations

import asyncio
import contextlib

import zmq

from parley.protocols.bus.core import (
    NOBLOCK,
    NOBLOCK_MORE,
    Link,
    Shared,
    Sock,
    any_body,
    log,
    zmq_send,
)
from parley.protocols.bus.registry import Registry
from parley.protocols.codec import Frame
from parley.protocols.errors import BusError, PeerDead, ProtocolError
from parley.protocols.messages import Body, Envelope, Error, Ok

MAX_REPLIES_WAITING = 256
"""Replies to one peer that may wait for room in its full queue; later ones are dropped."""


class Sender:
    """Encodes and sends an endpoint's messages (requests, one-way, replies, refusals)."""

    def __init__(self, shared: Shared, registry: Registry) -> None:
        self._shared = shared
        self._stats = shared.stats
        self._codec = shared.codec
        self._registry = registry

    def encode(self, env: Envelope) -> list[Frame]:
        """``env``'s frames; raises :class:`BusError` once the endpoint is closed."""
        if self._shared.closed:
            raise BusError(f"endpoint {self._shared.name} is closed")
        frames: list[Frame] = self._codec.encode(env)
        return frames

    def send_now(self, link: Link, frames: list[Frame]) -> bool:
        """Send without waiting; False if the queue is full. Raises PeerDead if gone."""
        sock = link.sock
        z = sock.z
        try:
            if link.rid is not None:
                zmq_send(z, link.rid, NOBLOCK_MORE)  # all parts go, or none: zmq is atomic
                if len(frames) == 1:
                    zmq_send(z, frames[0], NOBLOCK)
                else:
                    self._send_tail(z, frames)
            elif len(frames) == 1:
                zmq_send(z, frames[0], NOBLOCK)
            else:
                self._send_tail(z, frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise BusError(f"send to {link.name} failed: {exc}") from exc
            self._registry.peer_died(link, f"{link.name} disconnected")
            raise PeerDead(f"peer {link.name!r} disconnected") from None
        link.last_sent = self._shared.now  # the clock of this loop round
        self._stats.sent += 1
        if not sock.draining:
            # The send may have consumed the descriptor's edge: look again once this
            # event-loop round is over (one look per round, however many sends).
            sock.wake()
        return True

    def _send_tail(self, z: zmq.Socket[bytes], frames: list[Frame]) -> None:
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            flags = 0 if i == last else zmq.SNDMORE
            z.send(frame, flags, copy=len(frame) < self._codec.zero_copy_bytes)

    async def send_later(self, link: Link, frames: list[Frame], limit: float) -> None:
        """Retry a send whose queue was full, backing off, for up to ``limit`` seconds."""
        loop = self._shared.loop
        assert loop is not None
        deadline = loop.time() + limit
        delay = 0.0005
        while True:
            await asyncio.sleep(delay)
            if not link.alive:
                raise PeerDead(f"peer {link.name!r} died before the message could be sent")
            if self.send_now(link, frames):
                return
            if loop.time() > deadline:
                raise BusError(
                    f"queue to {link.name!r} stayed full for {limit:g} s (hwm "
                    f"{self._shared.config.hwm}); the peer is not keeping up"
                )
            delay = min(delay * 2, 0.05)

    def try_send(self, link: Link, frames: list[Frame]) -> None:
        """Send if it can go now, else drop it (heartbeats, goodbyes: best effort)."""
        with contextlib.suppress(BusError, zmq.ZMQError):
            self.send_now(link, frames)

    def raw_send(self, sock: Sock, rid: bytes | None, frames: list[Frame]) -> None:
        """Best-effort send to a connection that may have no link (errors, refusals)."""
        try:
            if rid is not None:
                sock.z.send_multipart([rid, *frames], NOBLOCK)
            else:
                sock.z.send_multipart(frames, NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("%s: could not answer %r: %s", self._shared.name, rid, exc)
            return
        if not sock.draining:
            sock.wake()

    def answer(self, sock: Sock, rid: bytes | None, env: Envelope, body: Body) -> None:
        """Answer ``env`` with ``body`` on a connection that may have no link (best effort)."""
        reply = Envelope(
            body=any_body(body),
            sender=self._shared.name,
            reply_to=env.id if env.expects_reply else 0,
        )
        self.raw_send(sock, rid, self._codec.encode(reply))

    def reply(self, link: Link, env: Envelope, body: Body | None) -> None:
        """Answer request ``env`` from ``link`` with ``body`` (``None``: ``Ok``); a reply
        that finds the queue full waits for room in a task, at most
        :data:`MAX_REPLIES_WAITING` per peer."""
        if body is None:
            body = Ok()
        elif not isinstance(body, Body):
            body = Error(
                code="handler_failed",
                message=f"handler returned {type(body).__name__}, not a message body",
            )
        name = self._shared.name
        reply = Envelope(body=any_body(body), sender=name, reply_to=env.id, episode=env.episode)
        try:
            frames = self._codec.encode(reply)
        except ProtocolError as exc:
            frames = self._codec.encode(
                Envelope(
                    body=Error(code="bad_message", message=f"reply not sendable: {exc.reason}"),
                    sender=name,
                    reply_to=env.id,
                )
            )
        try:
            if self.send_now(link, frames):
                return
        except BusError as exc:
            log.debug("%s: reply to %s lost: %s", name, link.name, exc)
            return
        if link.replies_waiting >= MAX_REPLIES_WAITING:
            # A peer that sends requests and reads no replies: a task per reply had grown
            # to 388,000 in 30 s. Its requests time out on its side instead.
            self._stats.replies_dropped += 1
            self._shared.log_limited(
                "reply_dropped",
                "%s: %s reads no replies (%d waiting for room in its queue): reply dropped",
                name,
                link.name,
                link.replies_waiting,
            )
            return
        link.replies_waiting += 1
        self._shared.spawn(self._reply_later(link, frames))

    async def _reply_later(self, link: Link, frames: list[Frame]) -> None:
        try:
            await self.send_later(link, frames, self._shared.config.request_timeout)
        except BusError as exc:
            self._shared.log_limited(
                "reply_lost", "%s: reply to %s lost: %s", self._shared.name, link.name, exc
            )
        finally:
            link.replies_waiting -= 1
