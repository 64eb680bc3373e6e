"""Who may take a seat: the arena's CURVE keys, seats bound to client keys, expected names.

A run that listens on ``tcp://`` for remote agents is reachable by anyone on the network.
With ``RunConfig.curve_key`` (the arena's secret key file) its tcp bind is a CURVE server
that admits only the public keys listed in ``RunConfig.seat_keys`` (seat -> key file), and
each seat's agent name (``agent-SEAT``) is bound to that seat's key: an agent can act only
for its own seat, whoever connects first. Without keys, a non-loopback tcp address is
refused unless ``RunConfig.insecure`` is set. On every transport the arena admits only the
names it waits for (the in-process agent host and one name per remote seat) and tells any
other peer which names those are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from parley.arena.run.config import RunConfig
from parley.protocols.bus import Admission, BusConfig
from parley.protocols.errors import ConfigError
from parley.protocols.keys import load_public_key, load_secret_key

__all__ = [
    "ARENA_ACCEPTS",
    "SeatKeys",
    "arena_bus_config",
    "arena_endpoint_config",
    "admission_policy",
]


@dataclasses.dataclass(frozen=True)
class SeatKeys:
    """The run's CURVE material: the arena's key pair and each remote seat's public key."""

    public: bytes
    secret: bytes
    seats: Mapping[str, bytes]

    @classmethod
    def load(cls, config: RunConfig, remote_seats: set[str]) -> SeatKeys | None:
        """The keys named by ``config``, checked against the run's remote seats."""
        if not config.curve_key:
            if config.seat_keys:
                raise ConfigError("seat_keys need curve_key: the arena's secret key file")
            return None
        public, secret = load_secret_key(config.curve_key)
        unknown = sorted(set(config.seat_keys) - remote_seats)
        if unknown:
            raise ConfigError(
                f"seat_keys name {unknown}, which are not remote seats of this run "
                f"(remote seats: {sorted(remote_seats) or 'none'})"
            )
        missing = sorted(remote_seats - set(config.seat_keys))
        if missing:
            raise ConfigError(
                f"with curve_key, every remote seat needs its agent's public key: add "
                f"seat_keys for {missing} (`parley keys new agent-SEAT` makes a pair)"
            )
        seats = {seat: load_public_key(path) for seat, path in config.seat_keys.items()}
        return cls(public, secret, seats)


def arena_bus_config(base: BusConfig, keys: SeatKeys | None, *, insecure: bool) -> BusConfig:
    """``base`` with the arena's CURVE keys, admitting exactly the seat keys."""
    if keys is None:
        return dataclasses.replace(base, allow_insecure_tcp=True) if insecure else base
    insecure = insecure or base.allow_insecure_tcp
    return dataclasses.replace(
        base,
        curve_public_key=keys.public,
        curve_secret_key=keys.secret,
        curve_allowed_clients=tuple(keys.seats.values()),
        allow_insecure_tcp=insecure,
    )


ARENA_ACCEPTS = frozenset({"action"})
"""What the arena's endpoint decodes from its peers besides the session kinds: the agents'
replies. Anything else (an ``Observation`` with 64 MiB of nesting in ``info``) is refused
unread, so a seated agent cannot make the arena build it."""

ARENA_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The most an arena's endpoint takes in one message (less when its config says less). An
action is text and token records: a 128k-token prompt is ~400 KB of ids. The bus's 64 MiB
default is for weights; token ids and logprobs cost up to ~30x their wire size once decoded."""


def arena_endpoint_config(base: BusConfig) -> BusConfig:
    """``base`` for an endpoint that agents answer (the arena's, a seat's replica listener):
    it takes :data:`ARENA_ACCEPTS` (unless ``base`` names its kinds) and messages of at
    most :data:`ARENA_MAX_MESSAGE_BYTES`. (The in-process agent host, over the bus, takes
    observations instead.)"""
    limit = min(base.max_message_bytes, ARENA_MAX_MESSAGE_BYTES)
    return dataclasses.replace(base.accepting(ARENA_ACCEPTS), max_message_bytes=limit)


def admission_policy(expected: Mapping[str, bytes | None]) -> Admission:
    """Admit only the ``expected`` peer names, each from its key where one is given
    (``None``: a connection without CURVE, such as the in-process host over inproc)."""
    wanted = {name: None if key is None else key.decode() for name, key in expected.items()}

    def admit(name: str, key: str | None) -> str | None:
        if name not in wanted:
            return (
                f"this arena has no seat for a peer named {name!r}; it waits for "
                f"{sorted(wanted)} (the agent of seat SEAT connects as agent-SEAT)"
            )
        if wanted[name] != key:
            return (
                f"{name} is bound to another CURVE key than this connection's: an agent "
                "connects with its own seat's secret key (--curve-key agent-SEAT.key_secret)"
            )
        return None

    return admit
