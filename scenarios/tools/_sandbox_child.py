"""The sandbox's inside half: runs as ``python -I -S _sandbox_child.py CONFIG_JSON``.

Pure standard library on purpose: it runs with ``-I -S`` (no site-packages, no user
environment), so it must not import parley. :mod:`parley.scenarios.tools.sandbox` starts it,
normally under ``unshare`` (new mount, network, PID, IPC and UTS namespaces), where this
process is PID 1 of the new PID namespace. It then

1. builds a fresh root: a size-limited tmpfs holding an empty ``/tmp``, the work directory
   ``/work`` (the caller's files copied in), read-only bind mounts of the system libraries
   and the Python installation (its ``site-packages`` covered by empty read-only mounts)
   and a few device nodes, and ``pivot_root``\\ s into it and detaches the old root, so
   nothing else of the host file system is reachable;
2. forks the worker, which empties its capability bounding set and locks the securebits
   (when it is root, in the host or in a user namespace), drops to the unprivileged sandbox
   uid (when started as root) and clears its capabilities, sets ``PR_SET_NO_NEW_PRIVS``,
   the resource limits and the seccomp filter, and runs ``/work/main.py``;
3. reaps every process the namespace orphans until the worker ends, then writes one JSON
   line to the status pipe: the worker's raw wait status, its CPU seconds and whether it
   died of ``MemoryError`` (or why the setup failed). This PID 1 handles no signal, so the
   code cannot signal it (a PID namespace's init only gets the signals it handles). When it
   exits, the kernel kills every process left in the namespace (fork-bomb leftovers too).

Without ``config["root"]`` (the weak fallback, no namespaces) step 1 is skipped.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import runpy
import shutil
import signal
import sys
import traceback
from pathlib import Path

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
# pivot_root has no glibc wrapper; the syscall number depends on the architecture.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _bind(source: str, target: str, *, readonly: bool, nodev: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (MS_RDONLY if readonly else 0)
    _mount(None, target, None, flags | (MS_NODEV if nodev else 0))


def build_root(config: dict[str, object]) -> None:
    """Mount the new root at ``config["root"]`` and pivot into it (we are in a new mount ns)."""
    root = str(config["root"])
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    size = f"size={config['disk_mb']}m,nr_inodes={config['max_files']}"
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0755")
    # /tmp and /work first: a Python installed under either is then bound inside them.
    os.mkdir(root + "/tmp", mode=0o777)
    os.chmod(root + "/tmp", 0o1777)
    work = root + "/work"
    shutil.copytree(str(config["stage"]), work)
    uid, gid = config.get("uid"), config.get("gid")
    if isinstance(uid, int) and isinstance(gid, int):
        for directory, _dirs, files in os.walk(work):
            os.chown(directory, uid, gid)
            for name in files:
                os.chown(os.path.join(directory, name), uid, gid)
    os.chmod(work, 0o700)
    for path in config["binds"]:  # type: ignore[attr-defined]
        target = root + path
        if os.path.islink(path):
            # /lib -> usr/lib on merged-/usr systems: recreate the link, its target is bound.
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path):
            os.makedirs(target, mode=0o755, exist_ok=True)
            _bind(path, target, readonly=True, nodev=True)
    for path in config.get("hide", []):  # type: ignore[attr-defined]
        # An empty read-only tmpfs over installed packages (parley and its task data among them).
        _mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
    os.makedirs(root + "/dev", mode=0o755, exist_ok=True)
    for device in ("null", "zero", "urandom", "random"):
        target = f"{root}/dev/{device}"
        Path(target).touch()  # an empty mount point
        _bind(f"/dev/{device}", target, readonly=False, nodev=False)
    # pivot_root (not chroot): with the old root detached there is no path back to the host.
    os.chdir(root)
    os.mkdir(".oldroot")
    machine = os.uname().machine
    _check(_libc.syscall(SYS_PIVOT_ROOT[machine], b".", b".oldroot"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.oldroot", MNT_DETACH), "umount old root")
    os.rmdir("/.oldroot")
    _mount(None, "/", None, MS_REMOUNT | MS_NOSUID | MS_NODEV)


# --- capabilities: none left, none to regain through exec ------------------------------------

PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# SECBIT_NOROOT (+ locked), SECBIT_KEEP_CAPS_LOCKED (off), SECBIT_NO_CAP_AMBIENT_RAISE (+ locked)
SECUREBITS = 0x01 | 0x02 | 0x20 | 0x40 | 0x80
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_bounding_set() -> None:
    """Empty the bounding set and lock the securebits, so that no exec (of a setuid or
    file-capability binary, or by root) regains a capability. Needs CAP_SETPCAP: call it
    while still root."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if cap == 0 or ctypes.get_errno() != 22:  # EINVAL: past the last capability
        _check(-1, f"prctl(PR_CAPBSET_DROP, {cap})")
    _check(_libc.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0), "prctl(PR_SET_SECUREBITS)")


def clear_capabilities() -> None:
    """Clear the effective, permitted, inheritable and ambient sets of this process."""
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before Linux 4.3
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


# --- seccomp: a classic-BPF syscall filter, installed after no_new_privs ----------------------

AUDIT_ARCH_X86_64 = 0xC000003E
RET_ALLOW, RET_KILL = 0x7FFF0000, 0x80000000
RET_ERRNO = 0x00050000
EPERM, EACCES, ENOSYS = 1, 13, 38
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
# Syscalls nobody's test code needs and that widen the kernel's attack surface (x86_64).
DENIED = {
    101: "ptrace", 165: "mount", 166: "umount2", 155: "pivot_root", 161: "chroot",
    272: "unshare", 308: "setns", 321: "bpf", 298: "perf_event_open", 323: "userfaultfd",
    248: "add_key", 249: "request_key", 250: "keyctl", 246: "kexec_load",
    175: "init_module", 313: "finit_module", 176: "delete_module",
    425: "io_uring_setup", 426: "io_uring_enter", 427: "io_uring_register",
    # the new mount API: a mount made writable or moved over the host's files
    428: "open_tree", 429: "move_mount", 430: "fsopen", 431: "fsconfig", 432: "fsmount",
    433: "fspick", 442: "mount_setattr", 467: "open_tree_attr",
    457: "statmount", 458: "listmount",
    # memory that RLIMIT_AS does not count (memfd pages, SysV segments and queues)
    319: "memfd_create", 447: "memfd_secret", 29: "shmget", 68: "msgget",
    # reaching into other processes (the namespace's PID 1 included) and their files
    310: "process_vm_readv", 311: "process_vm_writev", 312: "kcmp", 438: "pidfd_getfd",
    303: "name_to_handle_at", 304: "open_by_handle_at", 300: "fanotify_init",
    103: "syslog", 163: "acct", 167: "swapon", 168: "swapoff", 169: "reboot",
}  # fmt: skip
SYS_CLONE, SYS_CLONE3, SYS_SOCKET, SYS_SETSOCKOPT = 56, 435, 41, 54
SOL_SOCKET = 1
# SO_SNDBUF, SO_RCVBUF and their FORCE forms: with them one process queued ~235 MB in
# AF_UNIX socket buffers (measured), memory RLIMIT_AS does not see; without, ~5 MB.
SOCKET_BUFFER_OPTIONS = (7, 8, 32, 33)
CLONE_NEW_ANY = 0x7E020080  # CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}
AF_UNIX = 1


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [
        ("len", ctypes.c_ushort),
        ("filter", ctypes.POINTER(_SockFilter)),
    ]


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k): kill other ABIs; EPERM for :data:`DENIED`, for
    socket buffer sizes, for clone with namespace flags and for sockets other than AF_UNIX;
    ENOSYS for clone3 (libc falls back to clone, whose flags the filter can read); allow the
    rest."""
    nr, arch, arg0, arg1, arg2 = 0, 4, 16, 24, 32
    prog = [
        (LD_ABS, 0, 0, arch),
        (JEQ, 1, 0, AUDIT_ARCH_X86_64),
        (RET, 0, 0, RET_KILL),
        (LD_ABS, 0, 0, nr),
        (JGE, 0, 1, 0x40000000),  # the x32 ABI
        (RET, 0, 0, RET_KILL),
    ]
    for number in DENIED:
        prog += [(JEQ, 0, 1, number), (RET, 0, 0, RET_ERRNO | EPERM)]
    prog += [(JEQ, 0, 1, SYS_CLONE3), (RET, 0, 0, RET_ERRNO | ENOSYS)]
    sndbuf, rcvbuf, sndforce, rcvforce = SOCKET_BUFFER_OPTIONS
    prog += [
        (JEQ, 0, 9, SYS_SETSOCKOPT),  # not setsockopt: on to the socket check, nr still loaded
        (LD_ABS, 0, 0, arg1),
        (JEQ, 0, 6, SOL_SOCKET),
        (LD_ABS, 0, 0, arg2),
        (JEQ, 3, 0, sndbuf),
        (JEQ, 2, 0, rcvbuf),
        (JEQ, 1, 0, sndforce),
        (JEQ, 0, 1, rcvforce),
        (RET, 0, 0, RET_ERRNO | EPERM),
        (RET, 0, 0, RET_ALLOW),
    ]
    prog += [
        (JEQ, 0, 3, SYS_SOCKET),
        (LD_ABS, 0, 0, arg0),
        (JEQ, 1, 0, AF_UNIX),
        (RET, 0, 0, RET_ERRNO | EACCES),
        (LD_ABS, 0, 0, nr),
        (JEQ, 0, 3, SYS_CLONE),
        (LD_ABS, 0, 0, arg0),
        (JSET, 0, 1, CLONE_NEW_ANY),
        (RET, 0, 0, RET_ERRNO | EPERM),
        (RET, 0, 0, RET_ALLOW),
    ]
    return prog


def install_seccomp() -> bool:
    """Install :func:`seccomp_program` on x86_64 Linux; False where it does not apply."""
    if os.uname().machine != "x86_64":
        return False
    prog = seccomp_program()
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    pr_set_seccomp, seccomp_mode_filter = 22, 2
    _check(_libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0), "seccomp")
    return True


def _set_limits(limits: dict[str, int]) -> None:
    pairs = {
        resource.RLIMIT_CPU: (limits["cpu"], limits["cpu"] + 1),
        resource.RLIMIT_AS: (limits["memory"], limits["memory"]),
        resource.RLIMIT_NPROC: (limits["nproc"], limits["nproc"]),
        resource.RLIMIT_FSIZE: (limits["fsize"], limits["fsize"]),
        resource.RLIMIT_NOFILE: (limits["nofile"], limits["nofile"]),
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in pairs.items():
        resource.setrlimit(which, (soft, hard))


def run_worker(config: dict[str, object], setup_fd: int, memory_fd: int) -> None:
    """Drop privileges, set limits, run ``main.py``; never returns. A setup failure is
    written to ``setup_fd`` (closed before the code runs, so the code cannot fake one), a
    ``MemoryError`` to ``memory_fd`` as ``M``."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in any Python program
        uid, gid = config.get("uid"), config.get("gid")
        if os.geteuid() == 0:
            drop_bounding_set()
        if isinstance(uid, int) and isinstance(gid, int):
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        clear_capabilities()
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _set_limits(config["limits"])  # type: ignore[arg-type]
        install_seccomp()
        os.chdir(str(config["workdir"]))
        sys.path.insert(0, os.getcwd())
        sys.argv = ["main.py"]
        low, high = sorted((setup_fd, memory_fd))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 16)
        os.close(setup_fd)  # the last step: from here on, failures are the code's
    except BaseException as exc:  # the sandbox's failure, not the code's: tell the parent
        os.write(setup_fd, repr(exc)[:1000].encode(errors="replace"))
        os._exit(1)
    try:
        runpy.run_path("main.py", run_name="__main__")
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except MemoryError:
        os.write(memory_fd, b"M")
        try:
            traceback.print_exc()
        except MemoryError:
            os.write(2, b"MemoryError\n")
    except BaseException:  # untrusted code failed: print its traceback like python would
        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def reap_until(pid: int) -> tuple[int, float]:
    """Reap every child (orphans re-parented to this PID 1 too) until ``pid`` ends; its raw
    wait status and CPU seconds."""
    while True:
        child, status, usage = os.wait4(-1, 0)
        if child == pid:
            return status, usage.ru_utime + usage.ru_stime


def _peek(fd: int) -> bytes:
    """What is in a pipe now (non-blocking: a grandchild may still hold the write end)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 2048)
    except BlockingIOError:
        return b""


def main(raw: str) -> None:
    # No handler for any signal: the code (same uid in user-namespace mode) cannot signal us.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    config = json.loads(raw)
    status_fd = int(config["status_fd"])
    try:
        if config.get("root"):
            build_root(config)
        else:  # no PID namespace: adopt the orphans ourselves
            _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        setup_r, setup_w = os.pipe()
        memory_r, memory_w = os.pipe()
    except BaseException as exc:
        failed = {"setup_error": repr(exc)[:1000]}
        os.write(status_fd, (json.dumps(failed) + "\n").encode())
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        os.close(setup_r)
        os.close(memory_r)
        os.close(status_fd)
        run_worker(config, setup_w, memory_w)
    os.close(setup_w)
    os.close(memory_w)
    status, cpu = reap_until(pid)
    report: dict[str, object] = {"status": status, "cpu": cpu, "memory": _peek(memory_r) == b"M"}
    failure = _peek(setup_r)  # nobody else ever held this pipe: the worker's own word
    if failure:
        report["setup_error"] = failure.decode(errors="replace")
    os.write(status_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
