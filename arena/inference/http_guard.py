"""Guards of the HTTP front against a web browser used as a weapon.

The front has no authentication: it is meant for loopback (or a trusted network with
``--insecure``). Two browser attacks still reach a loopback server, and both are refused
here:

* **CSRF**: any web page can ``POST`` a ``text/plain`` body to ``http://127.0.0.1:PORT``
  without a CORS preflight. Every ``POST`` must say ``Content-Type: application/json``
  (which a page cannot send cross-origin without a preflight this server never grants);
  anything else gets 415.
* **DNS rebinding**: a page whose domain is re-pointed at 127.0.0.1 talks to the server as
  same-origin. A loopback-bound front answers only loopback ``Host`` headers (421
  otherwise), as the run viewer does.

And one attack from anyone who can connect, on every parley HTTP server (the front, the
run viewer, the human seat's page): **slow or idle connections**. aiohttp holds a
connection that never finishes its request's headers for ever (300 such connections were
all still open after 20 s), so a few thousand exhaust the process's file descriptors — in
the human seat's case, the arena's own. :class:`GuardedSite` and :func:`guard` close a
connection that takes longer than ``header_timeout`` to send any request's headers
(counted from its first byte, or from the connection's start or the previous response),
or longer than ``body_timeout`` to send a request's body, and hold at most
``max_connections`` at once: a new one past the cap evicts the connection idle the longest
between two requests (keep-alive), else the oldest one still sending headers, or is closed
if every one is inside a request. ``guard(authorize=...)`` refuses a request before a byte
of its body is read. All of it is logged at a bounded rate. Both timeouts count the time
this process ran (:class:`~parley.arena.inference.patience.PatientTimer`): a server stopped
or starved past them reads what its clients sent in time before it judges them.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from parley.arena.inference.patience import PatientTimer, patient_wait_for
from parley.protocols.bus.auth import is_loopback
from parley.protocols.errors import ConfigError

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_is_loopback(host: str, port: int | str = 0) -> bool:
    """Whether binding ``host`` serves only the loopback interface (``""``: all of them)."""
    return bool(host) and is_loopback(f"tcp://{host}:{port}")


def check_http_bind(http: str, *, insecure: bool) -> None:
    """Refuse ``--http HOST:PORT`` off loopback unless ``insecure``: the front has no
    authentication, and ``POST /v1/weights`` loads weights from any path on this machine."""
    host, sep, port = http.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--http must be HOST:PORT, got {http!r}")
    if not insecure and not http_is_loopback(host, port):
        raise ConfigError(
            f"refusing to serve HTTP on {http}: the OpenAI front has no authentication, so "
            "anyone who can reach it could use the pool and load weights from any path on "
            "this machine. Serve it on 127.0.0.1 (and tunnel to it), or pass --insecure on "
            "a network you trust"
        )


def _host_name(host: str) -> str:
    """``Host`` header without its port: ``[::1]:8000`` -> ``[::1]``, ``a:80`` -> ``a``."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _refuse(status: int, message: str, code: str) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return web.json_response({"error": error}, status=status)


def guard(
    *, loopback_only: bool, authorize: Callable[[web.Request], object] | None = None
) -> Middleware:
    """The middleware: JSON-only ``POST``; with ``loopback_only``, loopback ``Host`` only.

    A request with a body is first passed to ``authorize`` (which raises an HTTP error to
    refuse it; the connection is then closed unread), then its whole body is read within
    the site's ``ConnectionLimits.body_timeout`` (408 and the connection closed otherwise)
    before the handler runs: a trickled body holds no handler and no seat. Behind a
    :class:`GuardedSite` the connection's header timer then restarts for its next
    request."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = _CONNECTIONS.get(request.transport) if request.transport is not None else None
        if conn is not None:
            conn.request_started()
        try:
            refusal = _refusal(request, loopback_only)
            if refusal is None and request.body_exists:
                limits = conn.limits if conn is not None else _UNGUARDED
                refusal = await _read_body(request, authorize, limits.body_timeout)
            if refusal is not None:
                return await _send_and_close(request, refusal)
            if conn is not None:
                conn.body_read()
            return await handler(request)
        finally:
            if conn is not None:
                conn.request_done()

    return check


async def _send_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send ``response``, then close the connection, the request's body left unread
    (aiohttp would read on for up to its lingering time, 10 s, a trickler's to use)."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()  # (the transport closes once the response is sent)
    return response


def _refusal(request: web.Request, loopback_only: bool) -> web.Response | None:
    if loopback_only and _host_name(request.host or "").lower() not in LOOPBACK_HOSTS:
        return _refuse(
            421,
            f"unexpected Host header {request.host!r}: this server answers only "
            "127.0.0.1, localhost and [::1]",
            "bad_host",
        )
    if request.method == "POST" and request.content_type != "application/json":
        return _refuse(
            415,
            f"POST bodies must be sent with Content-Type: application/json, got "
            f"{request.content_type!r}",
            "unsupported_media_type",
        )
    return None


async def _read_body(
    request: web.Request, authorize: Callable[[web.Request], object] | None, seconds: float
) -> web.Response | None:
    """Authorize ``request``, then read its body whole (cached for the handler)."""
    try:
        if authorize is not None:
            authorize(request)
        await patient_wait_for(request.read(), seconds)  # (a stall of ours is not theirs)
    except web.HTTPException as exc:  # (refused, or larger than client_max_size)
        return _refuse(exc.status, exc.text or exc.reason, "refused")
    except TimeoutError:
        return _refuse(
            408,
            f"the request body did not arrive within {seconds:g} s; send it at once",
            "body_timeout",
        )
    return None


log = logging.getLogger("parley.http")

_LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections a parley HTTP server holds at once, how long a connection may
    take to send each request's headers (seconds, from its first byte, or from the
    connection's start or its previous response) and each request's body (seconds, from
    its headers)."""

    max_connections: int
    header_timeout: float = 10.0
    body_timeout: float = 30.0

    @classmethod
    def default(cls) -> ConnectionLimits:
        """A quarter of this process's file descriptor limit, between 64 and 4,096."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 16_384
        return cls(max_connections=max(64, min(4096, soft // 4)))


_CONNECTIONS: dict[asyncio.BaseTransport, _Guarded] = {}
"""The guarded connection of each open transport, for :func:`guard` (a request knows its
transport, not its site); entries leave with their connection."""


_UNGUARDED = ConnectionLimits(max_connections=0)
"""The timeouts :func:`guard` applies to a request outside a :class:`GuardedSite` (tests)."""


class _Tracker:
    """The connections of one site: how many, which are idle between two requests and which
    are sending headers (each oldest first), and what was refused since the last log line."""

    def __init__(self, limits: ConnectionLimits, name: str) -> None:
        self.limits = limits
        self.name = name
        self.open = 0
        self.idle: dict[_Guarded, None] = {}  # (insertion order: oldest first)
        self.headless: dict[_Guarded, None] = {}
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self._logged_at = 0.0

    def admit(self) -> bool:
        """Room for one more connection (evicting the longest idle, else the oldest still
        sending headers, if full)?"""
        if self.open < self.limits.max_connections:
            return True
        waiting = self.idle or self.headless
        if waiting:
            next(iter(waiting)).drop()
            self.evicted += 1
            self.note()
            return True
        self.refused += 1
        self.note()
        return False

    def note(self) -> None:
        now = time.monotonic()
        if now - self._logged_at < _LOG_EVERY_S:
            return
        self._logged_at = now
        log.warning(
            "%s: %d connection(s) refused at the cap of %d, %d evicted and %d closed for "
            "sending no request headers within %g s (counts since the server started)",
            self.name,
            self.refused,
            self.limits.max_connections,
            self.evicted,
            self.timed_out,
            self.limits.header_timeout,
        )


class _Guarded(asyncio.Protocol):
    """An aiohttp connection, counted, and closed if a request's headers are too slow.

    Its states: *waiting* for a request's headers (timer on; in ``headless`` once a byte of
    them came or before its first request, in ``idle`` between two requests), and *in a
    request* (from the moment :func:`guard` sees it until its response is done)."""

    def __init__(self, make: Callable[[], Any], tracker: _Tracker) -> None:
        self._make = make
        self._tracker = tracker
        self._inner: Any = None  # aiohttp's protocol, made only for an admitted connection
        self._transport: asyncio.Transport | None = None
        self._timer: PatientTimer | None = None
        self._busy = False  # inside a request (guard saw its headers)
        self._early = False  # bytes came after this request's body: the next one's start

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tracker = self._tracker
        assert isinstance(transport, asyncio.Transport)  # (a stream server's transport)
        if not tracker.admit():
            transport.abort()
            return
        tracker.open += 1
        self._transport = transport
        _CONNECTIONS[transport] = self
        self._wait(tracker.headless)
        self._inner = self._make()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if self._busy:
            self._early = True
        elif self in self._tracker.idle:  # the next request begins: its headers are timed
            self._wait(self._tracker.headless)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._inner is None else self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is None:
            return
        self._stop_waiting()
        self._tracker.open -= 1
        if self._transport is not None:
            _CONNECTIONS.pop(self._transport, None)
        inner, self._inner = self._inner, None
        inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    @property
    def limits(self) -> ConnectionLimits:
        return self._tracker.limits

    def request_started(self) -> None:
        """:func:`guard` has a request of this connection: its headers are in."""
        self._stop_waiting()
        self._busy, self._early = True, False

    def body_read(self) -> None:
        """The request's body is read: any byte from now on is the next request's."""
        self._early = False

    def request_done(self) -> None:
        """The response is done: wait for the next request, idle or already begun."""
        self._busy = False
        if self._inner is not None:
            self._wait(self._tracker.headless if self._early else self._tracker.idle)

    def _wait(self, where: dict[_Guarded, None]) -> None:
        """Wait for a request's headers in ``where``, timed from now."""
        self._stop_waiting()
        where[self] = None
        timeout = self._tracker.limits.header_timeout
        # Patient: headers that came while this process was stopped are read first.
        self._timer = PatientTimer(asyncio.get_running_loop(), timeout, self._too_slow)

    def _stop_waiting(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._tracker.headless.pop(self, None)
        self._tracker.idle.pop(self, None)

    def _too_slow(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is not None and transport.get_write_buffer_size():
            # Its last response is still being sent (a slow reader): wait on, not drop it.
            where = self._tracker.headless if self in self._tracker.headless else self._tracker.idle
            self._wait(where)
            return
        self._tracker.timed_out += 1
        self._tracker.note()
        self.drop()

    def drop(self) -> None:
        """Close the connection now (it is not inside a request)."""
        self._stop_waiting()
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows: counted out there


class GuardedSite(web.SockSite):
    """aiohttp's :class:`~aiohttp.web.SockSite` with :class:`ConnectionLimits` enforced.

    Its application must run :func:`guard` as a middleware: without it no request is seen
    to start, and each connection is closed ``header_timeout`` after it opened."""

    __slots__ = ("_limits",)

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, limits: ConnectionLimits | None = None
    ) -> None:
        super().__init__(runner, sock)
        self._limits = limits or ConnectionLimits.default()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site (SockSite's would serve unguarded)
        server = self._runner.server
        assert server is not None  # (BaseSite refuses a runner that is not set up)
        tracker = _Tracker(self._limits, f"HTTP server {self.name}")
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guarded(server, tracker), sock=self._sock, backlog=self._backlog
        )


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port; ``""``: every IPv4 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


async def serve_guarded(
    runner: web.BaseRunner, host: str, port: int, limits: ConnectionLimits | None = None
) -> int:
    """Serve ``runner`` (set up) on ``host:port`` through a :class:`GuardedSite`; returns
    the bound port (``port`` 0 picks one). ``runner.cleanup()`` stops it."""
    sock = bind_tcp(host, port)
    await GuardedSite(runner, sock, limits).start()
    return int(sock.getsockname()[1])
