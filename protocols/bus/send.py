"""Sending: non-blocking sends, waiting with back-off when a queue is full, replies.

A send never blocks the event loop: :meth:`_Sender._send_now` tries once without waiting and
says whether the message went; :meth:`_Sender._send_later` retries with back-off up to a
deadline. A reply that finds the queue full is retried the same way in a task. A bound
socket that finds a peer's connection gone (``EHOSTUNREACH``) declares the peer dead.
"""

from __future__ import annotations

import asyncio
import contextlib

import zmq

from parley.protocols.bus.core import (
    _NOBLOCK,
    _NOBLOCK_MORE,
    _any,
    _Core,
    _Link,
    _send,
    _Sock,
    log,
)
from parley.protocols.codec import Frame
from parley.protocols.errors import BusError, PeerDead, ProtocolError
from parley.protocols.messages import Body, Envelope, Error, Ok

MAX_REPLIES_WAITING = 256
"""Replies to one peer that may wait for room in its full queue; later ones are dropped."""


class _Sender(_Core):
    """The sending layer of an endpoint."""

    def _encode(self, env: Envelope) -> list[Frame]:
        if self._closed:
            raise BusError(f"endpoint {self.name} is closed")
        frames: list[Frame] = self._codec.encode(env)
        return frames

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
            if self._send_now(link, frames):
                return
        except BusError as exc:
            log.debug("%s: reply to %s lost: %s", self.name, link.name, exc)
            return
        if link.replies_waiting >= MAX_REPLIES_WAITING:
            # A peer that sends requests and reads no replies: a task per reply had grown
            # to 388,000 in 30 s. Its requests time out on its side instead.
            self.stats.replies_dropped += 1
            self._log_limited(
                "reply_dropped",
                "%s: %s reads no replies (%d waiting for room in its queue): reply dropped",
                self.name,
                link.name,
                link.replies_waiting,
            )
            return
        link.replies_waiting += 1
        self._spawn(self._reply_later(link, frames))

    async def _reply_later(self, link: _Link, frames: list[Frame]) -> None:
        try:
            await self._send_later(link, frames, self.config.request_timeout)
        except BusError as exc:
            self._log_limited("reply_lost", "%s: reply to %s lost: %s", self.name, link.name, exc)
        finally:
            link.replies_waiting -= 1
