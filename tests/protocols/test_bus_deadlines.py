"""Request timeouts share one event-loop timer (issue 11 §5) and keep their contract.

Each request still times out at its own limit, in deadline order whatever order the
requests were sent in; answered requests never expire; the deadlines of answered requests
do not pile up; closing the endpoint leaves no timer behind.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
import zmq

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import BusError, RequestTimeout
from parley.protocols.messages import Action, Envelope, Observation

# (max_handlers: test_bus_stall_deadlines keeps 2,048 silent requests waiting at once)
FAST = BusConfig(heartbeat_interval=0.1, peer_timeout=5.0, request_timeout=30.0, max_handlers=5000)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Endpoint, Endpoint]]:
    ctx = zmq.Context()
    server = Endpoint("arena", config=FAST, context=ctx)
    client = Endpoint("alice", config=FAST, context=ctx)
    try:
        address = await server.bind(f"inproc://deadlines-{os.urandom(4).hex()}")
        await asyncio.wait_for(client.connect(address), 5)
        await asyncio.wait_for(server.wait_for_peer("alice", 5), 6)
        yield server, client
    finally:
        await client.close()
        await server.close()
        ctx.term()


async def _answer_unless_silent(env: Envelope) -> Action:
    """Answers at once, except an observation whose text is ``silent`` (never answered)."""
    assert isinstance(env.body, Observation)
    if env.body.text == "silent":
        await asyncio.sleep(3600)
    return Action(agent=env.body.agent, text="ok")


@pytest.mark.timeout(20)
async def test_each_request_times_out_at_its_own_limit_in_deadline_order(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    loop = asyncio.get_running_loop()
    started = loop.time()
    limits = [0.6, 0.2, 0.4, 30.0]  # a longer limit first: a later, shorter one re-arms
    finished: dict[float, float] = {}

    async def ask(limit: float) -> None:
        with pytest.raises(RequestTimeout, match=rf"within {limit:g} s"):
            await client.request("arena", Observation(agent="a", text="silent"), timeout=limit)
        finished[limit] = loop.time() - started

    tasks = [asyncio.ensure_future(ask(limit)) for limit in limits]
    # Answered requests in between never expire, whatever their limit.
    for limit in (0.05, 0.3, 10.0):
        reply = await client.request("arena", Observation(agent="a", text="x"), timeout=limit)
        assert isinstance(reply, Action)
    await asyncio.wait(tasks[:3], timeout=5)
    assert sorted(finished) == [0.2, 0.4, 0.6]
    assert sorted(finished, key=finished.__getitem__) == [0.2, 0.4, 0.6]
    for limit, took in finished.items():
        assert limit - 0.01 <= took < limit + 1.0, (limit, took)
    assert not tasks[3].done()  # 30 s to go
    tasks[3].cancel()
    await asyncio.gather(tasks[3], return_exceptions=True)
    await asyncio.sleep(0.7)  # nothing else fires: the answered 0.05 and 0.3 s ones are gone
    assert sorted(finished) == [0.2, 0.4, 0.6]


@pytest.mark.timeout(30)
async def test_the_deadlines_of_answered_requests_do_not_pile_up(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    for _ in range(3000):  # answered long before their 30 s limit
        await client.request("arena", Observation(agent="a", text="x"))
    assert len(client._requests.deadlines) <= 2 * client._requests.pending + 256 + 1


@pytest.mark.timeout(20)
async def test_closing_fails_pending_requests_and_drops_the_timer(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    task = asyncio.ensure_future(
        client.request("arena", Observation(agent="a", text="silent"), timeout=10)
    )
    await asyncio.sleep(0.1)
    await client.close()
    with pytest.raises(BusError, match="closed"):
        await task
    assert client._requests.timer is None
    assert client._requests.deadlines == []
