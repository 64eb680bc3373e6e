"""Only real deaths are deaths: a stalled process does not kill its peers (issue 11 §3)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import zmq.asyncio

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import PeerDead
from parley.protocols.messages import Action, Envelope, Observation

pytestmark = pytest.mark.timeout(60)

FAST = BusConfig(heartbeat_interval=0.1, peer_timeout=0.5, request_timeout=10.0)


async def _act(env: Envelope) -> Action:
    assert isinstance(env.body, Observation)
    return Action(agent=env.body.agent, text="ok")


@pytest.mark.parametrize("transport", ["inproc", "ipc"])
async def test_a_stalled_process_keeps_its_peers(transport: str, tmp_path: Path) -> None:
    """A synchronous stretch 6x the peer timeout, with both ends in this process, kills no
    one: the stall is credited to every link, and inproc peers never die of silence."""
    context = zmq.asyncio.Context()
    server = Endpoint("arena", config=FAST, context=context)
    client = Endpoint("agent", config=FAST, context=context)
    try:
        if transport == "inproc":
            address = await server.bind(f"inproc://stall-{os.urandom(4).hex()}")
        else:
            address = await server.bind(f"ipc://{tmp_path}/stall")
        client.on(Observation, _act)
        await client.connect(address)
        await server.wait_for_peer("agent", timeout=5)
        await asyncio.sleep(2 * FAST.heartbeat_interval)  # both sides idle, heartbeats only
        time.sleep(6 * FAST.peer_timeout)  # the whole process stalls  # noqa: ASYNC251
        await asyncio.sleep(4 * FAST.peer_timeout)  # several ticks after the stall
        assert server.peers == ["agent"]
        assert client.peers == ["arena"]
        reply = await server.request("agent", Observation(agent="agent", text="x"))
        assert isinstance(reply, Action)
        assert reply.text == "ok"
        assert server.stats.dead_peers == 0
        assert client.stats.dead_peers == 0
    finally:
        await client.close()
        await server.close()
        context.term()


async def test_a_silent_peer_still_dies_while_the_loop_runs_on_time(tmp_path: Path) -> None:
    """The credit covers only time the local loop was late: a peer that stops talking while
    this loop runs normally is declared dead within its timeout, and its request fails."""
    context = zmq.asyncio.Context()
    server = Endpoint("arena", config=FAST, context=context)
    client = Endpoint("agent", config=FAST, context=context)
    try:
        address = await server.bind(f"ipc://{tmp_path}/silent")
        await client.connect(address)
        await server.wait_for_peer("agent", timeout=5)

        async def hang(env: Envelope) -> Action:
            await asyncio.sleep(60)
            raise AssertionError("unreachable")

        client.on(Observation, hang)
        assert client._ticker is not None
        client._ticker.cancel()  # the peer goes silent (no heartbeats), its loop runs on
        start = asyncio.get_running_loop().time()
        with pytest.raises(PeerDead):
            await server.request("agent", Observation(agent="agent", text="x"), timeout=30)
        assert asyncio.get_running_loop().time() - start < FAST.peer_timeout + 1.5
    finally:
        await client.close()
        await server.close()
        context.term()
