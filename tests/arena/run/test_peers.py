"""Absent remote peers share one join_timeout wait, and a peer seen again is waited for
afresh (arena/run/peers.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from rich.console import Console

from parley.arena.run.peers import AbsentPeers
from parley.protocols.bus import Endpoint
from parley.protocols.errors import RequestTimeout


async def _timed(absent: AbsentPeers, arena: Endpoint, peer: str) -> float:
    started = time.perf_counter()
    with pytest.raises(RequestTimeout):
        await absent.wait_for(arena, peer)
    return time.perf_counter() - started


@pytest.mark.timeout(20)
async def test_an_absence_is_waited_once_and_afresh_after_the_peer_was_seen() -> None:
    absent = AbsentPeers(0.3, Console(quiet=True))
    async with Endpoint("arena") as arena:
        first = await asyncio.gather(*(_timed(absent, arena, "agent-b") for _ in range(5)))
        assert all(0.25 < t < 2.0 for t in first)  # five episodes, one shared wait
        assert await _timed(absent, arena, "agent-b") < 0.1  # over: the next fails at once
        absent.seen(["agent-b"])  # it came back (the runner saw it live) ...
        assert await _timed(absent, arena, "agent-b") > 0.25  # ... so it is waited for again
