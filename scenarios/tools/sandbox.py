"""Run untrusted Python in a separate, confined process.

:class:`Sandbox` runs a program (``main.py`` plus any other files) with ``python -I -S`` in a
fresh work directory and returns a :class:`SandboxResult` saying how it ended. Limits, each
enforced by the kernel or by the parent:

========================  ==================================================================
CPU time                  ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL one second later)
wall time                 the parent kills the whole process group at the deadline, which
                          moves by the time the run waited for a CPU (below)
memory                    ``RLIMIT_AS`` (allocation fails with ``MemoryError``)
output                    stdout and stderr read with a cap; the parent kills at the cap
processes                 ``RLIMIT_NPROC`` (what it counts depends on the mode; below)
disk                      the work directory is a tmpfs of ``disk_mb`` and ``max_files``
                          inodes (``"namespaces"``); ``RLIMIT_FSIZE``
open files                ``RLIMIT_NOFILE``
========================  ==================================================================

``RLIMIT_NPROC`` counts the processes of a uid. Run as root (``"namespaces"``, or
``"rlimits"`` as root), the code gets a uid used by this run only, so the limit is the run's
own. In ``"userns"`` the code keeps the caller's uid (uid 0 inside its user namespace): on
Linux 5.14 and later the kernel counts processes per user namespace, so the limit is about
this run's; on older kernels it counts all the caller's processes. In ``"rlimits"`` without
root the limit is raised by the caller's process count at the start of the run, so the run
gets about ``max_processes`` more than the caller had then (a bound shared with whatever the
caller starts or ends meanwhile).

Isolation, detected once per process (:func:`isolation`), strongest first:

``"namespaces"`` (running as root with ``unshare``): new mount, network, PID, IPC and UTS
    namespaces; a new root file system (read-only system libraries and Python with its
    ``site-packages`` covered, ``/work``, ``/tmp``, ``/dev/null``...) entered with
    ``pivot_root``, the host's root detached; the code runs as an unprivileged uid drawn at
    random per run (from the ids the caller's user namespace maps; ``nobody`` where it maps
    too few), with ``no_new_privs``. No network (only a down loopback), no host file visible
    except the read-only system directories (``/usr``, ``/lib*``, ``/bin``, ``/sbin``) and the
    Python installation, no signal to host processes; when the run ends the kernel kills
    everything left in its PID namespace.
``"userns"`` (not root, user namespaces allowed): the same, inside a user namespace; the
    code is uid 0 there (the caller's uid outside) with no capability at all, and the
    namespace's PID 1 handles no signal, so the code cannot stop it.
``"rlimits"`` (neither): resource limits and the seccomp filter only. The code can read
    (and, without root, write) what the caller can, so :class:`Sandbox` refuses to start
    unless created with ``allow_weak=True``.

In every mode the code has no capability (empty bounding set, locked securebits) and, on
x86_64, a seccomp filter (classic BPF, built with ``ctypes``) refuses ``ptrace``, ``mount``
and the new mount API, ``unshare``/``setns`` and ``clone`` with namespace flags, ``bpf``,
``perf_event_open``, ``userfaultfd``, the key and module syscalls, ``io_uring``, memory that
``RLIMIT_AS`` does not count (``memfd_create``, SysV shared memory and queues), access to
other processes' memory and descriptors, and every socket but ``AF_UNIX`` (so the
``"rlimits"`` fallback has no network either), and kills a process that uses another syscall
ABI. The program gets no stdin; files it writes are discarded with its directory. A failure
of the sandbox itself raises :class:`SandboxError`.

Load does not decide how a run ends. The wall limit counts the run's own time, not the
machine's: time a process of the run spent runnable but waiting for a CPU (the scheduler's
run-queue wait, ``/proc/PID/schedstat``) moves the deadline, up to :data:`MAX_QUEUE_FACTOR`
times the limit; a program that sleeps still ends at the limit. And a parent paused past the
deadline (SIGSTOP, a swapped-out host) reads what the run wrote before it judges a timeout, so
a run that finished meanwhile is not reported as timed out. Each run costs about 0.1 s (process
start, mounts, interpreter start). The README states what each mode guarantees, as measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from parley.protocols.errors import ParleyError

__all__ = [
    "EndedBy",
    "Isolation",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "isolation",
]

EndedBy = Literal["exit", "timeout", "cpu", "memory", "output", "signal"]
Isolation = Literal["namespaces", "userns", "rlimits"]

_CHILD = Path(__file__).with_name("_sandbox_child.py")
QUEUE_READ_S = 0.25
"""How often the run-queue wait of a running run is read (a scan of ``/proc``, ~ms)."""
MAX_QUEUE_FACTOR = 4.0
"""How far run-queue wait may move a run's wall deadline, in multiples of its wall limit: a
loaded machine gets a run up to 5x its limit in wall time, and no run waits longer."""
_UNSHARE = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")
# Sandbox uids are drawn from a range no real account uses, one per run, so that
# RLIMIT_NPROC counts only that run's processes.
_UID_BASE, _UID_SPAN = 200_000, 800_000


class SandboxError(ParleyError):
    """The sandbox itself failed (could not start or set up); not the code's fault."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run. Validated at construction."""

    cpu_seconds: int = 5
    """CPU seconds (user + system) before SIGXCPU."""
    wall_seconds: float = 10.0
    """Wall-clock seconds before the parent kills the run."""
    memory_mb: int = 256
    """Address-space limit; Python itself needs about 30 MB."""
    max_processes: int = 16
    """Processes (and threads) the run's uid may have at once."""
    max_output_bytes: int = 64_000
    """Bytes kept per stream (stdout, stderr); the run is killed beyond it."""
    disk_mb: int = 16
    """Size of the tmpfs holding the new root and the work directory."""
    max_files: int = 4096
    """Inodes (files, directories, links) of that tmpfs: empty ones take no size, yet each
    pins kernel memory (a run making directories until its wall limit held 2.1 GB of slab
    and took ~3 s to tear down)."""
    max_open_files: int = 64
    """File descriptors per process."""

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive")


@dataclass(frozen=True)
class SandboxResult:
    """How one run ended and what it printed."""

    ended_by: EndedBy
    """``exit`` (the program ended by itself; see ``exit_code``), ``timeout`` (wall time),
    ``cpu`` (CPU time), ``memory`` (died of ``MemoryError``), ``output`` (printed more than
    the cap), ``signal`` (killed by another signal; see ``signal``)."""
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration: float
    """Wall seconds from start to end."""
    cpu_seconds: float
    """CPU seconds of the program (0.0 when the run was killed before it reported)."""
    queued_seconds: float = 0.0
    """Longest time one of the run's processes waited for a CPU while runnable (machine load,
    not the program's doing); ``duration - queued_seconds`` is the run's own wall time."""

    @property
    def own_seconds(self) -> float:
        """Wall seconds the run took that were not spent waiting for a CPU."""
        return max(0.0, self.duration - self.queued_seconds)

    @property
    def ok(self) -> bool:
        """True when the program exited by itself with status 0."""
        return self.ended_by == "exit" and self.exit_code == 0


@cache
def isolation() -> Isolation:
    """The strongest isolation this machine allows (probed once per process)."""
    unshare = shutil.which("unshare")
    if unshare is None or sys.platform != "linux":
        return "rlimits"
    candidates: list[tuple[Isolation, list[str]]] = []
    if os.geteuid() == 0:
        candidates.append(("namespaces", [unshare, *_UNSHARE]))
    candidates.append(("userns", [unshare, "--user", "--map-root-user", *_UNSHARE]))
    for level, argv in candidates:
        probe = subprocess.run(
            [*argv, "true"], capture_output=True, timeout=10, check=False, env={}
        )
        if probe.returncode == 0:
            return level
    return "rlimits"


def _python() -> str:
    """The interpreter the sandbox runs: the real file behind ``sys.executable`` (a venv's
    ``bin/python`` is a link outside the new root; the real one is bound inside, so
    ``sys.executable`` works there)."""
    return os.path.realpath(sys.executable)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


@cache
def _bind_paths() -> tuple[str, ...]:
    """Host paths visible (read-only) inside the new root: system libraries and Python."""
    paths = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"]
    for extra in (sys.base_prefix, os.path.dirname(_python())):
        real = os.path.realpath(extra)
        if not _under(real, paths):
            paths.append(real)
    return tuple(p for p in paths if os.path.lexists(p))


@cache
def _hidden_paths() -> tuple[str, ...]:
    """Directories inside the bound paths that the code must not see, covered by empty
    mounts: every installed-packages directory of the Python installations there (the code
    runs with ``-I -S`` and needs none) and parley itself, with its task data and answers."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, "/usr", "/usr/local"}
    candidates = [str(Path(__file__).resolve().parents[2])]  # the parley package's root
    for prefix in sorted(prefixes):
        for lib in ("lib", "lib64"):
            for name in ("site-packages", "dist-packages"):
                candidates += [f"{prefix}/{lib}/{version}/{name}", f"{prefix}/{lib}/python3/{name}"]
    binds = [os.path.realpath(p) for p in _bind_paths() if not os.path.islink(p)]
    needed = [_python(), os.path.dirname(os.__file__)]  # the interpreter and its stdlib
    hidden: list[str] = []
    for path in candidates:
        real = os.path.realpath(path)
        if (
            os.path.isdir(real)
            and _under(real, binds)
            and real not in binds
            and not any(_under(n, [real]) for n in needed)
            and real not in hidden
        ):
            hidden.append(real)
    return tuple(hidden)


class Sandbox:
    """Runs untrusted Python programs under :class:`SandboxLimits`.

    One instance can run many programs, one or several at a time (each run has its own
    process, directory and uid). ``allow_weak=True`` permits the ``"rlimits"`` fallback,
    which does not isolate the file system or the network.
    """

    def __init__(self, limits: SandboxLimits | None = None, *, allow_weak: bool = False) -> None:
        self.limits = limits or SandboxLimits()
        self.isolation: Isolation = isolation()
        self.queued_seconds = 0.0
        """Run-queue wait of every run so far (:attr:`SandboxResult.queued_seconds` summed):
        what a caller timing its runs by the clock should not charge them."""
        self._lock = threading.Lock()
        if self.isolation == "rlimits" and not allow_weak:
            raise SandboxError(
                "no namespace isolation here (needs util-linux `unshare` and root or user "
                "namespaces); pass allow_weak=True to run with resource limits only"
            )

    def run(self, code: str, *, files: Mapping[str, str] | None = None) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh directory that also holds ``files``.

        ``files`` maps relative paths to text contents (modules ``main.py`` may import).
        Raises :class:`SandboxError` only when the sandbox could not run the program.
        """
        stage = Path(tempfile.mkdtemp(prefix="parley-sandbox-"))
        try:
            work = stage / "work"
            work.mkdir()
            for name, text in {**(files or {}), "main.py": code}.items():
                target = (work / name).resolve()
                if not target.is_relative_to(work.resolve()):
                    raise ValueError(f"file name {name!r} leaves the work directory")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
            result = self._run_staged(stage)
            with self._lock:
                self.queued_seconds += result.queued_seconds
            return result
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _config(self, stage: Path, status_fd: int) -> tuple[list[str], dict[str, object]]:
        limits = self.limits
        nproc = limits.max_processes
        uid: int | None = None
        if os.geteuid() == 0:
            uid = _sandbox_uid()
        elif self.isolation == "rlimits":
            # Without our own uid, NPROC counts every process of the caller's uid.
            nproc += _count_processes(os.getuid())
        config: dict[str, object] = {
            "status_fd": status_fd,
            "uid": uid,
            "gid": uid,
            "disk_mb": limits.disk_mb,
            "max_files": limits.max_files,
            "binds": list(_bind_paths()),
            "hide": list(_hidden_paths()),
            "limits": {
                "cpu": limits.cpu_seconds,
                "memory": limits.memory_mb << 20,
                "nproc": nproc,
                "fsize": limits.disk_mb << 20,
                "nofile": limits.max_open_files,
            },
        }
        python = [_python(), "-I", "-S", str(_CHILD)]
        if self.isolation == "rlimits":
            config.update(root=None, workdir=str(stage / "work"))
            if uid is not None:
                stage.chmod(0o711)  # the run's uid must pass through to its work directory
                os.chown(stage / "work", uid, uid)
                for path in (stage / "work").rglob("*"):
                    os.chown(path, uid, uid)
            return python, config
        (stage / "root").mkdir()
        config.update(root=str(stage / "root"), stage=str(stage / "work"), workdir="/work")
        unshare = [shutil.which("unshare") or "unshare", *_UNSHARE]
        if self.isolation == "userns":
            unshare[1:1] = ["--user", "--map-root-user"]
            config.update(uid=None, gid=None)
        return [*unshare, *python], config

    def _run_staged(self, stage: Path) -> SandboxResult:
        status_r, status_w = os.pipe()
        argv, config = self._config(stage, status_w)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [*argv, json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w,),
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/work"},
                cwd=stage,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(status_r)
            raise SandboxError(f"could not start the sandbox: {exc}") from exc
        finally:
            os.close(status_w)
        try:
            streams, killed_for = self._collect(proc, status_r, start)
        finally:
            _stop(proc)
            os.close(status_r)
        return self._result(streams, killed_for, time.monotonic() - start)

    def _collect(
        self, proc: subprocess.Popen[bytes], status_r: int, start: float
    ) -> tuple[_Streams, EndedBy | None]:
        """Read stdout, stderr and the status pipe until the run ends or must be killed."""
        if proc.stdout is None or proc.stderr is None:
            raise SandboxError("the sandbox process has no output pipes")
        cap = self.limits.max_output_bytes
        streams = _Streams()
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ, "stdout")
        selector.register(proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
        selector.register(status_r, selectors.EVENT_READ, "status")
        limit = self.limits.wall_seconds
        deadline = start + limit
        read_at = start  # when the run-queue wait was last read
        try:
            while selector.get_map():
                now = time.monotonic()
                if now - read_at >= QUEUE_READ_S or now >= deadline:
                    # The run's time is its own, not the load's: the deadline moves by the
                    # time the run waited for a CPU (read every QUEUE_READ_S of a longer run).
                    # The run's processes are looked up in /proc (ms) at the first read and
                    # at each deadline; between, only their own counters are read (µs).
                    if not streams.pids or now >= deadline:
                        streams.pids = _session_pids(proc.pid)
                    read_at = now
                    streams.queued = max(streams.queued, _queued_seconds(streams.pids))
                    deadline = start + limit + min(streams.queued, MAX_QUEUE_FACTOR * limit)
                remaining = deadline - now
                # Past the deadline, what is already written is read first: a parent paused
                # past it (SIGSTOP) must not call a run that ended meanwhile a timeout.
                ready = selector.select(min(max(remaining, 0.0), QUEUE_READ_S))
                if not ready and remaining <= 0:
                    return streams, "timeout"
                for key, _ in ready:
                    data = os.read(key.fd, 65536)
                    buf: bytearray = getattr(streams, key.data)
                    if not data:
                        selector.unregister(key.fd)
                        if key.data == "status" and buf:
                            # The report is in; leftovers holding the pipes get a moment.
                            deadline = min(deadline, time.monotonic() + 0.5)
                        continue
                    buf += data
                    if key.data != "status" and len(buf) > cap:
                        del buf[cap:]
                        streams.truncated.add(key.data)
                        return streams, "output"
            return streams, None
        finally:
            selector.close()

    def _result(
        self, streams: _Streams, killed_for: EndedBy | None, duration: float
    ) -> SandboxResult:
        status_text = streams.status.decode(errors="replace").strip()
        stdout = streams.stdout.decode(errors="replace")
        stderr = streams.stderr.decode(errors="replace")
        report: dict[str, Any] = {}
        if status_text:
            report = json.loads(status_text.splitlines()[-1])
        elif killed_for is None:
            raise SandboxError(f"the sandbox ended without a report; its stderr: {stderr[-2000:]}")
        if "setup_error" in report:
            raise SandboxError(f"the sandbox could not set up the run: {report['setup_error']}")
        exit_code: int | None = None
        signum: int | None = None
        ended_by: EndedBy = killed_for or "exit"
        cpu = float(report.get("cpu", 0.0))
        if report:
            status = int(report["status"])
            if os.WIFEXITED(status):
                exit_code = os.WEXITSTATUS(status)
            elif os.WIFSIGNALED(status):
                signum = os.WTERMSIG(status)
            if killed_for is None:
                # Only a run that died of its error (exit 1) can have died of MemoryError:
                # the flag's pipe is the code's to write, but not its exit status to relabel.
                if report.get("memory") and exit_code == 1:
                    ended_by = "memory"
                elif signum == signal.SIGXCPU or (
                    signum == signal.SIGKILL and cpu >= self.limits.cpu_seconds
                ):
                    ended_by = "cpu"
                elif signum is not None:
                    ended_by = "signal"
        return SandboxResult(
            ended_by=ended_by,
            exit_code=exit_code,
            signal=signum,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated="stdout" in streams.truncated,
            stderr_truncated="stderr" in streams.truncated,
            duration=duration,
            cpu_seconds=cpu,
            queued_seconds=min(streams.queued, duration),
        )


@dataclass
class _Streams:
    """Bytes read so far from the run's stdout, stderr and status pipe."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    status: bytearray = field(default_factory=bytearray)
    queued: float = 0.0
    """Longest run-queue wait of the run's processes, as last read (seconds)."""
    pids: list[int] = field(default_factory=list)
    """The run's processes as last looked up."""
    truncated: set[str] = field(default_factory=set)


def _session_pids(session: int) -> list[int]:
    """The live processes of ``session`` (``/proc/PID/stat``; a scan of ``/proc``)."""
    pids = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    if int(stat.read().rsplit(b")", 1)[1].split()[3]) == session:
                        pids.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue  # the process ended meanwhile
    return pids


def _queued_seconds(pids: list[int]) -> float:
    """Longest time one of ``pids`` has spent runnable but waiting for a CPU (run-queue
    wait, ``/proc/PID/schedstat``): the maximum, not the sum, so forking more waiting
    processes buys a run no more time. 0.0 where the kernel does not report it (no
    ``CONFIG_SCHED_INFO``): the plain limit."""
    longest = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as sched:
                longest = max(longest, int(sched.read().split()[1]))
        except (OSError, ValueError, IndexError):
            continue  # the process ended meanwhile, or the kernel has no schedstat
    return longest / 1e9


def _sandbox_uid() -> int:
    """An id (uid and gid) for one run, drawn at random so that concurrent runs do not share
    a process cap: from 200,000-999,999 where the whole range is mapped (root on the host),
    else from 20,000-65,533 where a container maps that (the usual ``0 100000 65536``),
    else ``nobody`` (65534), shared by every run."""
    mapped = _intersect(_id_map("/proc/self/uid_map"), _id_map("/proc/self/gid_map"))
    for pool in ((_UID_BASE, _UID_BASE + _UID_SPAN), (20_000, 65_534)):
        usable = _intersect(mapped, [pool])
        total = sum(high - low for low, high in usable)
        if total >= 1000:
            pick = secrets.randbelow(total)
            for low, high in usable:
                if pick < high - low:
                    return low + pick
                pick -= high - low
    return 65534


def _id_map(path: str) -> list[tuple[int, int]]:
    """The ids mapped in this user namespace, as ``[low, high)`` ranges."""
    try:
        rows = [line.split() for line in Path(path).read_text().splitlines()]
        return [(int(r[0]), int(r[0]) + int(r[2])) for r in rows if len(r) == 3]
    except (OSError, ValueError):
        return []


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    pairs = [(max(x[0], y[0]), min(x[1], y[1])) for x in a for y in b]
    return [(low, high) for low, high in pairs if low < high]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the run and reap it, leaving no zombie even to a caller that is a child subreaper.

    The namespace's PID 1 is killed first, so that ``unshare`` (our child) reaps it and
    exits; killing ``unshare`` first would re-parent PID 1 to the nearest subreaper, which
    may be our caller. Then the whole process group goes (the weak mode's leftovers)."""
    if proc.poll() is None:
        for pid in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (Linux /proc; none where it cannot be read)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _count_processes(uid: int) -> int:
    """Processes whose real uid is ``uid`` (Linux /proc; 0 where /proc is absent)."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    count += int(line.split()[1]) == uid
                    break
        except OSError:
            continue  # the process ended while we looked
    return count
