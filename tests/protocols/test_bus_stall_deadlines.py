"""Deadlines when the requesting endpoint's loop lags or stalls (the put-off of a late
deadline timer, requests.py ``_expire_due``), attacked: every request still ends in bounded
time whatever the lateness pattern, the heap stays consistent (answered entries swept, the
timer armed for the earliest live deadline, none left after close), and a request sent
after a stall keeps its own limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from parley.protocols.bus import Endpoint
from parley.protocols.errors import RequestTimeout
from parley.protocols.messages import Action, Observation
from tests.protocols.test_bus_deadlines import _answer_unless_silent, pair

__all__ = ["pair"]  # (the fixture, shared)


def _stand_still(seconds: float) -> None:
    """Block the event loop (as a stopped process or a blocking callback would)."""
    time.sleep(seconds)


@contextmanager
def lagging(seconds: float) -> Iterator[list[int]]:
    """Block the running event loop ``seconds`` in every one of its rounds (a callback that
    sleeps and schedules itself again), so that every timer fires up to that late."""
    loop = asyncio.get_running_loop()
    rounds = [0]
    handle: list[asyncio.Handle] = []

    def lag() -> None:
        time.sleep(seconds)
        rounds[0] += 1
        handle[:] = [loop.call_soon(lag)]

    handle.append(loop.call_soon(lag))
    try:
        yield rounds
    finally:
        handle[0].cancel()


def _consistent(client: Endpoint, *, swept: bool = False) -> None:
    """The timer armed no later than the earliest live deadline (none when the heap is
    empty), no answered entry left when ``swept`` (after a late firing), every allowance
    within its limit."""
    requests = client._requests
    heap = requests.deadlines
    live = [entry for entry in heap if entry[1] in entry[2].pending]
    if swept:
        assert len(live) == len(heap)
    if live:
        assert requests.timer is not None
        assert requests._timer_at <= min(entry[0] for entry in live)
    if not heap:
        assert requests.timer is None
    for _when, _rid, _link, limit, spare, _armed in heap:
        assert 0.0 <= spare <= limit


@pytest.mark.timeout(20)
@pytest.mark.parametrize("lag", [0.03, 0.06, 0.2])
async def test_a_loop_lagging_at_every_round_still_ends_a_silent_request(
    pair: tuple[Endpoint, Endpoint], lag: float
) -> None:
    """Every timer of the loop fires ``lag`` late: a request nobody answers still times out,
    within twice its limit plus a few rounds' lag (a loop lagging 60 ms at every timer had
    a 0.3 s request end at 1.08 s when only the put-off was charged)."""
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    loop = asyncio.get_running_loop()
    limit = 0.3
    with lagging(lag) as rounds:
        sent, first = loop.time(), rounds[0]
        with pytest.raises(RequestTimeout, match=r"within 0\.3 s"):
            await client.request("arena", Observation(agent="a", text="silent"), timeout=limit)
        took, stood = loop.time() - sent, (rounds[0] - first) * lag
    assert limit - 0.01 <= took
    bound = 2 * limit + 4 * lag + 0.2  # (a loaded host makes a 30 ms lag a late one too)
    assert took < bound, (took, stood, rounds[0] - first)
    assert client._requests.deadlines == []
    assert client._requests.timer is None


@pytest.mark.timeout(20)
async def test_thousands_of_pending_requests_all_end_under_repeated_stalls(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    """4,096 awaiting requests (every other one answered at once), the loop stalled 0.3 s
    again and again: each silent one times out within twice its limit plus the stalls it
    lived through, the answered ones are answered, and no entry or timer is left."""
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    loop = asyncio.get_running_loop()
    limit = 0.5
    ended: dict[int, float] = {}

    async def ask(i: int) -> str:
        text = "silent" if i % 2 else "x"
        try:
            await client.request("arena", Observation(agent="a", text=text), timeout=limit)
        except RequestTimeout:
            ended[i] = loop.time()
            return "timeout"
        ended[i] = loop.time()
        return "answered"

    sent = loop.time()
    tasks = [asyncio.ensure_future(ask(i)) for i in range(4096)]
    stalls = 0
    while not all(task.done() for task in tasks):
        assert loop.time() - sent < 10
        await asyncio.sleep(0.25)
        _consistent(client)
        _stand_still(0.3)  # the loop stands still (a stopped process, a blocking callback)
        stalls += 1
    outcomes = [task.result() for task in tasks]
    assert outcomes == ["timeout" if i % 2 else "answered" for i in range(4096)]
    # Sent over ~the first round: at most twice the limit plus the stalls lived through.
    assert max(ended.values()) - sent < 2 * limit + 0.3 * stalls + 1.0
    assert client._requests.deadlines == []
    assert client._requests.timer is None
    assert client._requests.pending == 0


@pytest.mark.timeout(20)
async def test_a_late_firing_sweeps_answered_entries_and_rearms_for_the_earliest(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    silent = [
        asyncio.ensure_future(
            client.request("arena", Observation(agent="a", text="silent"), timeout=limit)
        )
        for limit in (0.2, 0.6, 5.0)
    ]
    for limit in (0.1, 1.0, 3.0):  # answered: their entries stay behind until swept
        await client.request("arena", Observation(agent="a", text="x"), timeout=limit)
    assert len(client._requests.deadlines) == 6
    _stand_still(0.4)  # the 0.2 s timer fires 0.2 s late: everything sent before is put off
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    _consistent(client, swept=True)
    assert len(client._requests.deadlines) == 3  # (the answered ones swept)
    assert not any(task.done() for task in silent)  # (the 0.2 s one gets the stall back)
    with pytest.raises(RequestTimeout, match=r"within 0\.2 s"):
        await silent[0]
    _consistent(client)
    with pytest.raises(RequestTimeout, match=r"within 0\.6 s"):
        await silent[1]
    _consistent(client)
    assert len(client._requests.deadlines) == 1
    await client.close()
    assert client._requests.timer is None
    assert client._requests.deadlines == []
    await asyncio.gather(*silent, return_exceptions=True)


@pytest.mark.timeout(20)
async def test_a_request_sent_right_after_a_stall_keeps_its_own_limit(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    """The loop stalls past an old request's deadline; a request sent in the same round as
    the late timer (after the stall) is not put off: it ends at its own limit."""
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    loop = asyncio.get_running_loop()
    old = asyncio.ensure_future(
        client.request("arena", Observation(agent="a", text="silent"), timeout=0.1)
    )
    await asyncio.sleep(0)
    fresh: list[asyncio.Future[object]] = []

    def send_fresh() -> None:  # runs after the stall, before the late timer in that round
        fresh.append(
            asyncio.ensure_future(
                client.request("arena", Observation(agent="a", text="silent"), timeout=0.3)
            )
        )

    _stand_still(0.5)
    loop.call_soon(send_fresh)
    await asyncio.sleep(0)
    started = loop.time()
    with pytest.raises(RequestTimeout, match=r"within 0\.3 s"):
        await fresh[0]
    assert loop.time() - started < 0.3 + 0.2
    with pytest.raises(RequestTimeout):
        await old


@pytest.mark.timeout(20)
async def test_a_request_sent_before_a_stall_that_delays_a_due_timer_is_put_off(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    """The deadline timer is due (for an answered request's entry) when a callback ahead of
    it in the same round sends a request, and the loop then stands still past that
    request's limit before the timer runs. The request lived through the stall, so the
    late timer puts it off and its answer is read, instead of expiring it at once.
    Seen in a real run: a remote agent stopped the arena on every request; the arena sent
    its next request and was stopped again before its overdue timer ran, and that request,
    sent after the timer was due, timed out though its reply had come at once."""
    server, client = pair
    server.on(Observation, _answer_unless_silent)
    loop = asyncio.get_running_loop()
    quick = Observation(agent="a", text="quick")
    asked: list[asyncio.Task[Any]] = []
    sent = asyncio.Event()

    def send_then_stall() -> None:
        _stand_still(0.4)  # the timer falls due, not yet run
        # The send is the task's first step, next round, ahead of the due timer; the loop
        # stands still after it, past its 0.3 s limit, before the timer runs.
        asked.append(loop.create_task(client.request("arena", quick, timeout=0.3)))
        loop.call_soon(_stand_still, 1.0)
        sent.set()

    for _ in range(3):
        # Answered: its entry stays in the heap, the timer armed for it.
        assert await client.request("arena", quick, timeout=0.3) == Action(agent="a", text="ok")
        sent.clear()
        loop.call_soon(send_then_stall)
        await sent.wait()
        assert await asked[-1] == Action(agent="a", text="ok")
        _consistent(client)
