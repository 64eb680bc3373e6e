"""A bus peer run in a spawned process by the multi-process tests.

It answers ``Observation`` requests with the upper-cased text (``"hang"`` never answers,
``"slow"`` 0.1 s later), requests its peer once after connecting, echoes broadcasts back as
``Chat``, and reports what happened on a pipe until told to stop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import BusError
from parley.protocols.messages import Action, Chat, Envelope, Observation

PROCESS_CONFIG: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "peer_timeout": 1.5,
    "request_timeout": 10.0,
}


def run_peer(role: str, address: str, name: str, conn: Any, config: dict[str, Any]) -> None:
    """Process entry point: ``role`` is ``"bind"`` or ``"connect"``."""
    asyncio.run(_peer(role, address, name, conn, config))


async def _peer(role: str, address: str, name: str, conn: Any, config: dict[str, Any]) -> None:
    async with Endpoint(name, config=BusConfig(**config)) as ep:
        hang = asyncio.Event()

        async def on_observation(env: Envelope) -> Action:
            assert isinstance(env.body, Observation)
            if env.body.text == "hang":
                await hang.wait()
            if env.body.text == "slow":  # (answered 0.1 s later)
                await asyncio.sleep(0.1)
            return Action(agent=name, text=env.body.text.upper())

        async def on_broadcast(env: Envelope) -> None:
            assert isinstance(env.body, Chat)
            await ep.send(env.sender, Chat(sender=name, text=f"{env.channel} {env.body.text}"))

        ep.on(Observation, on_observation)
        ep.subscribe("episode/", on_broadcast)
        if role == "bind":
            conn.send(("bound", await ep.bind(address)))
        else:
            try:
                peer = await ep.connect(address, timeout=3.0)
            except BusError as exc:
                conn.send(("failed", type(exc).__name__, str(exc), ep.stats.received))
                return
            reply = await ep.request(peer, Observation(agent=name, text=f"hi from {name}"))
            assert isinstance(reply, Action)
            conn.send(("connected", peer, reply.text))
        await asyncio.to_thread(conn.recv)  # "stop"
