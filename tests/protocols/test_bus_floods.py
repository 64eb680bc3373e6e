"""A seated peer flooding an endpoint: large messages nobody asked for, requests whose
replies it never reads, and a stranger's duplicate Hellos (adversarial review, second
session of 2026-12-04). Before: one agent sending 16 MiB one-way actions froze the arena's
loop for 30 s and more and pushed it to 3-7 GB, and the legitimate agent was declared dead
after 6 s; one that never read its replies grew 388,000 tasks in 30 s; 193,800 duplicate
Hellos made 193,809 heartbeats to the live peer in 12 s."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any

import msgpack
import pytest
import zmq

from parley.protocols.bus import Endpoint
from parley.protocols.bus.refuse import MAX_UNWANTED
from parley.protocols.bus.send import MAX_REPLIES_WAITING
from parley.protocols.messages import Action, Observation
from tests.protocols.test_bus_accept import (
    ACTIONS,
    _next_reply,
    _peak,
    _raw_peer,
    _seated,
    _start_counting,
    traced,
)
from tests.protocols.test_bus_hostile import FAST, _ipc

pytestmark = pytest.mark.timeout(60)

__all__ = ["traced"]  # (the fixture, imported for the tests here)

N_IDS = 2_000_000  # one byte each on the wire; 8 bytes each in a decoded list


def _big_action(*, reply_to: int = 0, request_id: int = 0) -> bytes:
    """An action carrying one token record of ``N_IDS`` prompt token ids (~2 MB)."""
    record = {"policy": "", "policy_version": 0, "prompt_token_ids": [0] * N_IDS,
              "token_ids": [], "logprobs": []}  # fmt: skip
    env: dict[str, Any] = {"body": {"kind": "action", "agent": "raw", "text": "",
                                    "tokens": [record]}, "sender": "raw"}  # fmt: skip
    if reply_to:
        env["reply_to"] = reply_to
    if request_id:
        env.update(id=request_id, expects_reply=True)
    return bytes(msgpack.packb(env))


async def _until(check: Any, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)


async def test_large_actions_nobody_asked_for_are_dropped_unread(traced: None) -> None:
    """One-way actions and a reply to no request: counted and dropped without building
    their bodies, while the endpoint's own requests to another peer go on."""
    async with _seated() as (server, raw):
        oneway, late = _big_action(), _big_action(reply_to=999)
        _start_counting()

        def attack() -> None:
            for _ in range(MAX_UNWANTED - 2):
                raw.send(oneway)
            raw.send(late)

        await asyncio.to_thread(attack)
        answers = [await server.request("alice", Observation(agent="a", text=f"m{i}"))
                   for i in range(10)]  # fmt: skip
        await _until(lambda: server.stats.unhandled + server.stats.late_replies >= MAX_UNWANTED - 1)
        peak = _peak()
        stats = server.stats
        assert "raw" in server.peers  # (fewer than MAX_UNWANTED in a row)
    assert (stats.unhandled, stats.late_replies, stats.bad_messages) == (MAX_UNWANTED - 2, 1, 0)
    assert [a.text for a in answers if isinstance(a, Action)] == [f"M{i}" for i in range(10)]
    assert peak < 4 * len(oneway), f"{peak / 1e6:.0f} MB allocated for dropped messages"


async def test_a_peer_that_keeps_sending_them_is_declared_dead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="parley")
    async with _seated() as (server, raw):
        oneway = _big_action()
        await asyncio.to_thread(lambda: [raw.send(oneway) for _ in range(MAX_UNWANTED)])
        await _until(lambda: "raw" not in server.peers)
        assert "raw" not in server.peers
        assert f"it sent {MAX_UNWANTED} large messages nobody asked for" in caplog.text
        # Its connection is read no more: a new Hello on it is dropped unread.
        hello = {"body": {"kind": "hello", "name": "raw"}, "id": 50, "expects_reply": True}
        raw.send(msgpack.packb(hello))
        await _until(lambda: server.stats.unhandled > 0 and "raw" in server.peers, 0.5)
        assert "raw" not in server.peers
        assert "alice" in server.peers
        answer = await server.request("alice", Observation(agent="a", text="still"))
    assert isinstance(answer, Action)
    assert answer.text == "STILL"


async def test_a_large_request_no_handler_takes_is_answered_unread(traced: None) -> None:
    async with _seated() as (_, raw):
        request = _big_action(request_id=7)
        _start_counting()
        await asyncio.to_thread(raw.send, request)
        reply = await asyncio.to_thread(_next_reply, raw)
        peak = _peak()
    assert (reply["body"]["code"], reply["reply_to"]) == ("no_handler", 7)
    assert peak < 4 * len(request)


async def test_a_large_reply_to_a_pending_request_is_still_read() -> None:
    async with _seated() as (server, raw):

        def answer() -> None:
            asked = _next_reply(raw)
            raw.send(_big_action(reply_to=asked["id"]))

        answering = asyncio.create_task(asyncio.to_thread(answer))
        action = await server.request("raw", Observation(agent="raw", text="go"))
        await answering
    assert isinstance(action, Action)
    assert len(action.tokens[0].prompt_token_ids) == N_IDS


async def test_a_peer_that_never_reads_its_replies_cannot_grow_the_endpoints_tasks() -> None:
    server = Endpoint("arena", config=dataclasses.replace(ACTIONS, hwm=50))
    address = await server.bind(_ipc())
    n = 20_000
    try:
        async with _raw_peer(address, "raw") as raw:
            raw.rcvhwm = 1  # (takes effect on the next connection's pipe: also read nothing)
            body = {"kind": "action", "agent": "raw", "text": "x"}
            frames = [msgpack.packb({"body": body, "id": i, "expects_reply": True})
                      for i in range(2, n + 2)]  # fmt: skip
            await asyncio.to_thread(lambda: [raw.send(f) for f in frames])
            await _until(lambda: server.stats.received >= n)
            tasks = len(server._shared.tasks)
            stats = server.stats
    finally:
        await server.close()
    assert stats.received >= n
    assert tasks <= MAX_REPLIES_WAITING + 8
    assert stats.replies_dropped > 0


async def test_a_strangers_duplicate_hellos_do_not_flood_the_live_peer() -> None:
    server = Endpoint("arena", config=FAST)
    alice = Endpoint("alice", config=FAST)
    address = await server.bind(_ipc())
    await alice.connect(address)
    before = alice.stats.received
    codes: list[str] = []

    def stranger() -> None:
        ctx: zmq.Context[Any] = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger, sock.rcvtimeo = 0, 10_000
        sock.connect(address)
        hello = msgpack.packb({"body": {"kind": "hello", "name": "alice"}, "id": 1,
                               "expects_reply": True})  # fmt: skip
        for _ in range(3000):
            sock.send(hello)
        for _ in range(3000):
            codes.append(msgpack.unpackb(sock.recv())["body"].get("code", ""))
        sock.close()
        ctx.term()

    try:
        thread = threading.Thread(target=stranger)
        thread.start()
        await asyncio.to_thread(thread.join)
        received = alice.stats.received - before
        assert "alice" in server.peers
    finally:
        await alice.close()
        await server.close()
    assert set(codes) == {"duplicate_name"}
    assert received < 300, f"{received} messages to the live peer for 3,000 duplicate Hellos"


@pytest.mark.parametrize(
    ("body", "channel", "answer"),
    [
        ({"kind": "heartbeat"}, "", "ok"),
        ({"kind": "bye", "reason": "done"}, "", "ok"),
        ({"kind": "error", "code": "c", "message": "m"}, "", "bad_message"),
        ({"kind": "action", "agent": "raw", "text": "x"}, "news", "bad_message"),
    ],
)
async def test_every_request_is_answered(body: dict[str, Any], channel: str, answer: str) -> None:
    """PROTOCOL.md §6: a request is answered exactly once, whatever its kind (these four
    were left unanswered: the requester waited for its timeout)."""
    server = Endpoint("arena", config=FAST)
    address = await server.bind(_ipc())
    try:
        async with _raw_peer(address, "raw") as raw:
            message = {"body": body, "sender": "raw", "id": 5, "expects_reply": True}
            if channel:
                message["channel"] = channel
            raw.send(msgpack.packb(message))
            reply = await asyncio.to_thread(_next_reply, raw)
    finally:
        await server.close()
    assert reply["reply_to"] == 5
    assert reply["body"].get("code", reply["body"]["kind"]) == answer


async def test_a_slow_agents_late_replies_do_not_add_up_across_answers() -> None:
    """Eight late large replies spread over a long run, each after an answer in time, are
    not "eight in a row": the agent stays."""
    async with _seated() as (server, raw):
        late = _big_action(reply_to=999)

        def answer() -> None:
            asked = _next_reply(raw)
            raw.send(msgpack.packb({"body": {"kind": "action", "agent": "raw", "text": "ok"},
                                    "reply_to": asked["id"]}))  # fmt: skip

        for _ in range(2 * MAX_UNWANTED):
            await asyncio.to_thread(raw.send, late)
            answering = asyncio.create_task(asyncio.to_thread(answer))
            assert isinstance(
                await server.request("raw", Observation(agent="raw", text="go")), Action
            )
            await answering
        assert "raw" in server.peers
        assert server.stats.late_replies == 2 * MAX_UNWANTED
