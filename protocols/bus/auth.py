"""CURVE encryption and authentication for ``tcp://`` sockets.

A CURVE bind is a CURVE server whose ZAP handler admits only the client keys in
``BusConfig.curve_allowed_clients`` (``None`` admits any key that completes the CURVE
handshake); a CURVE connect authenticates the server by its public key. A ZeroMQ context has
at most one ZAP handler, so endpoints with different allowed keys need their own contexts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

from parley.protocols.bus.config import BusConfig
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


def start_authenticator(ctx: zmq.Context[Any], config: BusConfig) -> Any:
    """Start the ZAP handler of ``ctx`` admitting ``config.curve_allowed_clients``."""
    from zmq.auth import CURVE_ALLOW_ANY
    from zmq.auth.asyncio import AsyncioAuthenticator

    allowed = config.curve_allowed_clients
    auth = AsyncioAuthenticator(ctx)
    try:
        auth.start()
    except zmq.ZMQError as exc:
        raise ConfigError(
            "another CURVE endpoint already runs a ZAP handler in this ZeroMQ context; "
            f"give this endpoint its own context ({exc})"
        ) from exc
    if allowed is None:
        auth.configure_curve(domain="*", location=CURVE_ALLOW_ANY)
    else:
        auth.configure_curve_callback(domain=_ZAP_DOMAIN, credentials_provider=_KeyList(allowed))
    return auth


class _KeyList:
    """ZAP credentials provider admitting a fixed set of CURVE client keys."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        self.keys = frozenset(keys)

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys
