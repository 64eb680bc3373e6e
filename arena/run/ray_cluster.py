"""Reaching a Ray cluster: the optional ``ray`` import with its install hint, and
:func:`init_ray`, which connects (or starts a private local Ray) and keeps the caller's
SIGTERM handler. Imported by :mod:`parley.arena.run.ray_runner` (which re-exports it) and
by everything else that puts work on Ray (seat replicas, pool replicas, ``parley serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from parley.protocols.errors import ConfigError, require

__all__ = [
    "LOCAL",
    "RayHeadGone",
    "RayWorkersLost",
    "head_refuses",
    "import_ray",
    "init_ray",
    "watch_head",
]

LOCAL = "local"
"""``RunConfig.ray`` value (also ``""``) that starts a private local Ray when none is up."""


def import_ray() -> Any:
    """The ``ray`` module, or :class:`~parley.protocols.errors.MissingDependency` naming the
    extra to install (``pip install 'parley[ray]'``)."""
    return require("ray", "ray")


def init_ray(address: str | None = LOCAL, *, num_cpus: int | None = None) -> bool:
    """Connect to Ray at ``address`` (``auto``, ``HOST:PORT``, ``ray://HOST:10001``) or start
    a local one (``local``/``""``/``None``); nothing when this process is connected already.
    Returns whether this call started (or connected) Ray, so the caller knows to shut it down.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    with _keeping_sigterm():
        if address in (None, "", LOCAL):
            # A private one: a bare ray.init() joins a cluster `ray start` left on this machine.
            ray.init(address="local", num_cpus=num_cpus, **options)
        else:
            try:
                ray.init(address=address, **options)
            except ConnectionError as exc:
                raise ConfigError(
                    f"cannot connect to Ray at {address}: {exc} (start one with `ray start "
                    "--head`, or pass --ray without an address for a local Ray)"
                ) from exc
    return True


@contextlib.contextmanager
def _keeping_sigterm() -> Iterator[None]:
    """Put back the SIGTERM handler ``ray.init`` replaces (with ``sys.exit(15)``, which
    unwinds through Ray's threads and aborts with a C++ stack dump, rc 134): ``parley run``
    and ``parley serve`` install theirs first and end as on a single host (partial summary,
    rc 143). Only the main thread can set handlers; elsewhere there is nothing to keep."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before is not None:  # None: set from C, not restorable from Python
            signal.signal(signal.SIGTERM, before)


class RayWorkersLost(RuntimeError):
    """Every Ray worker of a run was lost and none could be replaced, or (``exit_status``
    4) the head was; :attr:`summary` is the partial summary written."""

    summary: dict[str, Any] | None = None
    exit_status = 3
    """``parley run``'s exit status."""


class RayHeadGone(RayWorkersLost):
    """The Ray head refused connections for ``RayRunner.head_lost_after_s``."""

    exit_status = 4


_GONE = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH}
"""Answers that say nobody listens there any more; a connection that only times out is a
busy head, not a dead one."""


def _gcs_address(ray: Any) -> str | None:
    """``HOST:PORT`` of the GCS this process is connected to (None for ``ray://``)."""
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # (ray:// clients have no GCS address of their own)
        return None


def head_refuses(ray: Any) -> bool:
    """Whether the head's GCS port refuses a connection now (the head is gone): calls
    that need the head (creating or killing an actor) would block until Ray ends the
    process. One connection attempt, at most a second; a busy head does not refuse."""
    address = _gcs_address(ray)
    if address is None:
        return False
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError as exc:
        return exc.errno in _GONE
    return False


async def watch_head(ray: Any, *, lost_after_s: float, every_s: float = 1.0) -> RayHeadGone:
    """Return :class:`RayHeadGone` (never raise it) once the GCS of the cluster ``ray`` is
    connected to has refused every connection for ``lost_after_s``; until then, run (for
    ever with a ``ray://`` client, which does not reach the head itself). A refusal is the
    kernel's answer that the port is closed, so load cannot fake one; a connection attempt
    that times out (a busy head) changes nothing."""
    address = _gcs_address(ray)
    while address is None:  # (for ever: cancelled with the run)
        await asyncio.Event().wait()
    host, _, port = address.rpartition(":")
    refused_since: float | None = None
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
        except OSError as exc:  # (a timeout too: a busy head, neither alive nor dead)
            if exc.errno in _GONE:
                refused_since = refused_since or time.monotonic()
                if time.monotonic() - refused_since >= lost_after_s:
                    return RayHeadGone(
                        f"the Ray head at {address} refused connections for "
                        f"{lost_after_s:.0f} s: the cluster is gone; restart it and run again"
                    )
        else:
            writer.close()
            refused_since = None
        await asyncio.sleep(every_s)
