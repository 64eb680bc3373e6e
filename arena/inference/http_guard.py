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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

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


def guard(*, loopback_only: bool) -> Middleware:
    """The middleware: JSON-only ``POST``; with ``loopback_only``, loopback ``Host`` only."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
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
        return await handler(request)

    return check
