"""The runner's task-free pipelining helper: gather semantics without a task per call."""

from __future__ import annotations

import asyncio

import pytest

from parley.arena.run.gather import send_all_then_gather
from parley.protocols.errors import RequestTimeout
from parley.protocols.messages import Action


async def _reply(fut: asyncio.Future[Action], log: list[str], name: str) -> Action:
    log.append(f"sent {name}")
    try:
        return await fut
    finally:
        log.append(f"done {name}")


@pytest.mark.timeout(10)
async def test_all_calls_start_before_any_is_awaited_and_results_keep_order() -> None:
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(3)]
    log: list[str] = []
    gathered = asyncio.ensure_future(
        send_all_then_gather([_reply(f, log, str(i)) for i, f in enumerate(futs)])
    )
    await asyncio.sleep(0)
    assert log == ["sent 0", "sent 1", "sent 2"]
    futs[2].set_result(Action(agent="c", text="2"))  # out of order, some together
    futs[1].set_exception(RequestTimeout("slow"))
    await asyncio.sleep(0)
    futs[0].set_result(Action(agent="a", text="0"))
    results = await gathered
    assert isinstance(results[0], Action)
    assert results[0].text == "0"
    assert isinstance(results[1], RequestTimeout)
    assert isinstance(results[2], Action)
    assert results[2].text == "2"


@pytest.mark.timeout(10)
async def test_a_call_failing_before_it_suspends_is_a_result() -> None:
    async def boom() -> Action:
        raise RequestTimeout("no peer")

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Action] = loop.create_future()
    fut.set_result(Action(agent="a", text="x"))
    results = await send_all_then_gather([boom(), _reply(fut, [], "a")])
    assert isinstance(results[0], RequestTimeout)
    assert isinstance(results[1], Action)


@pytest.mark.timeout(10)
async def test_cancelling_the_gather_ends_every_pending_call() -> None:
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(3)]
    log: list[str] = []
    gathered = asyncio.ensure_future(
        send_all_then_gather([_reply(f, log, str(i)) for i, f in enumerate(futs)])
    )
    await asyncio.sleep(0)
    gathered.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gathered
    assert sorted(line for line in log if line.startswith("done")) == ["done 0", "done 1", "done 2"]
