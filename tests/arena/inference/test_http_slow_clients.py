"""Slow and idle connections against parley's HTTP servers (``http_guard.GuardedSite``).

Before the guard, aiohttp held a connection that never finished its headers for ever: 300
of them were all open 20 s later, and a few thousand exhaust the process's descriptors.
Everything here is a real socket against a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from parley.arena.inference.http_guard import ConnectionLimits, GuardedSite
from parley.arena.view.server import start
from tests.busy import stop

pytestmark = pytest.mark.timeout(60)

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _open(port: int, sent: bytes = b"") -> Conn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if sent:
        writer.write(sent)
        await writer.drain()
    return reader, writer


async def _closed_by_server(conn: Conn, within: float) -> bool:
    """Whether the server ends ``conn`` (EOF or reset) within ``within`` seconds."""
    reader, _ = conn
    try:
        while True:
            if not await asyncio.wait_for(reader.read(1024), within):
                return True
    except TimeoutError:  # (an OSError: caught first)
        return False
    except OSError:  # reset
        return True


def _request(path: str = "/") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


async def _get_on(conn: Conn, path: str = "/") -> bytes:
    """The status line of a GET sent on ``conn`` (kept open: HTTP/1.1 keep-alive)."""
    reader, writer = conn
    writer.write(_request(path))
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 10)
    headers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":", 1)[1])
        for line in headers.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await asyncio.wait_for(reader.readexactly(length), 10)
    return status


async def _viewer(tmp_path: Path, limits: ConnectionLimits) -> tuple[aiohttp.web.AppRunner, int]:
    runner, url = await start([tmp_path], limits=limits)
    return runner, int(url.rstrip("/").rsplit(":", 1)[1])


@pytest.fixture
async def viewer(tmp_path: Path) -> AsyncIterator[tuple[aiohttp.web.AppRunner, int]]:
    runner, port = await _viewer(tmp_path, ConnectionLimits(max_connections=8, header_timeout=0.5))
    try:
        yield runner, port
    finally:
        await runner.cleanup()


def _held(runner: aiohttp.web.AppRunner) -> int:
    assert runner.server is not None
    return len(runner.server.connections)


async def test_connections_that_never_finish_their_headers_are_closed(
    viewer: tuple[aiohttp.web.AppRunner, int],
) -> None:
    runner, port = viewer
    silent = await _open(port)
    partial = await _open(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    trickle = await _open(port, b"G")
    for _ in range(4):  # a byte every 0.2 s: still no headers after the timeout
        await asyncio.sleep(0.2)
        trickle[1].write(b"E")
    assert await _closed_by_server(silent, 3)
    assert await _closed_by_server(partial, 3)
    assert await _closed_by_server(trickle, 3)
    assert _held(runner) == 0
    # The server is unharmed: a request sent at once is answered.
    assert (await _get_on(await _open(port))).startswith(b"HTTP/1.1 200")


async def test_a_request_whose_headers_arrive_in_pieces_in_time_is_served(
    viewer: tuple[aiohttp.web.AppRunner, int],
) -> None:
    _, port = viewer
    reader, writer = await _open(port, b"GET / HT")
    await asyncio.sleep(0.1)
    writer.write(b"TP/1.1\r\nHost: 127.0.0.1\r")  # the blank line split across writes
    await asyncio.sleep(0.1)
    writer.write(b"\n\r")
    await asyncio.sleep(0.1)
    writer.write(b"\n")
    status = await asyncio.wait_for(reader.readline(), 10)
    assert status.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_flood_of_idle_connections_evicts_itself_not_a_real_client(
    viewer: tuple[aiohttp.web.AppRunner, int],
) -> None:
    runner, port = viewer  # max_connections=8
    flood = [await _open(port) for _ in range(50)]
    await asyncio.sleep(0.05)
    assert _held(runner) <= 8
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as r:
        assert r.status == 200
    assert _held(runner) <= 8
    closed = [await _closed_by_server(conn, 0.01) for conn in flood[:40]]
    assert all(closed)  # the oldest went first


def _post_head(length: int, path: str = "/", query: str = "") -> bytes:
    """A POST's headers announcing a JSON body of ``length`` bytes (not sent)."""
    return (
        f"POST {path}{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def test_at_the_cap_with_every_connection_in_use_a_new_one_is_refused_until_one_ends(
    tmp_path: Path,
) -> None:
    """Connections inside a request (headers in, body on its way) are never evicted."""
    limits = ConnectionLimits(max_connections=8, header_timeout=0.5, body_timeout=30)
    runner, port = await _viewer(tmp_path, limits)
    try:
        clients = [await _open(port, _post_head(100) + b"{") for _ in range(8)]
        await asyncio.sleep(0.2)
        assert _held(runner) == 8
        late = await _open(port)
        assert await _closed_by_server(late, 3)
        for conn in clients:  # the 8 are untouched
            assert not await _closed_by_server(conn, 0.01)
        clients[0][1].close()
        await clients[0][1].wait_closed()
        for _ in range(100):  # the server sees the close, and counts it out
            if _held(runner) < 8:
                break
            await asyncio.sleep(0.01)
        assert (await _get_on(await _open(port))).startswith(b"HTTP/1.1 200")
    finally:
        await runner.cleanup()


async def test_idle_keep_alive_connections_make_room_for_a_new_visitor(
    viewer: tuple[aiohttp.web.AppRunner, int],
) -> None:
    """At the cap, connections that sent a request and idle (keep-alive) are evicted, the
    longest idle first (before: every new visitor was refused until they timed out)."""
    runner, port = viewer  # max_connections=8
    idle = [await _open(port) for _ in range(8)]
    for conn in idle:
        assert (await _get_on(conn)).startswith(b"HTTP/1.1 200")
    assert _held(runner) == 8
    for _ in range(3):
        assert (await _get_on(await _open(port))).startswith(b"HTTP/1.1 200")
    assert _held(runner) <= 8
    assert all([await _closed_by_server(conn, 1) for conn in idle[:2]])  # the oldest went


async def test_every_requests_headers_are_timed_not_only_the_first(
    viewer: tuple[aiohttp.web.AppRunner, int],
) -> None:
    """A keep-alive connection's second request trickled, or a leading blank line and then a
    trickle: each is closed after ``header_timeout`` (before: held for ever)."""
    runner, port = viewer  # header_timeout=0.5
    second = await _open(port)
    assert (await _get_on(second)).startswith(b"HTTP/1.1 200")
    second[1].write(b"GET / HTTP/1.1\r\n")
    blank = await _open(port, b"\r\n\r\n")
    for _ in range(5):  # a byte every 0.2 s: still no headers after the timeout
        await asyncio.sleep(0.2)
        for _, writer in (second, blank):
            with contextlib.suppress(OSError):
                writer.write(b"X")
    assert await _closed_by_server(second, 3)
    assert await _closed_by_server(blank, 3)
    # A pipelined request's headers are timed as well.
    pipelined = await _open(port, _request() + b"GET / HTTP/1.1\r\n")
    assert await _closed_by_server(pipelined, 3)
    assert _held(runner) == 0


async def test_a_trickled_body_is_cut(tmp_path: Path) -> None:
    limits = ConnectionLimits(max_connections=8, header_timeout=5, body_timeout=0.5)
    runner, port = await _viewer(tmp_path, limits)
    try:
        reader, writer = await _open(port, _post_head(100) + b"{")
        answer = asyncio.ensure_future(reader.readline())
        for _ in range(15):  # a byte every 0.2 s: 3 s for a body allowed 0.5 s
            await asyncio.sleep(0.2)
            if answer.done():
                break
            writer.write(b" ")
        status = await asyncio.wait_for(answer, 3)
        assert status.startswith(b"HTTP/1.1 408"), status
        assert await _closed_by_server((reader, writer), 3)
        assert (await _get_on(await _open(port))).startswith(b"HTTP/1.1 200")
    finally:
        await runner.cleanup()


async def test_the_default_cap_follows_the_descriptor_limit() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = ConnectionLimits.default()
    assert 64 <= limits.max_connections <= 4096
    if soft != resource.RLIM_INFINITY:
        assert limits.max_connections <= max(64, soft // 4)
    assert limits.header_timeout == 10.0


async def test_the_human_seat_page_closes_a_silent_connection() -> None:
    """The human seat's page runs in the arena's own process: its descriptors are the
    arena's. (The OpenAI front: ``test_http.py``.)"""
    from parley.arena.view.human import HumanHub

    hub = HumanHub(limits=ConnectionLimits(max_connections=8, header_timeout=0.3))
    await hub.ensure_started()
    try:
        assert hub._runner is not None
        assert all(isinstance(site, GuardedSite) for site in hub._runner.sites)
        port = hub.sock.getsockname()[1]
        assert await _closed_by_server(await _open(port, b"GET / HTTP/1.1\r\n"), 3)
    finally:
        await hub.close()
        hub.sock.close()


async def test_the_human_seat_refuses_a_strangers_body_before_reading_it() -> None:
    """A POST without the seat's token is answered 403 at once, its body unread, and the
    connection closed (before: the token was read from the body, so a stranger trickling
    one held the connection as long as it liked, and enough of them kept the person off
    their own seat)."""
    from parley.arena.view.human import HumanHub

    limits = ConnectionLimits(max_connections=8, header_timeout=5, body_timeout=30)
    hub = HumanHub(limits=limits)
    hub.url_for("player_0")
    await hub.ensure_started()
    try:
        port = hub.sock.getsockname()[1]
        for query in ("", "?token=guess"):
            reader, writer = await _open(port, _post_head(1_000, "/api/act", query) + b"{")
            status = await asyncio.wait_for(reader.readline(), 3)
            assert status.startswith(b"HTTP/1.1 403"), status
            assert await _closed_by_server((reader, writer), 3)
    finally:
        await hub.close()
        hub.sock.close()


_SERVER = """
import asyncio, sys
from parley.arena.inference.http_guard import ConnectionLimits
from parley.arena.view.server import start

async def main():
    limits = ConnectionLimits(max_connections=8, header_timeout=0.5, body_timeout=0.5)
    runner, url = await start([sys.argv[1]], limits=limits)
    print(url.rstrip("/").rsplit(":", 1)[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
def stoppable(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A viewer in a process of its own (header and body timeouts 0.5 s), and its port."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(tmp_path)], stdout=subprocess.PIPE, bufsize=0
    )
    try:
        assert proc.stdout is not None
        yield proc, int(proc.stdout.readline())
    finally:
        stop(proc)


def _answer_after_a_stop(
    proc: subprocess.Popen[bytes], port: int, first: bytes, then: bytes
) -> bytes:
    """Send ``first`` on a new connection, stop the server (SIGSTOP) for 1.5 s (three
    times its timeouts), send ``then`` while it is stopped, resume it: its answer's first
    line (b"" when it closed the connection instead)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(first)
        time.sleep(0.2)  # (the server accepts the connection, reads ``first`` and times on)
        proc.send_signal(signal.SIGSTOP)
        try:
            conn.sendall(then)
            time.sleep(1.5)
        finally:
            proc.send_signal(signal.SIGCONT)
        with contextlib.suppress(ConnectionResetError):
            return conn.makefile("rb").readline()
        return b""


@pytest.mark.parametrize("stopped", ["before the headers", "before the body"])
def test_a_stopped_server_serves_what_came_while_it_was_stopped(
    stoppable: tuple[subprocess.Popen[bytes], int], stopped: str
) -> None:
    """The server stopped past its header or body timeout, the client's bytes all sent in
    time, during the stop: on resuming it serves the request (before: the connection was
    dropped, or the body answered 408, in the same turn as the bytes were read). The
    timeouts count the time the server ran; a silent client is still cut after a stop."""
    proc, port = stoppable
    if stopped == "before the headers":
        first, then = b"", _request()
    else:
        first, then = _post_head(2), b"{}"
    for _ in range(3):
        status = _answer_after_a_stop(proc, port, first, then)
        assert status.startswith(b"HTTP/1.1 "), status
        assert not status.startswith(b"HTTP/1.1 408"), status
    # A client that sends nothing is still closed: once resumed, within its timeout again.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        assert conn.recv(1024) == b""
        assert time.monotonic() - resumed < 3.0
