"""Request/reply, one-way sends and errors between two endpoints in one process."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator

import pytest
import zmq

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import BusError, RemoteError, RequestTimeout
from parley.protocols.messages import Action, Chat, Envelope, Observation, Ok, ToolCall

FAST = BusConfig(heartbeat_interval=0.1, peer_timeout=0.5, request_timeout=5.0)


def _address(transport: str) -> str:
    if transport == "inproc":
        return f"inproc://bus-{os.urandom(4).hex()}"
    if transport == "ipc":
        return f"ipc://{tempfile.gettempdir()}/parley-test-{os.urandom(4).hex()}"
    return "tcp://127.0.0.1:0"


@pytest.fixture(params=["inproc", "ipc", "tcp"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Endpoint, Endpoint]]:
    ctx = zmq.Context()
    server = Endpoint("arena", config=FAST, context=ctx)
    client = Endpoint("alice", config=FAST, context=ctx)
    try:
        address = await server.bind(_address(request.param))
        assert await asyncio.wait_for(client.connect(address), 5) == "arena"
        await asyncio.wait_for(server.wait_for_peer("alice", 5), 6)
        yield server, client
    finally:
        await client.close()
        await server.close()
        ctx.term()


async def _act(env: Envelope) -> Action:
    assert isinstance(env.body, Observation)
    return Action(agent=env.body.agent, text=env.body.text.upper())


async def test_request_reply_both_directions(pair: tuple[Endpoint, Endpoint]) -> None:
    server, client = pair
    server.on(Observation, _act)
    client.on(Observation, _act)
    reply = await asyncio.wait_for(
        client.request("arena", Observation(agent="alice", text="hi")), 5
    )
    assert reply == Action(agent="alice", text="HI")
    reply = await asyncio.wait_for(
        server.request("alice", Observation(agent="alice", text="yo"), episode="e1"), 5
    )
    assert reply == Action(agent="alice", text="YO")


async def test_many_concurrent_requests_with_slow_handler(pair: tuple[Endpoint, Endpoint]) -> None:
    server, client = pair

    async def slow(env: Envelope) -> Action:
        assert isinstance(env.body, Observation)
        await asyncio.sleep(0.001 * (int(env.body.text) % 5))
        return Action(agent="x", text=env.body.text)

    server.on(Observation, slow)
    replies = await asyncio.wait_for(
        asyncio.gather(
            *(client.request("arena", Observation(agent="x", text=str(i))) for i in range(200))
        ),
        10,
    )
    assert [r.text for r in replies if isinstance(r, Action)] == [str(i) for i in range(200)]


async def test_one_way_sends_arrive_in_order(pair: tuple[Endpoint, Endpoint]) -> None:
    server, client = pair
    got: list[str] = []
    done = asyncio.Event()

    async def on_chat(env: Envelope) -> None:
        assert isinstance(env.body, Chat)
        got.append(env.body.text)
        if len(got) == 1000:
            done.set()

    server.on(Chat, on_chat)
    for i in range(1000):
        await client.send("arena", Chat(sender="alice", text=str(i)))
    await asyncio.wait_for(done.wait(), 10)
    assert got == [str(i) for i in range(1000)]


async def test_errors_come_back_as_remote_error(pair: tuple[Endpoint, Endpoint]) -> None:
    server, client = pair

    async def broken(env: Envelope) -> None:
        raise ValueError("no such tool")

    async def quiet(env: Envelope) -> None:
        return None

    server.on(ToolCall, broken)
    server.on(Chat, quiet)
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(client.request("arena", ToolCall(call_id="1", name="x")), 5)
    assert info.value.code == "handler_failed"
    assert not info.value.retryable
    assert "no such tool" in str(info.value)
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(client.request("arena", Observation(agent="a", text="")), 5)
    assert info.value.code == "no_handler"
    assert await asyncio.wait_for(client.request("arena", Chat(sender="a", text="")), 5) == Ok()


async def test_request_timeout(pair: tuple[Endpoint, Endpoint]) -> None:
    server, client = pair

    async def never(env: Envelope) -> None:
        await asyncio.sleep(60)

    server.on(Observation, never)
    with pytest.raises(RequestTimeout):
        await asyncio.wait_for(
            client.request("arena", Observation(agent="a", text=""), timeout=0.2), 5
        )


async def test_unknown_peer_is_a_clear_error(pair: tuple[Endpoint, Endpoint]) -> None:
    _, client = pair
    with pytest.raises(BusError, match="no peer named 'bob'"):
        await client.request("bob", Chat(sender="a", text=""))


async def test_asyncio_context_can_be_shared() -> None:
    """inproc needs one context; a zmq.asyncio.Context works as well as a plain one."""
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    try:
        async with Endpoint("a", context=ctx) as a, Endpoint("b", context=ctx) as b:
            a.on(Observation, _act)
            address = await a.bind(_address("inproc"))
            assert await b.connect(address, timeout=5) == "a"
            reply = await b.request("a", Observation(agent="b", text="x"), timeout=5)
            assert reply == Action(agent="b", text="X")
    finally:
        ctx.term()


async def test_overload_and_bad_handler_results_are_errors(pair: tuple[Endpoint, Endpoint]) -> None:
    server, client = pair
    server.config = BusConfig(
        heartbeat_interval=0.1, peer_timeout=0.5, request_timeout=5.0, max_handlers=2
    )
    release = asyncio.Event()

    async def slow(env: Envelope) -> None:
        await release.wait()

    async def wrong(env: Envelope) -> str:
        return "not a message"

    server.on(Observation, slow)
    server.on(ToolCall, wrong)  # type: ignore[arg-type]
    busy = [
        asyncio.create_task(client.request("arena", Observation(agent="a", text="")))
        for _ in range(2)
    ]
    await asyncio.sleep(0.1)
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(client.request("arena", Observation(agent="a", text="")), 5)
    assert info.value.code == "overloaded"
    assert info.value.retryable  # the peer's word travels with the error
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*busy), 5) == [Ok(), Ok()]
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(client.request("arena", ToolCall(call_id="1", name="x")), 5)
    assert info.value.code == "handler_failed"


async def test_handlers_that_need_a_task_from_the_start(pair: tuple[Endpoint, Endpoint]) -> None:
    """Inline handlers have no current task before their first await: the failure says
    what to do, and ``task=True`` gives the handler a task from its first line."""
    server, client = pair

    async def guarded(env: Envelope) -> Action:
        async with asyncio.timeout(5), asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(0))
        return Action(agent="a", text="done")

    server.on(Observation, guarded)
    with pytest.raises(RemoteError, match="task=True"):
        await asyncio.wait_for(client.request("arena", Observation(agent="a", text="")), 5)
    server.on(Observation, guarded, task=True)
    reply = await asyncio.wait_for(client.request("arena", Observation(agent="a", text="")), 5)
    assert reply == Action(agent="a", text="done")
