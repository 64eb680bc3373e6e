"""The bus against hostile peers: deep nesting, log floods (issue 11 §6)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import zmq

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.codec import Codec
from parley.protocols.errors import ConfigError, ProtocolError
from parley.protocols.messages import Action, Envelope, Observation

pytestmark = pytest.mark.timeout(60)

FAST = BusConfig(heartbeat_interval=0.1, peer_timeout=0.6, request_timeout=5.0)


def _ipc() -> str:
    return f"ipc://{tempfile.gettempdir()}/parley-test-{os.urandom(4).hex()}"


async def _echo(env: Envelope) -> Action:
    assert isinstance(env.body, Observation)
    return Action(agent=env.body.agent, text=env.body.text)


@contextlib.asynccontextmanager
async def _arena(
    config: BusConfig = FAST, *, client: bool = False
) -> AsyncIterator[tuple[Endpoint, Endpoint, zmq.Socket[bytes]]]:
    """A bound endpoint ``arena`` that echoes observations, a parley peer ``alice`` (said
    Hello when ``client``), and a raw DEALER connected to the arena that has said nothing."""
    server = Endpoint("arena", config=config)
    alice = Endpoint("alice", config=config)
    ctx: zmq.Context[Any] = zmq.Context()
    raw: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    raw.linger, raw.rcvtimeo = 0, 10_000
    try:
        server.on(Observation, _echo)
        address = await server.bind(_ipc())
        if client:
            await alice.connect(address)
        raw.connect(address)
        yield server, alice, raw
    finally:
        raw.close()
        ctx.term()
        await alice.close()
        await server.close()


def _observation_with_info(info: bytes, request_id: int) -> bytes:
    """An observation request whose ``info`` is the MessagePack ``info``, written by hand
    (the msgpack library refuses to pack what the attacks need)."""
    head = msgpack.packb({"id": request_id, "expects_reply": True, "sender": "raw"})
    assert head[0] == 0x83  # fixmap of 3: add "body" as a 4th entry
    body = (
        b"\x84"
        + msgpack.packb("kind")
        + msgpack.packb("observation")
        + msgpack.packb("agent")
        + msgpack.packb("raw")
        + msgpack.packb("text")
        + msgpack.packb("t")
        + msgpack.packb("info")
        + info
    )
    return b"\x84" + head[1:] + msgpack.packb("body") + body


def _nested_observation(depth: int, request_id: int) -> bytes:
    """An observation request whose ``info`` nests ``depth`` maps."""
    return _observation_with_info(b"\x81\xa1a" * depth + b"\x80", request_id)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_codec_refuses_deep_nesting_as_a_protocol_error(depth: int) -> None:
    with pytest.raises(ProtocolError, match="nested too deeply"):
        Codec().decode([_nested_observation(depth, 1)])


async def test_deeply_nested_messages_get_bad_message_and_bounded_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A seated peer's flood of deeply nested requests: the first ``MAX_BAD`` are answered
    ``bad_message`` with their ids, then the peer is declared dead and read no more (before,
    all 2,000 were decoded and answered, each walking its nesting in Python); the receive
    loop keeps serving a good peer, and the log gets a few lines, not thousands."""
    from parley.protocols.bus.refuse import MAX_BAD

    async with _arena(client=True) as (server, client, raw):
        hello = {"body": {"kind": "hello", "name": "raw"}, "id": 1, "expects_reply": True}
        raw.send(msgpack.packb(hello))
        assert msgpack.unpackb(await asyncio.to_thread(raw.recv))["body"]["kind"] == "hello"

        def attack(n: int) -> list[dict[str, Any]]:
            for i in range(n):
                raw.send(_nested_observation(5_000, 100 + i))
            replies: list[dict[str, Any]] = []
            with contextlib.suppress(zmq.Again):  # (rcvtimeo: nothing more comes)
                raw.rcvtimeo = 2_000
                while True:
                    message = msgpack.unpackb(raw.recv())
                    if message["body"]["kind"] != "heartbeat":  # the server's, when idle
                        replies.append(message)
            return replies

        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="parley.protocols.bus"):
            attacker = asyncio.create_task(asyncio.to_thread(attack, 2_000))
            answers = await asyncio.gather(
                *(
                    client.request("arena", Observation(agent="alice", text=str(i)))
                    for i in range(200)
                )
            )
            replies = await asyncio.wait_for(attacker, 30)
        assert [a.text for a in answers if isinstance(a, Action)] == [str(i) for i in range(200)]
        assert [r["body"]["code"] for r in replies] == ["bad_message"] * MAX_BAD
        assert sorted(r["reply_to"] for r in replies) == list(range(100, 100 + MAX_BAD))
        assert "nested too deeply" in replies[0]["body"]["message"]
        assert server.stats.bad_messages == MAX_BAD
        assert server.stats.unhandled == 2_000 - MAX_BAD  # (dropped unread)
        assert server.peers == ["alice"]
        elapsed = time.monotonic() - start
        warnings = [r for r in caplog.records if "bad message" in r.getMessage()]
        # One line per second at most (and the first at once), however many arrive.
        assert 1 <= len(warnings) <= elapsed + 2, f"{len(warnings)} lines in {elapsed:.1f} s"
        assert not any(r.levelno >= logging.ERROR for r in caplog.records)


def test_salvage_head_finds_the_id_before_deep_nesting_and_gives_up_after_it() -> None:
    """The id before the nesting is found; one past it is given up (walking the nesting in
    Python cost ~150x refusing a flat frame, and parley's encoder never writes such a
    frame), at a bounded cost whatever the frame's size."""
    from parley.protocols.codec import Head, salvage_head

    assert salvage_head(_nested_observation(100_000, 42)).id == 42  # id before the body
    deep_first = (  # the body first, as parley's own encoder orders fields
        b"\x82"
        + msgpack.packb("body")
        + b"\x81\xa1a" * 3_000
        + b"\x80"
        + msgpack.packb("id")
        + msgpack.packb(7)
    )
    assert salvage_head(deep_first) == Head()
    assert salvage_head(deep_first, nested=True) == Head()
    assert salvage_head(_nested_observation(100_000, 42), nested=True).id == 42
    rng = random.Random(3)
    for _ in range(2_000):
        junk = rng.randbytes(rng.randrange(0, 64))
        assert isinstance(salvage_head(junk), Head)
        assert isinstance(salvage_head(junk, nested=True), Head)
        assert isinstance(salvage_head(deep_first[: rng.randrange(len(deep_first))]), Head)


def _deep_keys_frame() -> bytes:
    """A map whose first value and second *key* nest 3,000 maps deep (review finding)."""
    deep = b"\x81\xa1a" * 3_000 + b"\x80"
    return b"\x82" + msgpack.packb("body") + deep + deep + msgpack.packb(1)


def test_salvage_head_survives_deeply_nested_keys() -> None:
    from parley.protocols.codec import Head, salvage_head

    assert salvage_head(_deep_keys_frame()) == Head()


async def test_deeply_nested_keys_do_not_stop_the_receive_loop_or_the_ticker() -> None:

    async with _arena(client=True) as (server, client, raw):
        for _ in range(50):
            raw.send(_deep_keys_frame())
        await asyncio.sleep(3 * FAST.heartbeat_interval)  # several ticks drain them too
        reply = await client.request("arena", Observation(agent="alice", text="still here"))
        assert isinstance(reply, Action)
        assert reply.text == "still here"
        assert server._ticker is not None
        assert not server._ticker.done()
        assert server.stats.hello_required == 50  # (a connection that said no Hello)


async def test_one_connection_cannot_take_a_second_name() -> None:
    async with _arena() as (server, _, raw):
        for i, name in enumerate(("agent-a", "agent-b")):
            hello = {"body": {"kind": "hello", "name": name}, "id": i + 1, "expects_reply": True}
            raw.send(msgpack.packb(hello))
            reply: dict[str, Any] = {}
            while reply.get("reply_to") != i + 1:  # skip the server's heartbeats
                reply = msgpack.unpackb(await asyncio.to_thread(raw.recv))
        assert reply["body"]["code"] == "bad_name"
        assert server.peers == ["agent-a"]


def _wide_observation(n: int, request_id: int) -> bytes:
    """An observation request whose ``info`` holds a list of ``n`` empty lists: one byte on
    the wire each, ~64 bytes of Python list each once decoded (review finding: 7 MiB of
    them decoded to ~630 MB and held the loop 2 s)."""
    info = b"\x81\xa1k\xdd" + n.to_bytes(4, "big") + b"\x90" * n
    return _observation_with_info(info, request_id)


async def test_a_connection_without_hello_cannot_make_the_loop_decode_its_bodies() -> None:
    """Before its Hello is accepted a connection gets only a small Hello, Heartbeat or Bye
    decoded: large requests of any other kind are answered ``hello_required`` unread, the
    peers that did say Hello are served meanwhile, and nothing large is ever allocated."""
    import tracemalloc

    frame = _wide_observation(4 * 1024 * 1024, 9)

    async with _arena(client=True) as (server, client, raw):
        tracemalloc.start()
        try:
            for _ in range(4):
                raw.send(frame)
            replies = [msgpack.unpackb(await asyncio.to_thread(raw.recv)) for _ in range(4)]
            answer = await client.request("arena", Observation(agent="alice", text="here"))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert [(r["body"]["code"], r["reply_to"]) for r in replies] == [("hello_required", 9)] * 4
        assert "before Hello" in replies[0]["body"]["message"]
        assert isinstance(answer, Action)
        assert answer.text == "here"
        assert peak < 4 * len(frame), f"{peak / 1e6:.0f} MB allocated for 4 refused messages"
        assert server.stats.hello_required == 4
        assert server.peers == ["alice"]


def _request(raw: zmq.Socket[bytes], body: dict[str, Any], rid: int) -> dict[str, Any]:
    raw.send(msgpack.packb({"body": body, "sender": "raw", "id": rid, "expects_reply": True}))
    while True:
        reply: dict[str, Any] = msgpack.unpackb(raw.recv())
        if reply["body"]["kind"] != "heartbeat":
            return reply


async def test_a_peer_holds_a_bounded_set_of_subscriptions_and_a_bounded_name() -> None:
    """Subscriptions are kept per peer and scanned on every publish: a peer may hold at
    most ``max_subscriptions`` prefixes of at most 256 characters (review finding: six
    3 MiB ``Subscribe`` requests grew the bound side by 165 MB, all answered ``ok``)."""
    config = BusConfig(heartbeat_interval=0.1, peer_timeout=0.6, max_subscriptions=8)
    async with _arena(config) as (server, _, raw):

        def attack() -> list[tuple[str, str]]:
            hello = {"kind": "hello", "name": "raw"}
            out: list[tuple[str, str]] = []
            for body in (
                {**hello, "name": "r" * 201},
                {**hello, "name": "nul\x00"},
                {**hello, "subscriptions": [str(i) for i in range(9)]},
                {**hello, "subscriptions": ["x" * 257]},
                {**hello, "subscriptions": ["a", "b"]},
                {"kind": "subscribe", "channels": [str(i) for i in range(7)]},
                {"kind": "subscribe", "channels": ["c", "d"]},
                {"kind": "subscribe", "channels": ["y" * 300]},
                {"kind": "subscribe", "channels": ["a", "b", "0"]},  # 2 known, 1 new: 8
            ):
                reply = _request(raw, body, len(out) + 1)["body"]
                out.append((reply["kind"], reply.get("code", "")))
            return out

        answers = await asyncio.to_thread(attack)
        assert answers == [
            ("error", "bad_name"),
            ("error", "bad_name"),
            ("error", "too_many_subscriptions"),
            ("error", "too_many_subscriptions"),
            ("hello", ""),
            ("error", "too_many_subscriptions"),  # 2 + 7 > 8: none of them taken
            ("ok", ""),
            ("error", "too_many_subscriptions"),
            ("ok", ""),
        ]
        assert server._registry.links["raw"].subscriptions == {"a", "b", "c", "d", "0"}
        listener = Endpoint("listener", config=config)
        try:
            for i in range(8):
                listener.subscribe(f"topic-{i}", lambda env: asyncio.sleep(0))
            with pytest.raises(ConfigError, match="at most 8"):
                listener.subscribe("one-too-many", lambda env: asyncio.sleep(0))
        finally:
            await listener.close()


async def test_errors_a_peer_sends_are_logged_at_a_bounded_rate_and_length(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer's one-way ``Error`` bodies are logged at most once a second, cut short
    (review finding: 20,000 of them with 2 KB messages grew the log by 41 MB)."""
    async with _arena() as (_, _, raw):
        await asyncio.to_thread(_request, raw, {"kind": "hello", "name": "raw"}, 1)
        error = {"body": {"kind": "error", "code": "boom", "message": "m" * 2_000}}
        with caplog.at_level(logging.WARNING, logger="parley.protocols.bus"):
            start = time.monotonic()
            for _ in range(5_000):
                raw.send(msgpack.packb(error))
            # A request after them: answered once every error before it was read.
            await asyncio.to_thread(_request, raw, {"kind": "subscribe", "channels": ["x"]}, 2)
            elapsed = time.monotonic() - start
        lines = [r.getMessage() for r in caplog.records if "sent error boom" in r.getMessage()]
        assert 1 <= len(lines) <= elapsed + 2, f"{len(lines)} lines in {elapsed:.1f} s"
        assert all(len(line) < 600 for line in lines)


@pytest.mark.parametrize("interval", [float("inf"), float("nan"), 1e9, -1.0])
async def test_no_announced_heartbeat_interval_makes_a_silent_peer_immortal(
    interval: float,
) -> None:
    """A peer's ``Hello`` stretches its timeout by its announced heartbeat interval, up to
    60 s: ``inf`` made a peer that went silent keep its name (its seat) for ever."""
    async with _arena() as (server, _, raw):
        hello = {"kind": "hello", "name": "raw", "heartbeat_interval": interval}
        assert (await asyncio.to_thread(_request, raw, hello, 1))["body"]["kind"] == "hello"
        assert server._registry.links["raw"].timeout <= 2.5 * 60.0
