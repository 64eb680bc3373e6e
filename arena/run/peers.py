"""Remote peers the arena waits for, and since when each has been absent.

A remote seat's agent may join late, leave, or never come. Every episode that needs an
absent agent shares one wait of ``join_timeout`` from when it was first found absent; once
that is over, the episodes of its seat fail at once (``not_joined``) instead of each waiting
``join_timeout`` again — a 200-episode run would otherwise take hours to fail — and one
line says so. A peer seen live again is waited for afresh the next time it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from rich.console import Console

from parley.protocols.bus import Endpoint
from parley.protocols.errors import RequestTimeout

__all__ = ["AbsentPeers"]


class AbsentPeers:
    """The absences of remote peers (see the module docstring)."""

    def __init__(self, join_timeout: float, console: Console) -> None:
        self.join_timeout = join_timeout
        self.console = console
        self._since: dict[str, float] = {}  # peer -> loop time it was first found absent
        self._reported: set[str] = set()

    def seen(self, live: Collection[str]) -> None:
        """Forget the absences of the peers in ``live`` (cheap when nobody is absent)."""
        if self._since:
            for peer in [p for p in self._since if p in live]:
                del self._since[peer]
                self._reported.discard(peer)

    async def wait_for(self, arena: Endpoint, peer: str) -> None:
        """Return once ``peer`` is live; raise :class:`RequestTimeout` when its absence has
        lasted ``join_timeout`` (at once, if it already has)."""
        if peer in arena.peers:
            self.seen((peer,))
            return
        now = asyncio.get_running_loop().time()
        since = self._since.setdefault(peer, now)
        left = since + self.join_timeout - now
        if left <= 0:
            raise RequestTimeout(
                f"{peer} has been absent for {now - since:.0f} s (join_timeout "
                f"{self.join_timeout:g} s); start its agent (parley agent) to rejoin"
            )
        try:
            await arena.wait_for_peer(peer, timeout=left)
        except RequestTimeout:
            if peer not in self._reported:
                self._reported.add(peer)
                self.console.print(
                    f"[red]{peer} did not join within {self.join_timeout:g} s: the "
                    "episodes of its seat fail until it connects[/red]"
                )
            raise
        self.seen((peer,))
