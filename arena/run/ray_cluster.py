"""Reaching a Ray cluster: the optional ``ray`` import with its install hint, and
:func:`init_ray`, which connects (or starts a private local Ray) and keeps the caller's
SIGTERM handler. Imported by :mod:`parley.arena.run.ray_runner` (which re-exports it) and
by everything else that puts work on Ray (seat replicas, pool replicas, ``parley serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from parley.protocols.errors import ConfigError, require

__all__ = [
    "LOCAL",
    "HeadWatch",
    "RayHeadGone",
    "RayWorkersLost",
    "head_refuses",
    "import_ray",
    "init_ray",
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


class HeadWatch:
    """Watches the GCS of the cluster ``ray`` is connected to from a thread of its own, so a
    verdict comes whatever the driver's event loop is doing (a call blocked on the dead head
    held it, and a watch on the loop never ended the run: Ray's client ended the process
    60 s later, rc 1).

    The head is gone once its GCS port has refused every connection for ``lost_after_s``,
    counted both in time and in probes (``lost_after_s / every_s`` refusals in a row): a
    refusal is the kernel's answer that the port is closed, so load cannot fake one, and a
    driver stopped between two refusals does not turn its stall into a verdict. A probe
    that times out (a busy head) changes nothing. A ``ray://`` client never gets a verdict
    (it does not reach the head itself).

    :meth:`start` returns a future the verdict (a :class:`RayHeadGone`, never raised) is
    set on, in the loop's thread. If the run has not called :meth:`end` ``stuck_after_s``
    after the verdict (its loop is blocked), the watch's thread calls ``on_stuck()``, which
    writes what it can and says what (``after N of M episodes``), and ends the process with
    one ``parley run:`` line and the verdict's status (4): the last resort, before Ray's
    client ends it (rc 1, its own error lines, 60 s after the head went).
    """

    def __init__(
        self,
        ray: Any,
        *,
        lost_after_s: float,
        every_s: float = 1.0,
        stuck_after_s: float = 10.0,
        on_stuck: Callable[[], str] | None = None,
    ) -> None:
        self.address = _gcs_address(ray)
        self.lost_after_s = lost_after_s
        self.every_s = every_s
        self.stuck_after_s = stuck_after_s
        self.on_stuck = on_stuck
        self._ended = threading.Event()
        # Held by the last resort from its check of _ended to the exit, and by end(): once
        # end() returns, the thread never writes nor ends the process under the loop's feet.
        self._last_resort = threading.Lock()

    def start(self) -> asyncio.Future[RayHeadGone]:
        """Start watching; the future gets the verdict (it is never set for ``ray://``)."""
        loop = asyncio.get_running_loop()
        verdict_future: asyncio.Future[RayHeadGone] = loop.create_future()

        def tell(verdict: RayHeadGone) -> None:
            if not verdict_future.done():
                verdict_future.set_result(verdict)

        def watch(address: str) -> None:
            verdict = self._verdict(address)
            if verdict is None:  # ended first
                return
            with contextlib.suppress(RuntimeError):  # (the loop is closed: nobody to tell)
                loop.call_soon_threadsafe(tell, verdict)
            if self._ended.wait(self.stuck_after_s) or self.on_stuck is None:
                return
            with self._last_resort:
                if self._ended.is_set():  # (the loop came back as the wait ran out)
                    return
                said = self.on_stuck()
                why = " ".join(str(verdict).split())
                sys.stderr.write(
                    f"parley run: stopped ({why}; the driver was blocked on the dead head, so "
                    f"its head watch ended it) {said}\n"
                )
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(verdict.exit_status)

        if self.address is not None:
            threading.Thread(
                target=watch, args=(self.address,), name="parley-head-watch", daemon=True
            ).start()
        return verdict_future

    def end(self) -> None:
        """The run is over (or handled the verdict): stop probing, never call ``on_stuck``.
        Where the last resort has begun, waits for it (it ends the process)."""
        with self._last_resort:
            self._ended.set()

    def _verdict(self, address: str) -> RayHeadGone | None:
        """Probe ``address`` every ``every_s`` until the head is gone (its verdict) or
        :meth:`end`."""
        host, _, port = address.rpartition(":")
        needed = max(1, math.ceil(self.lost_after_s / self.every_s))
        refused_since: float | None = None
        refusals = 0
        while not self._ended.is_set():
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except OSError as exc:  # (a timeout too: a busy head, neither alive nor dead)
                if exc.errno in _GONE:
                    refused_since = refused_since or time.monotonic()
                    refusals += 1
                    lasted = time.monotonic() - refused_since
                    if lasted >= self.lost_after_s and refusals > needed:
                        return RayHeadGone(
                            f"the Ray head at {address} refused connections for "
                            f"{self.lost_after_s:.0f} s: the cluster is gone; restart it and "
                            "run again"
                        )
            else:
                refused_since, refusals = None, 0
            self._ended.wait(self.every_s)
        return None
