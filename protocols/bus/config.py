"""Timing, bounds and CURVE keys of an endpoint, and its counters.

Why each bound has the value it has is in the package docstring (``parley.protocols.bus``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from parley.protocols.codec import DEFAULT_MAX_MESSAGE_BYTES
from parley.protocols.errors import ConfigError
from parley.protocols.messages import BODY_KINDS

__all__ = ["BusConfig", "BusStats"]


@dataclass(frozen=True, kw_only=True)
class BusConfig:
    """Timing, bounds and keys of an :class:`Endpoint` (see the module docstring for why)."""

    heartbeat_interval: float = 1.0
    """Seconds of silence towards a peer after which a ``Heartbeat`` is sent."""
    peer_timeout: float = 60.0
    """Seconds a peer whose connection is still open may stay silent (a busy or paused
    process) before it is declared dead. A peer whose connection closed (its process died)
    is declared dead after 2.5 heartbeat intervals of silence, whatever this is."""
    request_timeout: float = 30.0
    """Default timeout of ``request`` (and of a send that finds the queue full)."""
    connect_timeout: float = 10.0
    """Default timeout of ``connect`` (handshake included)."""
    hwm: int = 10_000
    """ZeroMQ send and receive high-water mark, in messages, per connection."""
    max_pending: int = 10_000
    """Most requests awaiting a reply at once; more raise ``BusError``."""
    max_handlers: int = 1_000
    """Most request handlers suspended at once; more are answered ``overloaded``."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest message accepted or sent (all frames)."""
    max_subscriptions: int = 256
    """Most broadcast prefixes one peer may subscribe to (each at most 256 characters);
    more are refused with ``Error(too_many_subscriptions)``."""
    accept: frozenset[str] | None = None
    """Body kinds (wire tags) this endpoint decodes from its peers, besides the session
    kinds (``hello``, ``heartbeat``, ``bye``, ``subscribe``, ``ok``, ``error``); a message of
    another kind is refused unread with ``Error(unexpected_kind)``, as a reply fails its
    request. ``None``: every kind. An endpoint that peers it does not control can reach
    should name what it handles (the arena: ``action``): then no peer makes it build the
    objects of a kind it never reads (:class:`~parley.protocols.codec.Codec`)."""
    curve_public_key: bytes | None = None
    """This endpoint's CURVE public key (Z85, from ``zmq.curve_keypair()``)."""
    curve_secret_key: bytes | None = None
    """This endpoint's CURVE secret key; setting it turns CURVE on for ``tcp://``."""
    curve_server_key: bytes | None = None
    """Public key of the endpoint that ``connect`` reaches over ``tcp://``."""
    curve_allowed_clients: tuple[bytes, ...] | None = None
    """Client public keys (Z85) a CURVE bind admits; required unless ``curve_allow_any``."""
    curve_allow_any: bool = False
    """Let a CURVE bind admit any client key (encryption without authentication)."""
    allow_insecure_tcp: bool = False
    """Let ``bind`` listen on a non-loopback ``tcp://`` address without CURVE (plain text,
    anyone who reaches the port can connect): only on a network you trust."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval", "peer_timeout", "request_timeout", "connect_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"BusConfig.{name} must be positive, got {getattr(self, name)}")
        bounds = ("hwm", "max_pending", "max_handlers", "max_message_bytes", "max_subscriptions")
        for name in bounds:
            if getattr(self, name) < 1:
                raise ConfigError(f"BusConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.peer_timeout <= self.heartbeat_interval:
            raise ConfigError(
                f"peer_timeout ({self.peer_timeout}) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}); use at least 2.5x"
            )
        if self.accept is not None:
            unknown = sorted(set(self.accept) - BODY_KINDS)
            if unknown:
                raise ConfigError(f"BusConfig.accept names unknown body kinds {unknown}")
        if (self.curve_secret_key is None) != (self.curve_public_key is None):
            raise ConfigError("set curve_public_key and curve_secret_key together")

    def accepting(self, kinds: frozenset[str]) -> BusConfig:
        """This config with ``accept=kinds``, unless it already names its own kinds."""
        return self if self.accept is not None else dataclasses.replace(self, accept=kinds)

    @property
    def curve(self) -> bool:
        """Whether CURVE is on for ``tcp://``."""
        return self.curve_secret_key is not None


@dataclass
class BusStats:
    """Counters of one endpoint (monotonic; read them, do not write them)."""

    sent: int = 0
    received: int = 0
    bad_messages: int = 0
    unhandled: int = 0
    late_replies: int = 0
    handler_errors: int = 0
    dead_peers: int = 0
    hello_required: int = 0
    """Messages from connections that had not said ``Hello`` (other than a ``Hello``,
    ``Heartbeat`` or ``Bye``), refused unread."""
    replies_dropped: int = 0
    """Replies dropped because their peer had :data:`~parley.protocols.bus.send.MAX_REPLIES_WAITING`
    replies already waiting for room in its queue (it reads none: its requests time out)."""
