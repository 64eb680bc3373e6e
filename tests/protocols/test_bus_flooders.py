"""The bus against a seated or anonymous flooder (issue 28 §5).

Before: refusing a frame nested too deeply to decode walked it in Python, ~0.15 ms per KB
(~150x a flat frame of the same size), so a stranger that never said Hello cut a live run
from ~380 to ~0.15 episodes/s; a seated peer's malformed frames never counted toward its
cut-off; and a receive round handled up to 2,000 strangers' messages before the loop ran
anything else. Everything here is a real endpoint on real sockets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zmq

from parley.protocols.bus.refuse import MAX_BAD, STRANGER_ROUND
from parley.protocols.codec import Codec, salvage_head
from parley.protocols.errors import ProtocolError
from parley.protocols.messages import Action, Observation
from tests.protocols.test_bus_accept import _next_reply, _seated
from tests.protocols.test_bus_hostile import FAST, _arena, _observation_with_info

pytestmark = pytest.mark.timeout(60)


def _nested(size: int, request_id: int = 1) -> bytes:
    """An observation request whose ``info`` is ``size`` one-byte lists, one in the other."""
    return _observation_with_info(b"\x91" * size + b"\xc0", request_id)


def _cpu_per_frame(refuse: Callable[[bytes], Any], frame: bytes, n: int = 40) -> float:
    """CPU seconds per refusal of ``frame`` (the least of 5 runs: the machine is shared)."""
    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            refuse(frame)
        runs.append((time.process_time() - start) / n)
    return min(runs)


def _as_stranger(frame: bytes) -> None:
    """What the receive loop does with a stranger's frame: decode, then salvage the id."""
    try:
        Codec().decode_stranger([frame])
    except ProtocolError:
        salvage_head(frame)


def _as_seated(frame: bytes) -> None:
    try:
        Codec(accept={"action"}).decode([frame])
    except ProtocolError:
        salvage_head(frame)


@pytest.mark.parametrize("refuse", [_as_stranger, _as_seated], ids=["stranger", "seated"])
def test_refusing_nesting_costs_no_more_for_a_larger_frame(refuse: Callable[[bytes], Any]) -> None:
    """The cost of refusing nesting is bounded per frame, so per byte: a 60 KB frame costs
    about what a 1.5 KB one does (before: ~40x, the nesting walked byte by byte in Python).
    A ratio of two costs measured alike, so the machine's speed and load cancel out."""
    small, large = _nested(1_500), _nested(60_000)
    ratio = _cpu_per_frame(refuse, large) / _cpu_per_frame(refuse, small)
    assert ratio < 4, f"a 60 KB nested frame cost {ratio:.0f}x a 1.5 KB one to refuse"


async def test_a_seated_peers_malformed_messages_count_toward_its_cut_off() -> None:
    """``MAX_BAD`` malformed messages in a row and the peer is declared dead, its connection
    read no more; a good message in between starts the count again."""
    async with _seated() as (server, raw):
        bad = _nested(2_000, 7)
        heartbeat = {"body": {"kind": "heartbeat"}, "sender": "raw", "id": 8,
                     "expects_reply": True}  # fmt: skip

        def send(frames: list[bytes]) -> list[dict[str, Any]]:
            for frame in frames:
                raw.send(frame)
            return [_next_reply(raw) for _ in frames]

        replies = await asyncio.to_thread(send, [bad] * (MAX_BAD - 1))
        assert [r["body"]["code"] for r in replies] == ["bad_message"] * (MAX_BAD - 1)
        (ok,) = await asyncio.to_thread(send, [msgpack.packb(heartbeat)])
        assert ok["body"]["kind"] == "ok"
        await asyncio.to_thread(send, [bad] * (MAX_BAD - 1))
        assert "raw" in server.peers  # (never MAX_BAD in a row)
        raw.send(bad)
        for _ in range(500):
            if "raw" not in server.peers:
                break
            await asyncio.sleep(0.01)
        assert "raw" not in server.peers
        assert server.stats.bad_messages == 2 * MAX_BAD - 1
        # Read no more: a new Hello on the same connection is dropped unread.
        hello = {"body": {"kind": "hello", "name": "raw"}, "id": 9, "expects_reply": True}
        raw.send(msgpack.packb(hello))
        answer = await server.request("alice", Observation(agent="a", text="still"))
        assert isinstance(answer, Action)
        assert "raw" not in server.peers


async def test_a_strangers_flood_gets_a_bounded_share_of_each_receive_round() -> None:
    """While a stranger floods nested frames, the peer that said Hello is answered with at
    most a few rounds' worth of the stranger's messages handled in between (before: up to
    2,000 a round, each answered before anything else ran). A count of work, not a time."""
    async with _arena(client=True) as (server, client, raw):
        frame = _nested(1_000)
        stop = threading.Event()

        def flood() -> None:
            while not stop.is_set():
                try:
                    raw.send(frame, zmq.NOBLOCK)
                except zmq.Again:
                    time.sleep(0.001)

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        try:
            for _ in range(1_000):  # until the flood is on
                if server.stats.hello_required >= 4 * STRANGER_ROUND:
                    break
                await asyncio.sleep(0.01)
            between = []
            for i in range(20):
                before = server.stats.hello_required
                answer = await client.request("arena", Observation(agent="alice", text=str(i)))
                assert isinstance(answer, Action)
                between.append(server.stats.hello_required - before)
        finally:
            stop.set()
            flooder.join(10)
        # ~14 rounds' worth here (the flooder's thread contends for the GIL); before, ~14,000.
        assert statistics.median(between) <= 64 * STRANGER_ROUND, between


async def test_a_message_a_little_over_the_limit_is_answered_bad_message() -> None:
    """ZeroMQ's cut-off (``MAXMSGSIZE``) sat 1 KiB over the endpoint's limit, so a message
    just past it dropped the connection and nobody was told; the cut-off is now at the
    most any parley peer sends, and the message is refused ``bad_message`` with its id."""
    limit = 64 * 1024
    config = dataclasses.replace(FAST, max_message_bytes=limit)
    async with _arena(config) as (server, _, raw):
        hello = {"body": {"kind": "hello", "name": "raw"}, "id": 1, "expects_reply": True}
        raw.send(msgpack.packb(hello))
        assert (await asyncio.to_thread(_next_reply, raw))["body"]["kind"] == "hello"
        over = {"body": {"kind": "observation", "agent": "raw", "text": "x" * (limit + 4096)},
                "id": 5, "expects_reply": True}  # fmt: skip
        raw.send(msgpack.packb(over))
        reply = await asyncio.to_thread(_next_reply, raw)
        assert (reply["body"]["code"], reply["reply_to"]) == ("bad_message", 5)
        assert "exceeds the limit" in reply["body"]["message"]
        assert server.peers == ["raw"]
