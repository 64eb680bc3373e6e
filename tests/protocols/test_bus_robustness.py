"""The bus against bad input, refused handshakes, goodbyes, broadcast and reconnects."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import zmq

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.bus.refuse import MAX_BAD
from parley.protocols.codec import Codec
from parley.protocols.errors import BusError, PeerDead, ProtocolError, RemoteError
from parley.protocols.messages import (
    Action,
    Chat,
    Envelope,
    Observation,
    Trajectory,
)

FAST = BusConfig(heartbeat_interval=0.1, peer_timeout=0.6, request_timeout=5.0)


def _ipc() -> str:
    return f"ipc://{tempfile.gettempdir()}/parley-test-{os.urandom(4).hex()}"


@pytest.fixture
async def server() -> AsyncIterator[Endpoint]:
    ep = Endpoint("arena", config=FAST)
    try:
        yield ep
    finally:
        await ep.close()


async def _echo(env: Envelope) -> Action:
    assert isinstance(env.body, Observation)
    return Action(agent=env.body.agent, text=env.body.text)


def _raw_dealer(ctx: zmq.Context[Any], address: str) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvtimeo = 5000
    sock.connect(address)
    return sock


def _hello(sock: zmq.Socket[bytes], name: str, schemas: list[int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "hello", "name": name}
    if schemas is not None:
        body["schemas"] = schemas
    sock.send(msgpack.packb({"body": body, "sender": name, "id": 1, "expects_reply": True}))
    reply: dict[str, Any] = msgpack.unpackb(sock.recv())
    return reply


def _bad_frames(rng: random.Random, good: bytes) -> list[bytes]:
    """One malformed message: random bytes, a truncated envelope, or a wrong shape."""
    pick = rng.randrange(5)
    if pick == 0:
        return [rng.randbytes(rng.randrange(0, 300))]
    if pick == 1:
        return [good[: rng.randrange(0, len(good))]]
    if pick == 2:
        wrong = {"body": {"kind": rng.choice(["chat", "nope", "observation"]), "text": 3}}
        return [msgpack.packb(wrong)]
    if pick == 3:
        return [msgpack.packb(rng.choice([[1, 2], "str", 7, None, {"body": []}]))]
    return [good, rng.randbytes(10)]  # an array frame that nothing refers to


async def test_ten_thousand_bad_frames_rejected_while_serving(
    server: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """Each bad message gets an Error(bad_message); interleaved good requests all succeed.
    A good request follows every ``MAX_BAD - 1`` bad ones: ``MAX_BAD`` in a row would get
    the peer declared dead (``test_bus_flooders.py``)."""
    server.on(Observation, _echo)
    address = await server.bind(_ipc())
    good = Codec().encode(
        Envelope(body=Observation(agent="raw", text="ok"), sender="raw", id=1, expects_reply=True)
    )[0]
    assert isinstance(good, bytes)
    rng = random.Random(7)
    batches = [[_bad_frames(rng, good) for _ in range(MAX_BAD - 1)] for _ in range(1_430)]
    n_bad = len(batches) * (MAX_BAD - 1)  # 10,010
    for batch in batches:  # the codec alone rejects every one with ProtocolError
        for frames in batch:
            with pytest.raises(ProtocolError):
                Codec().decode(frames)

    client = Endpoint("alice", config=FAST)
    ctx: zmq.Context[Any] = zmq.Context()
    raw = _raw_dealer(ctx, address)
    try:
        await client.connect(address)
        assert (await asyncio.to_thread(_hello, raw, "raw"))["body"]["kind"] == "hello"

        def attack() -> tuple[int, int]:
            # Read each batch's answers before sending the next: sending all 11,440 first
            # exceeds the sockets' high-water marks, where ZeroMQ may drop answers by
            # design, and the count would depend on the machine's load.
            errors = replies = 0
            for i, batch in enumerate(batches):
                for frames in batch:
                    raw.send_multipart(frames)
                ids = i + 100
                raw.send(
                    msgpack.packb(
                        {
                            "body": {"kind": "observation", "agent": "raw", "text": str(i)},
                            "id": ids,
                            "expects_reply": True,
                        }
                    )
                )
                while errors + replies < (i + 1) * (len(batch) + 1):
                    message = msgpack.unpackb(raw.recv())
                    kind = message["body"]["kind"]
                    if kind == "error":
                        assert message["body"]["code"] == "bad_message"
                        errors += 1
                    elif kind == "action":
                        replies += 1
            return errors, replies

        attacker = asyncio.create_task(asyncio.to_thread(attack))
        answers = await asyncio.wait_for(
            asyncio.gather(
                *(
                    client.request("arena", Observation(agent="alice", text=str(i)))
                    for i in range(500)
                )
            ),
            60,
        )
        assert [a.text for a in answers if isinstance(a, Action)] == [str(i) for i in range(500)]
        errors, replies = await asyncio.wait_for(attacker, 60)
        assert (errors, replies) == (n_bad, len(batches))
        assert server.stats.bad_messages == n_bad
        assert set(server.peers) == {"alice", "raw"}
        crashes = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert crashes == [], "the receive loop hit an unexpected error"
    finally:
        raw.close()
        ctx.term()
        await client.close()


async def test_duplicate_name_and_unknown_version_are_refused(server: Endpoint) -> None:
    address = await server.bind(_ipc())
    first = Endpoint("alice", config=FAST)
    second = Endpoint("alice", config=FAST)
    ctx: zmq.Context[Any] = zmq.Context()
    raw = _raw_dealer(ctx, address)
    try:
        await first.connect(address)
        with pytest.raises(RemoteError) as info:
            await asyncio.wait_for(second.connect(address), 5)
        assert info.value.code == "duplicate_name"
        reply = await asyncio.to_thread(_hello, raw, "future", [7])
        assert reply["body"]["code"] == "unsupported_version"
        assert reply["reply_to"] == 1
        assert server.peers == ["alice"]
    finally:
        raw.close()
        ctx.term()
        await first.close()
        await second.close()


async def test_messages_before_hello_get_hello_required(server: Endpoint) -> None:
    address = await server.bind(_ipc())
    ctx: zmq.Context[Any] = zmq.Context()
    raw = _raw_dealer(ctx, address)
    try:
        raw.send(msgpack.packb({"body": {"kind": "ok"}, "id": 5, "expects_reply": True}))
        reply = msgpack.unpackb(await asyncio.to_thread(raw.recv))
        assert reply["body"]["code"] == "hello_required"
        assert reply["reply_to"] == 5
        # A message of a schema version this endpoint does not speak is refused by name.
        raw.send(msgpack.packb({"body": {"kind": "ok"}, "id": 6, "expects_reply": True, "v": 2}))
        reply = msgpack.unpackb(await asyncio.to_thread(raw.recv))
        assert reply["body"]["code"] == "unsupported_version"
        assert reply["reply_to"] == 6
        assert server.peers == []
        assert server.stats.bad_messages == 1
    finally:
        raw.close()
        ctx.term()


async def test_bye_fails_pending_requests_at_once(server: Endpoint) -> None:
    address = await server.bind(_ipc())
    client = Endpoint("alice", config=BusConfig(peer_timeout=30, heartbeat_interval=1))
    hang = asyncio.Event()

    async def never(env: Envelope) -> None:
        await hang.wait()

    client.on(Observation, never)
    await client.connect(address)
    await server.wait_for_peer("alice", 5)
    pending = asyncio.create_task(server.request("alice", Observation(agent="a", text="")))
    await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await client.close()
    with pytest.raises(PeerDead, match="goodbye"):
        await asyncio.wait_for(pending, 5)
    assert loop.time() - start < 1.0
    assert server.peers == []
    with pytest.raises(BusError):
        await server.request("alice", Observation(agent="a", text=""))


async def test_broadcast_reaches_subscribers_only(server: Endpoint) -> None:
    address = await server.bind(_ipc())
    got: dict[str, list[str]] = {"alice": [], "bob": [], "carol": []}
    clients = [Endpoint(name, config=FAST) for name in got]
    try:
        for ep in clients:
            await ep.connect(address)

        def record(name: str) -> Any:
            async def handler(env: Envelope) -> None:
                assert isinstance(env.body, Chat)
                got[name].append(f"{env.channel}:{env.body.text}")

            return handler

        await clients[0].subscribe("episode/1", record("alice"))
        await clients[1].subscribe("episode/", record("bob"))
        # carol subscribes to nothing and must receive nothing
        assert await server.publish("episode/1", Chat(sender="arena", text="a")) == 2
        assert await server.publish("episode/2", Chat(sender="arena", text="b")) == 1
        assert await server.publish("other", Chat(sender="arena", text="c")) == 0
        await asyncio.wait_for(_until(lambda: len(got["bob"]) == 2), 5)
        await clients[1].unsubscribe("episode/")
        assert await server.publish("episode/1", Chat(sender="arena", text="d")) == 1
        await asyncio.sleep(0.2)
        assert got == {
            "alice": ["episode/1:a", "episode/1:d"],
            "bob": ["episode/1:a", "episode/2:b"],
            "carol": [],
        }
    finally:
        for ep in clients:
            await ep.close()


async def test_subscriptions_travel_in_hello(server: Endpoint) -> None:
    """A subscription made before connecting reaches the peer in the handshake."""
    address = await server.bind(_ipc())
    got: list[str] = []

    async def handler(env: Envelope) -> None:
        assert isinstance(env.body, Trajectory)
        got.append(env.body.episode)

    async with Endpoint("trainer", config=FAST) as trainer:
        trainer.subscribe("trajectories", handler)
        await trainer.connect(address)
        await server.publish("trajectories", Trajectory(episode="e1", scenario="s", agent="a"))
        await asyncio.wait_for(_until(lambda: got == ["e1"]), 5)


async def test_dead_server_detected_and_reconnected(tmp_path: Any) -> None:
    """A connecting endpoint fails pending requests when the bound side dies, and shakes
    hands again by itself when an endpoint is bound at that address again."""
    address = f"ipc://{tmp_path}/bus"
    client = Endpoint("alice", config=FAST)
    first = Endpoint("arena", config=FAST)
    hang = asyncio.Event()

    async def never(env: Envelope) -> None:
        await hang.wait()

    first.on(Observation, never)
    await first.bind(address)
    try:
        await client.connect(address)
        pending = asyncio.create_task(client.request("arena", Observation(agent="a", text="")))
        await asyncio.sleep(0.05)
        # Vanish without a Bye, as a killed process would.
        first._shared.closed = True
        for sock in list(first._registry.socks):
            first._close_sock(sock)
        first._ctx.term()
        with pytest.raises(PeerDead):
            await asyncio.wait_for(pending, FAST.peer_timeout + 2)
        assert client.peers == []
        async with Endpoint("arena", config=FAST) as second:
            second.on(Observation, _echo)
            await second.bind(address)
            await client.wait_for_peer("arena", 5)
            reply = await client.request("arena", Observation(agent="a", text="back"))
            assert reply == Action(agent="a", text="back")
    finally:
        if first._ticker is not None:
            first._ticker.cancel()
        await client.close()


async def _until(condition: Any, step: float = 0.01) -> None:
    while not condition():  # noqa: ASYNC110 -- polls state set by other endpoints
        await asyncio.sleep(step)
