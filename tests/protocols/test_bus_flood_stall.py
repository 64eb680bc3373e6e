"""A remote peer that floods the requesting endpoint (so that its loop lags and its deadline
timer fires late) gains no more than the put-off's bound for its own silence (twice its
limit, plus the lag), and costs an honest peer nothing: its reply, sent in time, wins."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from typing import Any

import pytest

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import RequestTimeout
from parley.protocols.messages import Action, Chat, Envelope, Observation
from tests.protocols._peer import PROCESS_CONFIG
from tests.protocols.test_bus_multiprocess import START_TIMEOUT, _upper, arena, peers

SPAWN = mp.get_context("spawn")


def run_flooder(address: str, conn: Any) -> None:
    """Process entry point: a peer that, asked anything, never answers and floods the
    asker with one-way chats of 4 KB until told to stop."""
    asyncio.run(_flooder(address, conn))


async def _flooder(address: str, conn: Any) -> None:
    async with Endpoint("mallory", config=BusConfig(**PROCESS_CONFIG)) as ep:
        flooding: list[asyncio.Task[None]] = []

        async def flood() -> None:
            junk = Chat(sender="mallory", text="x" * 4096)
            while True:
                for _ in range(64):
                    await ep.send("arena", junk)
                await asyncio.sleep(0)

        async def on_observation(env: Envelope) -> Action:
            if not flooding:
                flooding.append(asyncio.ensure_future(flood()))
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

        ep.on(Observation, on_observation)
        await ep.connect(address, timeout=3.0)
        conn.send(("connected",))
        await asyncio.to_thread(conn.recv)  # "stop"
        for task in flooding:
            task.cancel()


@pytest.mark.timeout(90)
async def test_a_flooding_peer_gains_no_more_than_twice_its_limit() -> None:
    async with arena("ipc") as (ep, address):
        chats = [0]

        async def on_chat(env: Envelope) -> None:
            chats[0] += 1

        ep.on(Chat, on_chat)
        ep.on(Observation, _upper)
        loop = asyncio.get_running_loop()
        conn, child = SPAWN.Pipe()
        mallory = SPAWN.Process(target=run_flooder, args=(address, child), daemon=True)
        mallory.start()
        try:
            with peers(("connect", address, "alice", PROCESS_CONFIG)) as (alice,):
                await alice.report()
                assert await asyncio.to_thread(conn.poll, START_TIMEOUT)
                assert conn.recv() == ("connected",)
                gaps: list[float] = []

                async def tick() -> None:  # how late the arena's loop runs a 10 ms timer
                    while True:
                        at = loop.time()
                        await asyncio.sleep(0.01)
                        gaps.append(loop.time() - at - 0.01)

                ticker = asyncio.ensure_future(tick())
                limit = 0.5
                sent = loop.time()
                silent = asyncio.ensure_future(
                    ep.request("mallory", Observation(agent="m", text="go"), timeout=limit)
                )
                await asyncio.sleep(0.3)  # the flood is on
                for _ in range(3):  # an honest peer answering 0.1 s later is not charged
                    reply = await ep.request(
                        "alice", Observation(agent="a", text="slow"), timeout=limit
                    )
                    assert reply == Action(agent="alice", text="SLOW")
                with pytest.raises(RequestTimeout):
                    await silent
                took = loop.time() - sent
                ticker.cancel()
                lag = max(gaps)
                assert chats[0] > 0
                print(f"flood: took {took:.3f} s, max lag {lag * 1000:.0f} ms, {chats[0]} chats")
                assert took < 2 * limit + 3 * lag + 0.3, (took, lag, chats[0])
        finally:
            if mallory.is_alive():
                conn.send("stop")
                mallory.join(5)
            if mallory.is_alive():
                mallory.kill()
                mallory.join(5)
