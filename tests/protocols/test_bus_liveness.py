"""Only real deaths are deaths: a stalled process does not kill its peers (issue 11 §3), a
paused or busy peer process is not dead while its connection is open, and a killed one is
noticed by its closed connection well before the generous silence timeout (issue 28 §2)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
from pathlib import Path

import pytest
import zmq.asyncio

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import PeerDead
from parley.protocols.messages import Action, Envelope, Observation
from tests.protocols.test_bus_multiprocess import _address, _upper, arena, peers

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


PAUSE_S = 7.0  # longer than the 5 s of silence that used to kill a peer


async def test_paused_peer_processes_are_not_dead() -> None:
    """With the default config, a bound and a connecting peer process paused (SIGSTOP) for
    7 s stay peers: their connections stay open, and requests sent meanwhile are answered
    after SIGCONT. (Before: both declared dead after 5 s of silence, their requests failed.)"""
    default: dict[str, float] = {}
    async with arena("ipc", BusConfig()) as (ep, address):
        ep.on(Observation, _upper)
        specs = [("bind", _address("ipc"), "pool", default), ("connect", address, "agent", default)]
        with peers(*specs) as (pool, agent):
            kind, pool_address = await pool.report()
            assert kind == "bound"
            assert (await agent.report())[0] == "connected"
            assert await ep.connect(pool_address, timeout=10) == "pool"
            for peer in (pool, agent):
                assert peer.process.pid is not None
                os.kill(peer.process.pid, signal.SIGSTOP)
            try:
                pending = [
                    asyncio.create_task(ep.request(name, Observation(agent=name, text="late")))
                    for name in ("pool", "agent")
                ]
                await asyncio.sleep(PAUSE_S)
            finally:
                for peer in (pool, agent):
                    os.kill(peer.process.pid, signal.SIGCONT)  # type: ignore[arg-type]
            replies = await asyncio.wait_for(asyncio.gather(*pending), 20)
            assert [r.text for r in replies if isinstance(r, Action)] == ["LATE", "LATE"]
            assert sorted(ep.peers) == ["agent", "pool"]
            assert ep.stats.dead_peers == 0


async def test_a_killed_peer_process_is_noticed_by_its_closed_connection() -> None:
    """The generous silence timeout (60 s by default) does not slow down noticing a real
    death: SIGKILLed peers, bound and connecting, fail their pending requests within a few
    heartbeat intervals, because their connections closed."""
    default: dict[str, float] = {}
    async with arena("ipc", BusConfig()) as (ep, address):
        ep.on(Observation, _upper)
        specs = [("bind", _address("ipc"), "pool", default), ("connect", address, "agent", default)]
        with peers(*specs) as (pool, agent):
            _, pool_address = await pool.report()
            assert (await agent.report())[0] == "connected"
            assert await ep.connect(pool_address, timeout=10) == "pool"
            pending = [
                asyncio.create_task(ep.request(name, Observation(agent=name, text="hang")))
                for name in ("pool", "agent")
            ]
            await asyncio.sleep(0.2)
            loop = asyncio.get_running_loop()
            start = loop.time()
            pool.kill()
            agent.kill()
            for task in pending:
                with pytest.raises(PeerDead):
                    await asyncio.wait_for(task, 30)
            # 2.5 heartbeat intervals of silence, then one tick: far below peer_timeout.
            assert loop.time() - start < 15 < BusConfig().peer_timeout
            assert ep.peers == []


async def test_requests_waiting_for_room_when_their_peer_dies_leave_no_noise() -> None:
    """Requests queued behind a full send queue to a paused peer all fail with PeerDead when
    it is killed, and asyncio reports no "Future exception was never retrieved" (before:
    the death failed each waiting request's future a second time, unseen)."""
    loop = asyncio.get_running_loop()
    unseen: list[str] = []
    loop.set_exception_handler(lambda _, context: unseen.append(str(context.get("message"))))
    config = BusConfig(hwm=2, heartbeat_interval=0.2, peer_timeout=30.0, request_timeout=60.0)
    try:
        async with arena("ipc", config) as (ep, address):
            ep.on(Observation, _upper)
            with peers(("connect", address, "victim", {})) as (victim,):
                assert (await victim.report())[0] == "connected"
                assert victim.process.pid is not None
                os.kill(victim.process.pid, signal.SIGSTOP)
                big = "x" * 1_000_000  # 32 MB in all: far more than the socket buffers
                pending = [
                    asyncio.create_task(ep.request("victim", Observation(agent="v", text=big)))
                    for _ in range(32)
                ]
                await asyncio.sleep(0.5)
                victim.kill()
                results = await asyncio.wait_for(
                    asyncio.gather(*pending, return_exceptions=True), 30
                )
                assert all(isinstance(r, PeerDead) for r in results), results
                del pending, results
                gc.collect()
                await asyncio.sleep(0)
        assert not [m for m in unseen if "never retrieved" in m], unseen
    finally:
        loop.set_exception_handler(None)
