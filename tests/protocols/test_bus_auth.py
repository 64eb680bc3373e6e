"""Nobody takes a seat they were not given (issue 11 §1): CURVE keys, names bound to keys,
routing ids that cannot be stolen, binds that refuse to be open by accident.

Each attack runs against a live legitimate peer, which must be unaffected: every request
the server sends reaches it, and every answer the server gets comes from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import zmq

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import ConfigError, RemoteError, RequestTimeout
from parley.protocols.messages import Action, Envelope, Observation

pytestmark = pytest.mark.timeout(60)


@dataclass
class Keys:
    public: bytes
    secret: bytes

    @classmethod
    def new(cls) -> Keys:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


def _server_config(server: Keys, *clients: Keys) -> BusConfig:
    return BusConfig(
        heartbeat_interval=0.1,
        peer_timeout=1.0,
        request_timeout=5.0,
        curve_public_key=server.public,
        curve_secret_key=server.secret,
        curve_allowed_clients=tuple(c.public for c in clients),
    )


def _client_config(me: Keys, server: Keys) -> BusConfig:
    return BusConfig(
        heartbeat_interval=0.1,
        peer_timeout=1.0,
        request_timeout=5.0,
        curve_public_key=me.public,
        curve_secret_key=me.secret,
        curve_server_key=server.public,
    )


def _acting_as(seat: str, who: str) -> Any:
    async def act(env: Envelope) -> Action:
        assert isinstance(env.body, Observation)
        return Action(agent=seat, text=who)

    return act


@dataclass
class Arena:
    server: Endpoint
    address: str
    keys: Keys
    legit: Keys
    other: Keys  # a key the arena admits, for another seat


@pytest.fixture
async def arena() -> AsyncIterator[Arena]:
    """A CURVE arena that admits two client keys and binds ``agent-listener`` to one."""
    keys, legit, other = Keys.new(), Keys.new(), Keys.new()
    server = Endpoint("arena", config=_server_config(keys, legit, other))
    bound = {"agent-listener": legit.public.decode()}  # keys are Z85 text already

    def policy(name: str, key: str | None) -> str | None:
        if name in bound and key != bound[name]:
            return f"{name} is bound to another key"
        return None

    server.set_admission(policy)
    try:
        address = await server.bind("tcp://127.0.0.1:0")
        yield Arena(server, address, keys, legit, other)
    finally:
        await server.close()


async def _legit_agent(arena: Arena) -> Endpoint:
    agent = Endpoint("agent-listener", config=_client_config(arena.legit, arena.keys))
    agent.on(Observation, _acting_as("listener", "legit"))
    assert await agent.connect(arena.address, timeout=5) == "arena"
    return agent


async def _all_answers_from_legit(arena: Arena, n: int = 50) -> None:
    answers = [
        await arena.server.request("agent-listener", Observation(agent="listener", text=str(i)))
        for i in range(n)
    ]
    assert [a.text for a in answers if isinstance(a, Action)] == ["legit"] * n


def _raw_curve_dealer(ctx: zmq.Context[Any], address: str, me: Keys, server: Keys) -> Any:
    sock = ctx.socket(zmq.DEALER)
    sock.linger, sock.rcvtimeo = 0, 2000
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
        server.public,
        me.public,
        me.secret,
    )
    return sock


def _hello(name: str) -> bytes:
    body = {"kind": "hello", "name": name, "schemas": [1]}
    return msgpack.packb({"body": body, "sender": name, "id": 1, "expects_reply": True})


@pytest.mark.parametrize("intruder", ["wrong key", "no key", "server's key as client"])
async def test_unlisted_or_missing_keys_complete_no_handshake(arena: Arena, intruder: str) -> None:
    agent = await _legit_agent(arena)
    stranger = Keys.new()
    if intruder == "wrong key":
        config = _client_config(stranger, arena.keys)
    elif intruder == "no key":
        config = BusConfig(request_timeout=5.0)
    else:
        config = _client_config(arena.keys, arena.keys)
    bad = Endpoint("agent-listener-2", config=config)
    try:
        with pytest.raises(RequestTimeout):
            await bad.connect(arena.address, timeout=1.5)
        assert arena.server.peers == ["agent-listener"]
        await _all_answers_from_legit(arena)
    finally:
        await bad.close()
        await agent.close()


async def test_a_name_bound_to_a_key_cannot_be_squatted(arena: Arena) -> None:
    """Another admitted key saying Hello as the seat's agent is refused, before and after
    the real agent joins; the real agent then joins normally."""
    squatter = Endpoint("agent-listener", config=_client_config(arena.other, arena.keys))
    squatter.on(Observation, _acting_as("listener", "squatter"))
    try:
        with pytest.raises(RemoteError, match="bound to another key") as refused:
            await squatter.connect(arena.address, timeout=5)
        assert refused.value.code == "not_admitted"
        agent = await _legit_agent(arena)
        await _all_answers_from_legit(arena)
        await agent.close()
    finally:
        await squatter.close()


async def test_a_replayed_hello_from_another_key_is_refused(arena: Arena) -> None:
    """The legitimate agent's exact Hello bytes, sent from another admitted key's connection
    while the agent is live, get ``not_admitted``; the agent keeps its seat."""
    agent = await _legit_agent(arena)
    ctx: zmq.Context[Any] = zmq.Context()
    raw = _raw_curve_dealer(ctx, arena.address, arena.other, arena.keys)
    try:
        raw.connect(arena.address)
        raw.send(_hello("agent-listener"))
        reply = msgpack.unpackb(await asyncio.to_thread(raw.recv))
        assert reply["body"]["code"] == "not_admitted"
        await _all_answers_from_legit(arena)
    finally:
        raw.close()
        ctx.term()
        await agent.close()


async def test_a_stolen_routing_id_takes_nothing_over(arena: Arena) -> None:
    """A connection that copies the live agent's routing id (with another admitted key) is
    refused by ZeroMQ; once the agent is gone, a connection reusing its id is a new,
    unknown peer that must say Hello (and cannot, under that name)."""
    agent = await _legit_agent(arena)
    rid = agent._registry.socks[0].z.getsockopt(zmq.ROUTING_ID)
    ctx: zmq.Context[Any] = zmq.Context()
    thief = _raw_curve_dealer(ctx, arena.address, arena.other, arena.keys)
    thief.routing_id = rid
    try:
        thief.connect(arena.address)
        action = {"body": {"kind": "action", "agent": "listener", "text": "thief"}}
        for _ in range(20):
            thief.send(msgpack.packb(action))
        await _all_answers_from_legit(arena, 200)
        await agent.close()  # the id is free now: the thief's next connection may use it
        thief.close()
        thief = _raw_curve_dealer(ctx, arena.address, arena.other, arena.keys)
        thief.routing_id = rid
        thief.connect(arena.address)
        observation = {"kind": "observation", "agent": "listener", "text": "x"}
        thief.send(msgpack.packb({"body": observation, "id": 5, "expects_reply": True}))
        reply = msgpack.unpackb(await asyncio.to_thread(thief.recv))
        assert reply["body"]["code"] == "hello_required"
        thief.send(_hello("agent-listener"))
        assert (
            msgpack.unpackb(await asyncio.to_thread(thief.recv))["body"]["code"] == "not_admitted"
        )
        assert "agent-listener" not in arena.server.peers
    finally:
        thief.close()
        ctx.term()


async def test_a_stolen_routing_id_over_ipc_is_refused_while_the_peer_lives(tmp_path: Any) -> None:
    """Without CURVE, a live connection's routing id cannot be taken over (no handover)."""
    config = BusConfig(heartbeat_interval=0.1, peer_timeout=1.0, request_timeout=5.0)
    server = Endpoint("arena", config=config)
    agent = Endpoint("agent-listener", config=config)
    agent.on(Observation, _acting_as("listener", "legit"))
    ctx: zmq.Context[Any] = zmq.Context()
    thief = ctx.socket(zmq.DEALER)
    thief.linger = 0
    try:
        address = await server.bind(f"ipc://{tmp_path}/arena")
        await agent.connect(address)
        thief.routing_id = agent._registry.socks[0].z.getsockopt(zmq.ROUTING_ID)
        thief.connect(address)
        action = {"body": {"kind": "action", "agent": "listener", "text": "thief"}}
        for _ in range(20):
            thief.send(msgpack.packb(action), zmq.NOBLOCK)
        answers = [
            await server.request("agent-listener", Observation(agent="listener", text=str(i)))
            for i in range(200)
        ]
        assert {a.text for a in answers if isinstance(a, Action)} == {"legit"}
        assert len(answers) == 200
        assert server.stats.unhandled == 0
    finally:
        thief.close()
        ctx.term()
        await agent.close()
        await server.close()


async def test_two_curve_binds_in_one_process_each_admit_their_keys() -> None:
    """One CURVE endpoint after another (the first closed), then two at once: each admits
    its listed key and refuses a stranger's. (Before: the second admitted nobody.)"""
    for _ in range(2):
        keys, client = Keys.new(), Keys.new()
        server = Endpoint("arena", config=_server_config(keys, client))
        try:
            address = await server.bind("tcp://127.0.0.1:0")
            good = Endpoint("good", config=_client_config(client, keys))
            assert await good.connect(address, timeout=5) == "arena"
            await good.close()
        finally:
            await server.close()
    servers = [(Keys.new(), Keys.new()) for _ in range(2)]
    endpoints = [
        Endpoint(f"arena{i}", config=_server_config(k, c)) for i, (k, c) in enumerate(servers)
    ]
    try:
        addresses = [await e.bind("tcp://127.0.0.1:0") for e in endpoints]
        for i, ((keys, client), address) in enumerate(zip(servers, addresses, strict=True)):
            good = Endpoint(f"good{i}", config=_client_config(client, keys))
            stranger = Endpoint(f"bad{i}", config=_client_config(Keys.new(), keys))
            try:
                assert await good.connect(address, timeout=5) == f"arena{i}"
                with pytest.raises(RequestTimeout):
                    await stranger.connect(address, timeout=1.0)
            finally:
                await good.close()
                await stranger.close()
        assert [e._auth.refused for e in endpoints] == [1, 1]
    finally:
        for e in endpoints:
            await e.close()


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:0", "tcp://*:0"])
async def test_open_tcp_without_keys_is_refused_unless_asked_for(address: str) -> None:
    server = Endpoint("arena")
    try:
        with pytest.raises(ConfigError, match="parley keys new"):
            await server.bind(address)
    finally:
        await server.close()
    insecure = Endpoint("arena", config=BusConfig(allow_insecure_tcp=True))
    try:
        assert (await insecure.bind(address)).startswith("tcp://")
    finally:
        await insecure.close()


async def test_a_keyed_ipc_listener_admits_its_keys_and_only_them(tmp_path: Any) -> None:
    """CURVE over ``ipc://`` as over ``tcp://`` (before: a keyed ipc:// bind was plain text,
    so the name bound to a key refused its own agent, "bound to another key")."""
    keys, legit, other = Keys.new(), Keys.new(), Keys.new()
    server = Endpoint("arena", config=_server_config(keys, legit))
    server.set_admission(
        lambda name, key: None if key == legit.public.decode() else f"{name}: wrong key {key}"
    )
    agent = Endpoint("agent-listener", config=_client_config(legit, keys))
    agent.on(Observation, _acting_as("listener", "legit"))
    intruder = Endpoint("agent-intruder", config=_client_config(other, keys))
    try:
        address = await server.bind(f"ipc://{tmp_path}/arena")
        assert await agent.connect(address, timeout=5) == "arena"
        answer = await server.request("agent-listener", Observation(agent="listener", text="?"))
        assert isinstance(answer, Action)
        assert answer.text == "legit"
        with pytest.raises(RequestTimeout):  # (an unlisted key completes no handshake)
            await intruder.connect(address, timeout=1)
        assert server.peers == ["agent-listener"]
    finally:
        for endpoint in (intruder, agent, server):
            await endpoint.close()


async def test_a_loopback_prefix_does_not_pass_a_public_bind_as_loopback() -> None:
    """ZeroMQ binds ``tcp://127.0.0.1:0;0.0.0.0:PORT`` on 0.0.0.0:PORT: it was taken for a
    loopback address (its host began with ``127.``) and bound in plain text."""
    from parley.protocols.bus.auth import is_loopback

    server = Endpoint("arena")
    try:
        with pytest.raises(ConfigError, match="parley keys new"):
            await server.bind("tcp://127.0.0.1:0;0.0.0.0:0")
    finally:
        await server.close()
    loopback = ["tcp://127.0.0.1:0", "tcp://127.5.6.7:80", "tcp://localhost:1", "tcp://[::1]:0"]
    assert all(is_loopback(a) for a in loopback)
    public = ["tcp://127.0.0.1:0;0.0.0.0:5555", "tcp://127.0.0.1.example.com:80",
              "tcp://127.evil:1", "tcp://[::1];0.0.0.0:1", "tcp://eth0:1", "tcp://*:0"]  # fmt: skip
    assert not any(is_loopback(a) for a in public)


async def test_curve_without_a_key_list_is_refused_unless_any_key_is_wanted() -> None:
    keys = Keys.new()
    base = {"curve_public_key": keys.public, "curve_secret_key": keys.secret}
    server = Endpoint("arena", config=BusConfig(**base))
    try:
        with pytest.raises(ConfigError, match="curve_allowed_clients"):
            await server.bind("tcp://127.0.0.1:0")
    finally:
        await server.close()
    anyone = Endpoint("arena", config=BusConfig(curve_allow_any=True, **base))
    client = Endpoint("c", config=_client_config(Keys.new(), keys))
    try:
        address = await anyone.bind("tcp://127.0.0.1:0")
        assert await client.connect(address, timeout=5) == "arena"
    finally:
        await client.close()
        await anyone.close()
