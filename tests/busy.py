"""A busy machine on demand, for tests of what must hold under load: busy-loop processes
on the cores and a loop of SIGSTOP/SIGCONT pauses of a process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` (resumed first, in case it is paused) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def spin() -> subprocess.Popen[bytes]:
    """A busy-loop process in a session of its own, as another job on the machine would be
    (with autogroup scheduling, loops in the test's session would share one group's time)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


@contextlib.contextmanager
def busy_cores(per_core: int = 1) -> Iterator[None]:
    """``per_core`` busy-loop processes on every core for the duration of the block."""
    hogs = [spin() for _ in range(per_core * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for hog in hogs:
            stop(hog)


@contextlib.contextmanager
def pausing(
    pid: int,
    pauses: Sequence[float],
    *,
    running: float = 1.0,
    start: Callable[[], bool] | None = None,
) -> Iterator[list[float]]:
    """Pause process ``pid`` (SIGSTOP) for each of ``pauses`` seconds in turn, letting it run
    ``running`` seconds between pauses, until the block ends; yields the pauses made. With
    ``start``, the first pause waits until ``start()`` is true (e.g. the run plays). The
    process is always resumed, whatever happens."""
    done = threading.Event()
    made: list[float] = []

    def loop() -> None:
        while start is not None and not start():
            if done.wait(0.05):
                return
        for i in range(1_000_000):
            if done.wait(running):
                return
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                return
            try:
                made.append(pauses[i % len(pauses)])
                done.wait(pauses[i % len(pauses)])
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield made
    finally:
        done.set()
        thread.join()


def finish(proc: subprocess.Popen[bytes], what: str, timeout: float) -> tuple[str, str]:
    """Wait for ``proc`` (killed if it runs past ``timeout`` s: only against a hang); its
    stdout and stderr. Fails unless it exits 0, with the end of its stderr."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop(proc)
    said = (err or b"").decode(errors="replace")
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{said[-4000:]}"
    return (out or b"").decode(errors="replace"), said
