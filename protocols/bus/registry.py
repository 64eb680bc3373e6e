"""The link registry: an endpoint's sockets and its links by peer name.

A link is registered under its peer's name once the peer said ``Hello`` (:meth:`admit`), and
leaves when the peer dies (:meth:`peer_died`: its pending requests fail with
:class:`PeerDead`) or its socket closes (:meth:`forget_sock`). Waiters on a peer learn of
every change (:meth:`wait_for`).
"""

from __future__ import annotations

import asyncio

from parley.protocols.bus.core import Link, Shared, Sock, log
from parley.protocols.errors import BusError, PeerDead


class Registry:
    """The endpoint's sockets (``socks``) and live links by peer name (``links``)."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self.socks: list[Sock] = []
        self.links: dict[str, Link] = {}
        self._change: asyncio.Future[None] | None = None  # done at the next change

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin telling waiters about changes (the endpoint's loop is known now)."""
        self._change = loop.create_future()

    def live(self, peer: str) -> Link:
        """The link to ``peer``; raises :class:`BusError` for an unknown peer and
        :class:`PeerDead` for one that died."""
        link = self.links.get(peer)
        if link is None:
            raise BusError(
                f"{self._shared.name} has no peer named {peer!r} (peers: {sorted(self.alive())}); "
                "connect to it or wait_for_peer first"
            )
        if not link.alive:
            raise PeerDead(f"peer {peer!r} is dead (no heartbeat or said goodbye)")
        return link

    def alive(self) -> list[str]:
        """Names of the peers connected and alive, in the order they joined."""
        return [name for name, link in self.links.items() if link.alive]

    def alive_links(self) -> list[Link]:
        """The links of the peers connected and alive."""
        return [link for link in self.links.values() if link.alive]

    def admit(self, link: Link) -> None:
        """Register ``link`` (alive, named) under its peer's name."""
        self.links[link.name] = link
        self.changed()

    def peer_died(self, link: Link, reason: str) -> None:
        """Declare ``link``'s peer dead: fail its pending requests, forget a bound side's
        link (a connecting side keeps its one link to handshake again)."""
        if not link.alive:
            return
        link.alive = False
        self._shared.stats.dead_peers += 1
        log.info("%s: peer %s is dead: %s", self._shared.name, link.name, reason)
        self.fail(link, PeerDead(f"peer {link.name!r} is dead: {reason}"))
        if link.rid is not None:
            link.sock.links.pop(link.rid, None)
            if self.links.get(link.name) is link:
                del self.links[link.name]
        self.changed()

    @staticmethod
    def fail(link: Link, exc: BusError) -> None:
        """Fail every request pending on ``link`` with a copy of ``exc``."""
        pending, link.pending = link.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(type(exc)(*exc.args))

    def forget_sock(self, sock: Sock) -> None:
        """Fail the requests of ``sock``'s links and forget the socket and its links."""
        for link in sock.all_links():
            self.fail(link, BusError(f"socket {sock.address} closed"))
            if self.links.get(link.name) is link:
                del self.links[link.name]
        if sock in self.socks:
            self.socks.remove(sock)

    def farewell(self, peer: str) -> str | None:
        """The reason in the last ``Bye`` ``peer`` sent on a connecting socket, or None."""
        for sock in self.socks:
            link = sock.link
            if link is not None and link.name == peer and link.farewell is not None:
                return link.farewell
        return None

    def changed(self) -> None:
        """Wake every :meth:`wait_for` (a peer joined or left)."""
        if self._change is not None and self._shared.loop is not None:
            fut, self._change = self._change, self._shared.loop.create_future()
            fut.set_result(None)

    async def wait_for(self, name: str) -> None:
        """Return once ``name`` is a live peer (the caller bounds the wait)."""
        while name not in self.links or not self.links[name].alive:
            assert self._change is not None
            await asyncio.shield(self._change)
