"""parley's exception hierarchy, named by the boundary where the failure happened.

Every message says what went wrong and, where it can, what to do next.
"""

from __future__ import annotations

__all__ = [
    "ParleyError",
    "ProtocolError",
    "BusError",
    "RequestTimeout",
    "PeerDead",
    "RemoteError",
    "ConfigError",
    "MissingDependency",
]


class ParleyError(Exception):
    """Base of every error parley raises on purpose."""


class ProtocolError(ParleyError):
    """Bytes that are not a valid parley message (or a message that cannot be sent).

    ``code`` is the :class:`~parley.protocols.messages.Error` code a receiver answers with.
    """

    def __init__(self, reason: str, *, code: str = "bad_message") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class BusError(ParleyError):
    """A failure of the message bus: a closed endpoint, an unknown peer, a full queue."""


class RequestTimeout(BusError, TimeoutError):
    """A request got no reply within its timeout."""


class PeerDead(BusError):
    """The peer a request went to stopped sending heartbeats or said goodbye."""


class RemoteError(BusError):
    """The peer answered a request with an ``Error`` message; ``retryable`` is the peer's
    word that the same request may succeed later (``overloaded``)."""

    def __init__(self, code: str, message: str, *, peer: str = "", retryable: bool = False) -> None:
        super().__init__(f"{peer or 'peer'} replied {code}: {message}")
        self.code = code
        self.remote_message = message
        self.peer = peer
        self.retryable = retryable


class ConfigError(ParleyError, ValueError):
    """A configuration value or command-line option that cannot work."""


class MissingDependency(ParleyError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed; install it with: pip install 'parley[{extra}]'"
        )
        self.package = package
        self.extra = extra


def require(module: str, extra: str) -> object:
    """Import an optional dependency, or raise :class:`MissingDependency` naming its extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(module, extra) from exc
