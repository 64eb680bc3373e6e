"""PROTOCOL.md is enough: its plain pyzmq + msgpack peer talks to a parley endpoint.

The peer is the code block of section 12 of ``protocols/PROTOCOL.md``, run as written.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import RemoteError
from parley.protocols.messages import (
    BODY_TYPES,
    Action,
    Completion,
    Constraint,
    Envelope,
    Observation,
    SamplingParams,
    TokenRecord,
    ToolCall,
    ToolResult,
    TurnRecord,
)

PROTOCOL = Path(__file__).parents[2] / "protocols" / "PROTOCOL.md"


def _example() -> dict[str, Any]:
    """Execute the example peer of PROTOCOL.md and return its namespace."""
    text = PROTOCOL.read_text()
    section = text[text.index("## 12.") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "PROTOCOL.md section 12 lost its python example"
    namespace: dict[str, Any] = {"__name__": "protocol_example"}
    exec(compile(code.group(1), str(PROTOCOL), "exec"), namespace)
    return namespace


async def test_plain_msgpack_peer_requests_and_answers(tmp_path: Path) -> None:
    mini_peer = _example()["MiniPeer"]
    config = BusConfig(heartbeat_interval=0.1, peer_timeout=0.6, request_timeout=5)
    stop = threading.Event()
    seen: dict[str, Any] = {}

    async def clock(env: Envelope) -> ToolResult:
        assert isinstance(env.body, ToolCall)
        return ToolResult(call_id=env.body.call_id, name=env.body.name, content="noon")

    def run_peer(address: str) -> None:
        peer = mini_peer(address, "mini", heartbeat=0.1)
        seen["peer"] = peer.peer
        seen["tool"] = peer.request({"kind": "tool_call", "call_id": "1", "name": "clock"})
        while not stop.is_set():
            peer.serve_once(0.02)
        peer.close()

    async with Endpoint("arena", config=config) as arena:
        arena.on(ToolCall, clock)
        address = await arena.bind(f"ipc://{tmp_path}/interop")
        thread = asyncio.create_task(asyncio.to_thread(run_peer, address))
        try:
            await arena.wait_for_peer("mini", 10)
            reply = await asyncio.wait_for(
                arena.request("mini", Observation(agent="mini", text="offer?"), episode="e1"), 5
            )
            assert reply == Action(agent="mini", text="I accept")
            with pytest.raises(RemoteError) as info:
                await asyncio.wait_for(arena.request("mini", ToolCall(call_id="2", name="x")), 5)
            assert info.value.code == "no_handler"
            await asyncio.sleep(3 * config.peer_timeout)  # its heartbeats keep it alive
            assert arena.peers == ["mini"]
            assert seen["peer"] == "arena"
            assert seen["tool"] == {
                "kind": "tool_result",
                "call_id": "1",
                "name": "clock",
                "content": "noon",
            }
        finally:
            stop.set()
            await asyncio.wait_for(thread, 10)
        await asyncio.wait_for(_gone(arena, "mini"), 5)  # its Bye was understood


async def _gone(ep: Endpoint, name: str) -> None:
    while name in ep.peers:  # noqa: ASYNC110 -- polls state set by the bus
        await asyncio.sleep(0.01)


def test_protocol_md_documents_every_kind_and_field() -> None:
    text = PROTOCOL.read_text()
    nested = (TokenRecord, SamplingParams, Constraint, Completion, TurnRecord)
    for cls in (Envelope, *BODY_TYPES, *nested):
        tag = cls.__struct_config__.tag
        if tag is not None:
            assert f"**`{tag}`**" in text, f"PROTOCOL.md lacks the kind {tag!r}"
        for field in msgspec.structs.fields(cls):
            assert f"`{field.name}`" in text, f"PROTOCOL.md lacks {cls.__name__}.{field.name}"
