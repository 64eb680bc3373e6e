"""Reaching a Ray cluster: the optional ``ray`` import with its install hint, and
:func:`init_ray`, which connects (or starts a private local Ray) and keeps the caller's
SIGTERM handler. Imported by :mod:`parley.arena.run.ray_runner` (which re-exports it) and
by everything else that puts work on Ray (seat replicas, pool replicas, ``parley serve``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from parley.protocols.errors import ConfigError, require

__all__ = ["LOCAL", "import_ray", "init_ray"]

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
