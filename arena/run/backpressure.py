"""Back-pressure: bus bounds sized for a run, and what a failed request means.

The framework's own limits must never fail an episode. :func:`bus_config_for` sizes the
bus bounds of a run from its concurrency and seats; a request a peer still refuses as
``overloaded`` (retryable: its agent never saw it) is sent again after :func:`backoff`,
within the act timeout. :func:`failure_reason` names every other failure as recorded, and
:func:`failed_seats` reads back from a recorded reason the seats whose agents failed.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Collection

from parley.arena.run.config import RunConfig
from parley.protocols.bus import BusConfig
from parley.protocols.errors import BusError, PeerDead, ProtocolError, RemoteError, RequestTimeout

__all__ = [
    "backoff",
    "bus_config_for",
    "failure_reason",
    "retryable",
]

RETRY_BACKOFF_S = 0.005
"""First wait before sending a request refused as ``overloaded`` again; it doubles per try."""
RETRY_BACKOFF_MAX_S = 0.5
"""Longest wait between two tries of one request (the act timeout bounds them all)."""


def bus_config_for(config: RunConfig, seats: int, base: BusConfig | None = None) -> BusConfig:
    """``base`` (default: :class:`BusConfig` with ``config.peer_timeout``) with bounds large
    enough for ``config``'s run.

    An episode has at most one request per seat in flight, so ``concurrency x seats``
    requests can be pending at the arena and suspended in the in-process agent host at once
    (each awaiting, say, an LLM). Each bound is at least that plus a margin (one-way
    end-of-episode notices, heartbeats), never lower than ``base``'s; the high-water mark
    is twice it, since requests and notices share the connection.
    """
    base = base or BusConfig(peer_timeout=config.peer_timeout)
    in_flight = config.concurrency * max(seats, 1) + 64
    return dataclasses.replace(
        base,
        max_handlers=max(base.max_handlers, in_flight),
        max_pending=max(base.max_pending, in_flight),
        hwm=max(base.hwm, 2 * in_flight),
    )


def backoff(tries: int, jitter: random.Random) -> float:
    """Seconds to wait before try ``tries + 1``: doubling from :data:`RETRY_BACKOFF_S`,
    capped, and spread by ``jitter`` so that refused episodes do not retry in step."""
    wait: float = min(RETRY_BACKOFF_S * 2.0 ** (tries - 1), RETRY_BACKOFF_MAX_S)
    return wait * (0.5 + jitter.random())


def retryable(result: object) -> bool:
    """Whether the peer refused the request before its agent saw it, asking for a retry."""
    if getattr(result, "retryable", False):
        return True
    return isinstance(result, RemoteError) and result.code == "overloaded"


def failure_reason(seat: str, result: object) -> str:
    """The recorded reason of a request that did not bring an action back.

    Bus and protocol failures (and a reply that is not an action) fail the episode; any
    other exception is a runner bug and is raised.
    """
    if isinstance(result, RequestTimeout):
        kind, detail = "timeout", str(result)
    elif isinstance(result, PeerDead):
        kind, detail = "peer_dead", str(result)
    elif isinstance(result, RemoteError):
        kind, detail = "agent_error", result.remote_message
    elif isinstance(result, BusError):
        kind, detail = "bus_error", str(result)
    elif isinstance(result, ProtocolError):  # e.g. infos holding a value msgpack cannot carry
        kind, detail = "protocol_error", str(result)
    elif isinstance(result, BaseException):
        raise result
    else:
        kind, detail = "bad_reply", f"expected an action, got {type(result)}"
    # Several seats' reasons are joined by "; ": an agent's own message cannot add a part
    # (one naming another seat would blame it: see failed_seats).
    return f"{seat}: {kind}: {detail.replace(SEPARATOR, ', ')}"


SEPARATOR = "; "
"""Between the reasons of several seats that failed in one step."""

AGENT_FAILURES = frozenset({"timeout", "peer_dead", "not_joined", "agent_error", "bad_reply"})
"""Failure kinds that are the failing seat's agent's doing (SCHEMA.md's failed episodes)."""


def failed_seats(reason: str, seats: Collection[str]) -> list[str] | None:
    """The seats whose agents made an episode fail, read from its recorded ``reason``
    (``SEAT: KIND: detail`` parts joined by :data:`SEPARATOR`); ``None`` when a part is not
    an agent's doing (``scenario_error: ...``, ``max_steps: ...``, a seat's ``bus_error``)
    or names no seat of ``seats``."""
    found = []
    for part in reason.split(SEPARATOR):
        seat, _, rest = part.partition(": ")
        if seat not in seats or rest.partition(":")[0] not in AGENT_FAILURES:
            return None
        found.append(seat)
    return found
