"""An endpoint decodes only the body kinds it reads, and lists of names are bounded, so a
peer that was admitted (a seated agent, a pool client) cannot make it build a huge body
(review finding: ``Observation.info`` holds any MessagePack value, and 64 MiB of empty
lists there decoded to ~4.5 GB of Python lists once the sender had said Hello)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgpack
import pytest
import zmq

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import Runner
from parley.arena.run.security import (
    ARENA_ACCEPTS,
    ARENA_MAX_MESSAGE_BYTES,
    arena_endpoint_config,
)
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.codec import Codec
from parley.protocols.errors import ConfigError, ProtocolError, RemoteError
from parley.protocols.messages import MAX_LIST_ITEMS, Action, Envelope, Observation
from tests.arena.run.test_runner import SCENARIO
from tests.protocols.test_bus_hostile import FAST, _ipc, _request, _wide_observation

pytestmark = pytest.mark.timeout(60)

ACTIONS = dataclasses.replace(FAST, accept=frozenset({"action"}))


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


_BASE = [0]


def _start_counting() -> None:
    """Count allocations from here on (what is alive now, the attack's frame, is not)."""
    tracemalloc.reset_peak()
    _BASE[0] = tracemalloc.get_traced_memory()[0]


def _peak() -> int:
    """The most bytes allocated at once since :func:`_start_counting`."""
    return tracemalloc.get_traced_memory()[1] - _BASE[0]


def test_the_attack_is_real_without_accept(traced: None) -> None:
    """The reference: a codec that takes every kind builds ~64 bytes per wire byte."""
    frame = _wide_observation(1_000_000, 1)
    _start_counting()
    envelope = Codec().decode([frame])
    assert isinstance(envelope.body, Observation)
    assert _peak() > 32 * len(frame)


@pytest.mark.parametrize("tag_last", [False, True])
def test_a_kind_not_accepted_is_refused_unread(traced: None, tag_last: bool) -> None:
    """8 MiB of empty lists in an observation's ``info``: refused before one is built,
    wherever the body puts its ``kind``, with the kinds the endpoint does take."""
    if tag_last:
        info = b"\x81\xa1k\xdd" + (8 << 20).to_bytes(4, "big") + b"\x90" * (8 << 20)
        body = b"\x84\xa5agent\xa1x\xa4text\xa1t\xa4info" + info + b"\xa4kind\xabobservation"
        frame = b"\x82\xa2id\x07\xa4body" + body
    else:
        frame = _wide_observation(8 << 20, 7)
    codec = Codec(accept={"action"})
    _start_counting()
    with pytest.raises(ProtocolError) as refused:
        codec.decode([frame])
    assert _peak() < 1 << 20, f"{_peak() / 1e6:.0f} MB allocated for a refused message"
    assert refused.value.code == "unexpected_kind"
    assert "does not take observation messages" in refused.value.reason
    assert "it takes action, bye, error, heartbeat, hello, ok" in refused.value.reason


def test_accepted_and_session_kinds_still_decode() -> None:
    codec = Codec(accept={"action"})
    for body in (Action(agent="a", text="hi"), Observation(agent="a", text="t")):
        envelope = Envelope(body=body, sender="s", id=3)
        if isinstance(body, Action):
            decoded = codec.decode(codec.encode(envelope))
            assert isinstance(decoded, Envelope)
            assert (decoded.body, decoded.sender, decoded.id) == (body, "s", 3)
        else:
            with pytest.raises(ProtocolError, match="does not take"):
                codec.decode(codec.encode(envelope))
    # A malformed body of an accepted kind is still explained as malformed.
    with pytest.raises(ProtocolError, match="malformed message") as bad:
        codec.decode([msgpack.packb({"body": {"kind": "action", "agent": 1}})])
    assert bad.value.code == "bad_message"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "ok"}, "to"),
        ({"kind": "subscribe", "channels": None}, "channels"),
        ({"kind": "hello", "name": "x", "subscriptions": None}, "subscriptions"),
    ],
)
def test_lists_of_names_are_bounded_before_their_entries_are_built(
    traced: None, body: dict[str, Any], field: str
) -> None:
    """Two-byte strings cost ~20x their size in Python: a list of names longer than
    MAX_LIST_ITEMS is refused from its length alone."""
    names = ["ab"] * 2_000_000
    message = {"body": {k: names if v is None else v for k, v in body.items()}}
    if field == "to":
        message["to"] = names
    frame = msgpack.packb(message)
    del names, message
    _start_counting()
    with pytest.raises(ProtocolError, match=f"length <= {MAX_LIST_ITEMS}"):
        Codec().decode([frame])
    assert _peak() < 1 << 20


def test_accept_names_real_kinds_and_covers_the_handlers() -> None:
    with pytest.raises(ConfigError, match="unknown body kinds"):
        BusConfig(accept=frozenset({"actoin"}))
    endpoint = Endpoint("arena", config=ACTIONS)
    with pytest.raises(ConfigError, match="leaves out 'observation'"):
        endpoint.on(Observation, lambda env: None)  # type: ignore[arg-type, return-value]


async def _act(env: Envelope) -> Action:
    assert isinstance(env.body, Observation)
    return Action(agent="alice", text=env.body.text.upper())


def _next_reply(raw: zmq.Socket[bytes]) -> dict[str, Any]:
    """The next message that is not a heartbeat (the server's, when it was idle)."""
    while True:
        message: dict[str, Any] = msgpack.unpackb(raw.recv())
        if message["body"]["kind"] != "heartbeat":
            return message


@contextlib.asynccontextmanager
async def _raw_peer(address: str, name: str) -> AsyncIterator[zmq.Socket[bytes]]:
    """A plain DEALER that has said Hello to ``address`` as ``name``."""
    ctx: zmq.Context[Any] = zmq.Context()
    raw: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    raw.linger, raw.rcvtimeo = 0, 10_000
    try:
        raw.connect(address)
        hello = {"kind": "hello", "name": name}
        assert (await asyncio.to_thread(_request, raw, hello, 1))["body"]["kind"] == "hello"
        yield raw
    finally:
        raw.close()
        ctx.term()


@contextlib.asynccontextmanager
async def _seated() -> AsyncIterator[tuple[Endpoint, zmq.Socket[bytes]]]:
    """An arena-like endpoint (takes actions), a peer ``alice`` it asks for actions, and a
    raw DEALER that has said Hello as ``raw``."""
    server = Endpoint("arena", config=ACTIONS)
    alice = Endpoint("alice", config=FAST)
    alice.on(Observation, _act)
    try:
        address = await server.bind(_ipc())
        await alice.connect(address)
        async with _raw_peer(address, "raw") as raw:
            yield server, raw
    finally:
        await alice.close()
        await server.close()


async def test_a_seated_peer_cannot_make_the_endpoint_build_what_it_never_reads(
    traced: None,
) -> None:
    """A peer that said Hello sends four 4 MiB observation bombs: each is answered
    ``unexpected_kind`` with its id, nothing large is allocated, and the endpoint's own
    requests to another peer (observations out, actions back) go on."""
    async with _seated() as (server, raw):
        frame = _wide_observation(4 << 20, 9)
        _start_counting()

        def attack() -> list[dict[str, Any]]:
            for _ in range(4):
                raw.send(frame)
            return [_next_reply(raw) for _ in range(4)]

        attacker = asyncio.create_task(asyncio.to_thread(attack))
        answers = [await server.request("alice", Observation(agent="a", text=f"m{i}"))
                   for i in range(20)]  # fmt: skip
        replies = await attacker
        peak = _peak()
        bad = server.stats.bad_messages
    assert [(r["body"]["code"], r["reply_to"]) for r in replies] == [("unexpected_kind", 9)] * 4
    assert [a.text for a in answers if isinstance(a, Action)] == [f"M{i}" for i in range(20)]
    assert peak < 4 * len(frame), f"{peak / 1e6:.0f} MB allocated for 4 refused messages"
    assert bad == 4


async def test_a_reply_of_a_kind_not_accepted_fails_its_request() -> None:
    async def wrong(env: Envelope) -> Observation:
        return Observation(agent="alice", text="not an action", info={"k": [[]] * 1000})

    server = Endpoint("arena", config=ACTIONS)
    alice = Endpoint("alice", config=FAST)
    alice.on(Observation, wrong)
    try:
        await alice.connect(await server.bind(_ipc()))
        with pytest.raises(RemoteError) as failed:
            await server.request("alice", Observation(agent="a", text="go"), timeout=5)
    finally:
        await alice.close()
        await server.close()
    assert failed.value.code == "unexpected_kind"


def test_the_runners_arena_takes_only_actions_and_a_bomb_fails_its_episode() -> None:
    """A seated remote agent answering with an observation bomb fails its episodes with
    ``unexpected_kind``; the arena stays up and the run ends."""
    own = arena_endpoint_config(BusConfig())
    assert own.accept == ARENA_ACCEPTS == {"action"}
    assert own.max_message_bytes == ARENA_MAX_MESSAGE_BYTES
    mine = BusConfig(accept=frozenset({"action", "chat"}), max_message_bytes=1 << 20)
    assert arena_endpoint_config(mine) == mine
    bombs = asyncio.Event()
    endpoints: list[Endpoint] = []

    async def agents(address: str) -> None:
        async def good(env: Envelope) -> Action:
            assert isinstance(env.body, Observation)
            return Action(agent=env.body.agent, text="0")

        async def bomb(env: Envelope) -> Observation:
            bombs.set()
            return Observation(agent="b", text="t", info={"k": [[]] * 500_000})

        for name, handler in (("agent-a", good), ("agent-b", bomb)):
            endpoints.append(endpoint := Endpoint(name, config=FAST))
            endpoint.on(Observation, handler)  # type: ignore[arg-type]
            await endpoint.connect(address)

    config = RunConfig(
        scenario=SCENARIO, agents=["remote", "remote"], episodes=3, concurrency=3,
        listen=f"ipc://{tempfile.gettempdir()}/parley-accept-{id(bombs)}", progress=False,
        join_timeout=20.0, act_timeout=10.0,
    )  # fmt: skip

    async def main() -> Any:
        joining: list[asyncio.Task[None]] = []
        runner = Runner(config, on_listen=lambda a: joining.append(asyncio.create_task(agents(a))))
        try:
            return await runner.run()
        finally:
            for endpoint in endpoints:
                await endpoint.close()

    result = asyncio.run(main())
    assert bombs.is_set()
    assert result.summary["episodes"]["failed"] == 3
    reasons = [f["reason"] for f in result.summary["failures"]]
    assert all("does not take observation messages" in r for r in reasons), reasons


async def test_an_agent_host_takes_only_observations_from_its_arena() -> None:
    """A hostile arena: a request of another kind (a long trajectory) is refused unread,
    the seat's observations are still answered."""
    from parley.arena.run.agent_host import join_arena
    from parley.protocols.messages import Trajectory, TurnRecord
    from tests.arena.run.test_runner import TargetAgent

    arena = Endpoint("arena", config=FAST)
    try:
        address = await arena.bind(_ipc())
        joined = asyncio.create_task(
            join_arena(address, {"a": TargetAgent}, bus=FAST, poll_interval=0.05)
        )
        while "agent-a" not in arena.peers:  # noqa: ASYNC110 -- (no join event to await)
            await asyncio.sleep(0.01)
        turns = [TurnRecord(turn=i, observation="", action="") for i in range(100_000)]
        bomb = Trajectory(episode="e", scenario="s", agent="a", turns=turns)
        with pytest.raises(RemoteError) as refused:
            await arena.request("agent-a", bomb, timeout=5)
        observation = Observation(agent="a", text="t", scenario=SCENARIO, info={"target": 3})
        answer = await arena.request("agent-a", observation, episode="e1", timeout=5)
    finally:
        await arena.close()
    await asyncio.wait_for(joined, 10)
    assert refused.value.code == "unexpected_kind"
    assert isinstance(answer, Action)


async def test_a_message_of_too_many_frames_is_refused_without_being_kept() -> None:
    """Empty frames count nothing towards max_message_bytes: a message of 200,000 of them
    is read to its end, refused ``bad_message`` (its id answered), and the next message of
    the same peer is served."""
    from parley.protocols.bus.refuse import MAX_FRAMES

    async with _seated() as (server, raw):
        head = msgpack.packb({"body": {"kind": "ok"}, "id": 5, "expects_reply": True})
        raw.send_multipart([head] + [b""] * 200_000)
        subscribe = {"kind": "subscribe", "channels": ["x"]}
        refusal = await asyncio.to_thread(_request, raw, subscribe, 6)  # (the first reply)
        ok = await asyncio.to_thread(_next_reply, raw)
        answer = await server.request("alice", Observation(agent="a", text="still here"))
        bad = server.stats.bad_messages
    assert (refusal["body"]["code"], refusal["reply_to"]) == ("bad_message", 5)
    assert f"200001 frames; at most {MAX_FRAMES}" in refusal["body"]["message"]
    assert (ok["body"]["kind"], ok["reply_to"]) == ("ok", 6)
    assert isinstance(answer, Action)
    assert answer.text == "STILL HERE"
    assert bad == 1


def test_token_ids_are_never_negative() -> None:
    """A negative id is a ~40x allocation per wire byte and never a token."""
    from parley.protocols.messages import TokenRecord

    codec = Codec()
    token = TokenRecord(policy="p", policy_version=1, prompt_token_ids=[1, -3], token_ids=[2],
                        logprobs=[-0.1])  # fmt: skip
    frames = codec.encode(Envelope(body=Action(agent="a", text="x", tokens=[token])))
    with pytest.raises(ProtocolError, match=r"Expected `int` >= 0 - at `\$.body.tokens\[0\]"):
        codec.decode(frames)


def test_an_arena_config_that_names_its_kinds_leaves_the_in_process_host_working() -> None:
    """``Runner(bus=BusConfig(accept={"action"}))``: the in-process agents (over the bus)
    still get their observations."""
    from tests.arena.run.test_runner import TargetAgent

    config = RunConfig(scenario=SCENARIO, agents=["scripted", "scripted"], episodes=2,
                       progress=False, local_agents_over_bus=True)  # fmt: skip
    runner = Runner(config, agents={"a": TargetAgent, "b": TargetAgent}, bus=ACTIONS)
    result = asyncio.run(runner.run())
    assert result.summary["episodes"] == {"total": 2, "ok": 2, "failed": 0}


async def test_a_peer_cannot_claim_another_sender() -> None:
    """``Envelope.sender`` is a claim: handlers (and logs) see the name the connection
    said Hello with."""
    seen: list[str] = []

    async def record(env: Envelope) -> Action:
        seen.append(env.sender)
        return Action(agent="x", text="ok")

    server = Endpoint("pool", config=FAST)
    server.on(Observation, record)
    try:
        address = await server.bind(_ipc())
        async with _raw_peer(address, "mallory") as raw:
            obs = {"kind": "observation", "agent": "a", "text": "t"}
            envelope = {"body": obs, "sender": "trainer", "id": 2, "expects_reply": True}
            raw.send(msgpack.packb(envelope))
            reply = await asyncio.to_thread(_next_reply, raw)
    finally:
        await server.close()
    assert reply["body"]["kind"] == "action"
    assert seen == ["mallory"]


def _weights_with_array_map(array_map: bytes) -> bytes:
    """A weights request whose one tensor's map is ``array_map`` (written by hand)."""
    body = (
        b"\x84" + msgpack.packb("kind") + msgpack.packb("weights")
        + msgpack.packb("policy") + msgpack.packb("p")
        + msgpack.packb("version") + msgpack.packb(1)
        + msgpack.packb("tensors") + b"\x81" + msgpack.packb("w") + array_map
    )  # fmt: skip
    return b"\x82" + msgpack.packb("id") + msgpack.packb(3) + msgpack.packb("body") + body


@pytest.mark.parametrize("extra", ["junk", "shape"])
def test_a_weights_array_map_is_checked_closed_before_it_is_built(traced: None, extra: str) -> None:
    """The decoder hands an array's map to the codec's hook as any value, built whole: 4 MiB
    of empty lists under an extra key (or as a shape) cost ~64x before anything looked."""
    lists = b"\xdd" + (4 << 20).to_bytes(4, "big") + b"\x90" * (4 << 20)
    if extra == "junk":
        array_map = b"\x84\xa5dtype\xa3<f4\xa5shape\x91\x01\xa4data\xc4\x04\x00\x00\x00\x00"
        array_map += b"\xa4junk" + lists
    else:
        array_map = b"\x82\xa5dtype\xa3<f4\xa5shape" + lists
    frame = _weights_with_array_map(array_map)
    codec = Codec(accept={"generate", "weights"})
    _start_counting()
    with pytest.raises(ProtocolError, match="malformed array in a weights message"):
        codec.decode([frame])
    assert _peak() < 1 << 20, f"{_peak() / 1e6:.0f} MB allocated for a refused message"


def test_large_weights_inline_still_decode() -> None:
    import numpy as np

    from parley.protocols.messages import WeightUpdate

    tensors = {"a": np.arange(40_000, dtype="f4").reshape(200, 200), "b": np.zeros(3, "i8")}
    codec = Codec(zero_copy_bytes=1 << 30)  # every array inline: one large frame
    frames = codec.encode(Envelope(body=WeightUpdate(policy="p", version=2, tensors=tensors)))
    assert len(frames) == 1
    assert len(frames[0]) > 64 * 1024
    body = Codec(accept={"weights"}).decode(frames).body
    assert isinstance(body, WeightUpdate)
    assert all(np.array_equal(body.tensors[k], v) for k, v in tensors.items())
