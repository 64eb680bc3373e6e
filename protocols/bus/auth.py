"""CURVE encryption and authentication for ``tcp://`` and ``ipc://`` sockets.

A CURVE bind is a CURVE server whose ZAP handler (:class:`ZapHandler`) admits only the
client keys in ``BusConfig.curve_allowed_clients`` (any key only with ``curve_allow_any``); a
CURVE connect authenticates the server by its public key. Each admitted connection carries
its client key as the ``User-Id`` of every message, so a peer's name is bound to the key
that said ``Hello`` (see :meth:`~parley.protocols.bus.Endpoint.set_admission`). A ZeroMQ
context has at most one ZAP handler, so CURVE endpoints need their own contexts.

Without CURVE, ``tcp://`` is plain text that anyone who can reach the port may join and
read: :meth:`~parley.protocols.bus.Endpoint.bind` refuses a non-loopback ``tcp://`` address
without keys unless ``BusConfig.allow_insecure_tcp`` is set.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import zmq
from zmq.utils import z85

from parley.protocols.bus.config import BusConfig
from parley.protocols.bus.core import log
from parley.protocols.errors import ConfigError

_ZAP_DOMAIN = "parley"  # the ZAP domain of CURVE binds, where the allowed client keys apply


def curve_server(z: zmq.Socket[bytes], config: BusConfig) -> None:
    """Make ``z`` (before it binds) a CURVE server in the ZAP domain of the allowed keys."""
    z.setsockopt(zmq.CURVE_SERVER, 1)
    z.setsockopt(zmq.CURVE_SECRETKEY, config.curve_secret_key or b"")
    z.setsockopt(zmq.CURVE_PUBLICKEY, config.curve_public_key or b"")
    z.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN.encode())


def curve_client(z: zmq.Socket[bytes], config: BusConfig, server_key: bytes) -> None:
    """Make ``z`` (before it connects) a CURVE client of the server whose key is given."""
    z.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    z.setsockopt(zmq.CURVE_SECRETKEY, config.curve_secret_key or b"")
    z.setsockopt(zmq.CURVE_PUBLICKEY, config.curve_public_key or b"")


ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler (RFC 27)


class ZapHandler:
    """The ZAP handler of one ZeroMQ context: admits the CURVE clients whose key is listed.

    libzmq asks it, for every new CURVE connection in the ``parley`` domain, whether the
    client's public key may connect; the answer's user id (the key, Z85) then travels with
    every message of that connection as its ``User-Id`` property, which the receive loop
    uses to bind a peer's identity to its key. It runs as a reader callback on the event
    loop and is removed from it before its socket closes, so a later handler in a new
    context that reuses the descriptor number is never disturbed (pyzmq's
    ``AsyncioAuthenticator`` cancels its task without waiting, and its late clean-up
    unregistered the next handler's descriptor: a second CURVE bind admitted nobody).
    """

    def __init__(self, ctx: zmq.Context[Any], config: BusConfig) -> None:
        allowed = config.curve_allowed_clients
        self.allowed = None if allowed is None else frozenset(_z85(k) for k in allowed)
        self.refused = 0
        self.sock: zmq.Socket[bytes] = zmq.Socket(ctx, zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        try:
            self.sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self.sock.close(0)
            raise ConfigError(
                "another CURVE endpoint already runs a ZAP handler in this ZeroMQ context; "
                f"give this endpoint its own context ({exc})"
            ) from exc
        self.fd = int(self.sock.getsockopt(zmq.FD))
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.fd, self._serve)
        self.loop.call_soon(self._serve)  # requests may be queued already

    def _serve(self) -> None:
        while True:  # the descriptor is edge-triggered: read until nothing is left
            try:
                request = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                log.warning("ZAP handler stopped reading: %s", exc)
                return
            try:
                self.sock.send_multipart(self._answer(request))
            except zmq.ZMQError as exc:  # the context is closing: libzmq refuses the client
                log.warning("ZAP handler could not answer: %s", exc)
                return

    def _answer(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6:
            return [b"1.0", b"", b"400", b"malformed ZAP request", b"", b""]
        version, request_id, domain, _address, _identity, mechanism, *credentials = request
        if version != b"1.0":
            return [b"1.0", request_id, b"400", b"unsupported ZAP version", b"", b""]
        if mechanism != b"CURVE":
            return [version, request_id, b"200", b"OK", b"", b""]  # not ours to judge
        if domain.decode(errors="replace") != _ZAP_DOMAIN or len(credentials) != 1:
            return [version, request_id, b"400", b"unknown domain", b"", b""]
        key = z85.encode(credentials[0]).decode("ascii")
        if self.allowed is not None and key not in self.allowed:
            self.refused += 1
            return [version, request_id, b"400", b"client key not allowed", b"", b""]
        return [version, request_id, b"200", b"OK", key.encode(), b""]

    def close(self) -> None:
        """Stop answering; safe to call twice."""
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            self.fd = -1
            self.sock.close(0)


def _z85(key: bytes | str) -> str:
    """A CURVE public key as its 40-character Z85 text (keys given as 32 raw bytes too)."""
    raw = key.encode() if isinstance(key, str) else key
    if len(raw) == 32:
        return z85.encode(raw).decode("ascii")
    if len(raw) != 40:
        raise ConfigError(f"a CURVE key is 40 Z85 characters (or 32 bytes), got {len(raw)}")
    return raw.decode("ascii")


def is_loopback(address: str) -> bool:
    """Whether a ``tcp://`` address binds only the loopback interface: its host is
    ``localhost`` or a loopback IP address, and nothing else. (ZeroMQ reads
    ``tcp://127.0.0.1:0;0.0.0.0:5555`` as a bind of ``0.0.0.0:5555``, which a host that
    merely starts with ``127.`` had passed as loopback.)"""
    host = address.removeprefix("tcp://").rpartition(":")[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # (an interface name, a host name, a source;destination pair)
        return False
