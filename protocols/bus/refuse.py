"""Refusing what a peer should not have sent, without letting it cost the loop.

The receive loop (:mod:`parley.protocols.bus.receive`) hands these cases to the
:class:`RefusalPolicy`: a message of too many parts, a large message nobody asked for
(peeked at, dropped unread), a message from a connection that has not said Hello, and a
message that does not decode (answered ``Error`` with the request id salvaged where
possible, and counted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import zmq

from parley.protocols.bus.core import Link, Routes, Shared, Sock
from parley.protocols.bus.registry import Registry
from parley.protocols.bus.send import Sender
from parley.protocols.codec import SESSION_KINDS, Frame, Head, NestedTooDeep, salvage_head
from parley.protocols.errors import ProtocolError, RemoteError
from parley.protocols.messages import Envelope, Error, Ok

PEEK_BYTES = 64 * 1024
"""From this size on, a message's envelope is peeked at before its body is decoded: a reply
nobody waits for, or a message no handler takes, is dropped unread (or answered
``no_handler``). A peer's 16 MiB one-way actions, decoded to be thrown away, took 0.2 s of
the loop each.

A connected peer (``ROUTER`` side) that sends :data:`MAX_UNWANTED` such messages in a row is
declared dead, and its connection is read no more (its messages dropped unread, a Hello
too): its agent must connect again. The :data:`MAX_SHUNNED` latest such connections are
remembered. The same holds for :data:`MAX_BAD` messages in a row that do not decode: a
seated peer's malformed frames cost the loop as much as a stranger's, and it has no reason
to send them."""

MAX_UNWANTED = 8
MAX_BAD = 8
MAX_SHUNNED = 4096

STRANGER_ROUND = 16
"""Most messages from connections that have not said Hello that one receive round handles:
past it the round ends and the loop runs its other tasks before reading on. A stranger's
message costs ~3-60 µs to refuse and answer; a flood of them, 2,000 a round, held the loop
in rounds of tens of milliseconds and cut a live run from ~380 to ~10 episodes/s. The
rest waits in ZeroMQ, whose queue per connection (``RCVHWM``) then holds the flooder back,
while the peers that said Hello are read in turn (ZeroMQ fair-queues connections)."""

MAX_FRAMES = 4096
"""Most parts of one message: the envelope and its out-of-band arrays (one per array of at
least ``zero_copy_bytes``; a model's weights inline have a few hundred). A message of more
is read to its end without being kept and refused ``bad_message``."""


class RefusalPolicy:
    """Refuses, drops or shuns what a peer should not have sent (see the module docstring)."""

    def __init__(self, shared: Shared, registry: Registry, sender: Sender, routes: Routes) -> None:
        self._shared = shared
        self._registry = registry
        self._sender = sender
        self._routes = routes

    def too_many_frames(self, sock: Sock, rid: bytes | None, head: bytes,
                        recv_frame: Callable[[], zmq.Frame], part: zmq.Frame) -> None:  # fmt: skip
        """Read the rest of a message of over :data:`MAX_FRAMES` parts unkept and refuse it
        (empty parts count nothing towards ``max_message_bytes``: millions of them held as
        a list stalled the loop for seconds)."""
        self._shared.stats.received += 1
        count = MAX_FRAMES + 1
        while part.more:
            part = recv_frame()
            count += 1
        link = sock.link if rid is None else sock.links.get(rid)
        reason = f"a message of {count} frames; at most {MAX_FRAMES} (the envelope, then arrays)"
        self.bad_message(sock, rid, link, [head], ProtocolError(reason))

    def unwanted(self, link: Link, head: bytes) -> bool:
        """Whether a large message from ``link`` is dropped unread (see :data:`PEEK_BYTES`):
        a reply to no pending request, a broadcast on no subscribed channel, a body no
        handler takes (a request for one is answered ``no_handler``)."""
        codec = self._shared.codec
        stats = self._shared.stats
        peek = codec.peek(head)
        if peek is None:
            return False  # decoding it names the problem
        if peek.reply_to:
            fut = link.pending.get(peek.reply_to)
            if fut is not None and not fut.done():
                link.unwanted = 0
                return False
            stats.late_replies += 1
        elif peek.channel:
            if self._routes.subscribed(peek.channel):
                return False
            stats.unhandled += 1
        else:
            kind = peek.body.kind
            accept = codec.accept
            if accept is not None and kind not in accept:
                return False  # refused unread by decode, as unexpected_kind
            if kind in SESSION_KINDS or self._routes.takes(kind):
                link.unwanted = 0
                return False
            stats.unhandled += 1
            if peek.expects_reply:
                message = f"{self._shared.name} has no handler for {kind[:100]!r}"
                request = Envelope(body=Ok(), id=peek.id, expects_reply=True, episode=peek.episode)
                self._sender.reply(link, request, Error(code="no_handler", message=message))
        link.unwanted += 1
        if link.unwanted >= MAX_UNWANTED:
            self._shun(link, f"it sent {link.unwanted} large messages nobody asked for")
        return True

    def _shun(self, link: Link, reason: str) -> None:
        """Declare a ``ROUTER`` peer dead for flooding and read its connection no more."""
        if link.rid is None:
            return  # (the bound side: a connecting socket has no other to trust)
        shunned = link.sock.shunned
        shunned[link.rid] = None
        if len(shunned) > MAX_SHUNNED:
            del shunned[next(iter(shunned))]
        self._registry.peer_died(link, reason)

    def stranger(self, sock: Sock, rid: bytes, frames: list[bytes]) -> Envelope | None:
        """A message from a connection that has not said Hello: only a small ``Hello``,
        ``Heartbeat`` or ``Bye`` is decoded (:meth:`Codec.decode_stranger`) and returned
        for dispatch; a request of any other kind is answered ``hello_required`` (its id
        read without decoding its body), a one-way message dropped (``None``)."""
        codec = self._shared.codec
        try:
            return codec.decode_stranger(frames)
        except ProtocolError as exc:
            if exc.code != "hello_required":  # (a Hello of another schema version)
                self.bad_message(sock, rid, None, frames, exc)
                return None
            self._shared.stats.hello_required += 1
            nested = isinstance(exc, NestedTooDeep)
            head = salvage_head(frames[0], nested=nested) if frames else Head()
            if head.expects_reply:
                message = (
                    f"say Hello first: {self._shared.name} does not know this connection "
                    f"({exc.reason[:300]})"
                )
                error = Error(code="hello_required", message=message)
                reply = Envelope(body=error, sender=self._shared.name, reply_to=head.id)
                self._sender.raw_send(sock, rid, codec.encode(reply))
            return None

    def bad_message(
        self,
        sock: Sock,
        rid: bytes | None,
        link: Link | None,
        frames: Sequence[Frame],
        exc: ProtocolError,
    ) -> None:
        """Count and log a message that does not decode, fail the request it answers or
        answer it ``Error``; shun a peer after :data:`MAX_BAD` in a row."""
        stats = self._shared.stats
        stats.bad_messages += 1
        if link is not None:
            link.bad += 1
            if link.bad >= MAX_BAD:
                self._shun(link, f"it sent {link.bad} malformed messages in a row")
        who = link.name if link is not None else repr(rid)
        self._shared.log_limited(
            "bad_message",
            "%s: bad message #%d from %s: %s",
            self._shared.name,
            stats.bad_messages,
            who,
            exc.reason[:500],
        )
        nested = isinstance(exc, NestedTooDeep)
        head = salvage_head(frames[0], nested=nested) if frames else Head()
        if link is not None and head.reply_to:
            fut = link.pending.pop(head.reply_to, None)
            if fut is not None and not fut.done():
                fut.set_exception(RemoteError(exc.code, exc.reason, peer=link.name))
            return
        if sock.router and rid is None:
            return
        error = Envelope(
            body=Error(code=exc.code, message=exc.reason[:1000]),
            sender=self._shared.name,
            reply_to=head.id if head.expects_reply else 0,
        )
        self._sender.raw_send(sock, rid, self._shared.codec.encode(error))
