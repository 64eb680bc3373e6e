"""The sandbox against a hostile program that knows its mechanics (issue 10 §5).

Memory the address-space limit does not count, the new mount API, capabilities, signals to
the namespace's PID 1, forged status reports, setup failures, a caller that is a child
subreaper, ``sys.executable`` inside, a Python installed under ``/tmp``, and the user-namespace
mode run for real by an unprivileged user (uid 65534 through ``setpriv``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import parley.protocols.errors
import parley.scenarios.tools.sandbox as sandbox_module
from parley.scenarios.tools.sandbox import Sandbox, SandboxError, SandboxLimits, isolation

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(isolation() == "rlimits", reason="no namespaces here: rlimits only"),
]
x86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="seccomp is x86_64 only")

# Probes run inside the sandbox; each prints one JSON object. Shared by the root and the
# unprivileged (user-namespace) runs, so both modes are held to the same answers.
PROBE_SYSCALLS = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    result = libc.syscall(nr, *args)
    return [result, ctypes.get_errno() if result < 0 else 0]
out = {
    "open_tree": call(428, -100, b"/usr", 1),           # OPEN_TREE_CLONE
    "move_mount": call(429, -1, b"", -100, b"/tmp", 4),
    "fsopen": call(430, b"tmpfs", 0),
    "fspick": call(433, -100, b"/usr", 0),
    "mount_setattr": call(442, -100, b"/usr", 0, 0, 0),
    "mount": [libc.mount(b"none", b"/usr", None, 32 | 4096, None), ctypes.get_errno()],
    "memfd_create": call(319, b"x", 0),
    "shmget": call(29, 0, 1 << 20, 0o1600),
    "msgget": call(68, 0, 0o1600),
}
header = (ctypes.c_uint32 * 2)(0x20080522, 0)
data = (ctypes.c_uint32 * 6)()
libc.capget(header, data)
out["capabilities"] = list(data)
out["bounding"] = [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1]
out["securebits"] = libc.prctl(27, 0, 0, 0, 0)
try:
    os.memfd_create("hold")
    out["os.memfd_create"] = "created"
except OSError as exc:
    out["os.memfd_create"] = type(exc).__name__
import socket
for name, option in (("SO_SNDBUF", socket.SO_SNDBUF), ("SO_RCVBUFFORCE", 33)):
    try:
        socket.socketpair()[0].setsockopt(socket.SOL_SOCKET, option, 1 << 30)
        out[name] = "set"
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""

PROBE_PID1 = r"""
import os, signal
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGKILL):
    try:
        os.kill(1, sig)
    except OSError:
        pass
print("still here")
"""

PROBE_WRITE_PYTHON = r"""
import os, sys
for target in (os.path.dirname(sys.executable), os.path.dirname(os.__file__)):
    try:
        open(os.path.join(target, "planted.py"), "w").write("owned")
        print("wrote", target)
    except OSError as exc:
        print("refused", type(exc).__name__)
"""


PROBE_FORK_BOMB = r"""
import os, time
children = 0
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    except OSError:
        break
print(children)
"""


def _expect_syscalls_refused(out: dict[str, object]) -> None:
    for name in ("open_tree", "move_mount", "fsopen", "fspick", "mount_setattr", "mount"):
        assert out[name] == [-1, 1], (name, out[name])  # EPERM
    for name in ("memfd_create", "shmget", "msgget"):
        assert out[name] == [-1, 1], (name, out[name])
    assert out["os.memfd_create"] == "PermissionError"
    assert out["SO_SNDBUF"] == out["SO_RCVBUFFORCE"] == "PermissionError"
    assert out["capabilities"] == [0] * 6
    assert out["bounding"] == []


@pytest.fixture
def sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_mb=200))


@x86_64
def test_unaccounted_memory_mount_api_and_capabilities_are_refused(sandbox: Sandbox) -> None:
    result = sandbox.run(PROBE_SYSCALLS)
    assert result.ok, result.stderr
    _expect_syscalls_refused(json.loads(result.stdout))


@x86_64
def test_memfd_cannot_hold_memory_beyond_the_limit(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "import os, mmap\n"
        "held = []\n"
        "try:\n"
        "    for _ in range(8):\n"
        "        fd = os.memfd_create('x')\n"
        "        os.ftruncate(fd, 100 << 20)\n"
        "        with mmap.mmap(fd, 100 << 20) as m:\n"
        "            for i in range(0, 100 << 20, 4096): m[i] = 1\n"
        "        held.append(fd)\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
        "print(len(held) * 100, 'MB held')\n"
    )
    assert result.stdout == "PermissionError\n0 MB held\n", result.stderr


@x86_64
def test_socket_buffers_hold_little_memory(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "import socket\n"
        "held, pairs = 0, []\n"
        "try:\n"
        "    while True:\n"
        "        a, b = socket.socketpair()\n"
        "        pairs.append((a, b))\n"
        "        a.setblocking(False)\n"
        "        try:\n"
        "            while True:\n"
        "                held += a.send(b'x' * 65536)\n"
        "        except BlockingIOError:\n"
        "            pass\n"
        "except OSError:\n"
        "    pass\n"
        "print(held >> 20)\n"
    )
    assert result.ok, result.stderr
    assert int(result.stdout) < 16  # MB queued by one process at its file limit (was ~235)


def test_signals_to_pid_1_do_not_break_the_run(sandbox: Sandbox) -> None:
    result = sandbox.run(PROBE_PID1)
    assert result.ok, result.stderr
    assert result.stdout == "still here\n"


def test_a_forged_memory_flag_does_not_relabel_a_clean_exit(sandbox: Sandbox) -> None:
    code = (
        "import os\nfor fd in range(3, 64):\n    try: os.write(fd, b'M')\n    except OSError: pass"
    )
    result = sandbox.run(code)
    assert (result.ended_by, result.exit_code) == ("exit", 0)
    real = sandbox.run("x = bytearray(1 << 40)")
    assert real.ended_by == "memory"


@pytest.mark.parametrize("output_cap", [64_000, 10])
def test_a_setup_failure_raises_instead_of_blaming_the_code(output_cap: int) -> None:
    limits = SandboxLimits(max_open_files=1 << 40, max_output_bytes=output_cap)  # too many
    with pytest.raises(SandboxError, match="could not set up"):
        Sandbox(limits).run("print('never')")


def test_sys_executable_works_inside(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True,"
        " text=True).stdout.strip())\n"
    )
    assert result.ok, result.stderr
    assert result.stdout == "42\n"


def test_installed_packages_are_hidden(sandbox: Sandbox) -> None:
    hidden = [p for p in sandbox_module._hidden_paths() if os.listdir(p)]
    if not hidden:
        pytest.skip("no non-empty package directory inside the bound paths here")
    result = sandbox.run(f"import os\nprint([os.listdir(p) for p in {hidden!r}])")
    assert result.ok, result.stderr
    assert result.stdout == repr([[] for _ in hidden]) + "\n"


def test_a_caller_that_is_a_child_subreaper_collects_no_zombie() -> None:
    script = textwrap.dedent(
        """
        import ctypes, os
        from parley.scenarios.tools.sandbox import Sandbox, SandboxLimits
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        box = Sandbox(SandboxLimits(wall_seconds=0.5, max_output_bytes=1000))
        ends = [box.run("import time; time.sleep(30)").ended_by,
                box.run("while True: print('x' * 100)").ended_by,
                box.run("import os\\nif os.fork() == 0: os.setsid(); import time; time.sleep(30)"
                        ).ended_by]
        pid = os.getpid()
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        print(ends, len(children))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "['timeout', 'output', 'exit'] 0", out.stderr


def _standalone(python: str, into: Path) -> Path:
    """A copy of the sandbox that ``python`` can import without parley's dependencies."""
    files = {
        "parley/protocols/errors.py": Path(parley.protocols.errors.__file__),
        "parley/scenarios/tools/sandbox.py": Path(sandbox_module.__file__),
        "parley/scenarios/tools/_sandbox_child.py": Path(sandbox_module._CHILD),
    }
    for name, source in files.items():
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    for package in ("parley", "parley/protocols", "parley/scenarios", "parley/scenarios/tools"):
        (into / package / "__init__.py").touch()
    for path in [into, *into.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return into


RUN_PROBES = """
import json, sys
sys.path.insert(0, {root!r})
from parley.scenarios.tools.sandbox import Sandbox, SandboxLimits, isolation
box = Sandbox(SandboxLimits(cpu_seconds=2, wall_seconds=5))
out = {{"isolation": isolation(), "executable": sys.executable}}
for name, code in {probes!r}.items():
    result = box.run(code)
    out[name] = [result.ended_by, result.exit_code, result.stdout, result.stderr[-500:]]
print(json.dumps(out))
"""


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="parley-test-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _run_probes(argv: list[str], root: Path, probes: dict[str, str]) -> dict[str, list[object]]:
    script = RUN_PROBES.format(root=str(root), probes=probes)
    out = subprocess.run(
        [*argv, "-I", "-c", script], capture_output=True, text=True, timeout=90, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_python_installed_under_tmp_runs(world_readable_dir: Path) -> None:
    venv = world_readable_dir / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)], check=True
    )
    root = _standalone(str(venv / "bin" / "python"), world_readable_dir / "src")
    out = _run_probes([str(venv / "bin" / "python")], root, {"hello": "import sys\nprint(42)"})
    assert out["hello"][:3] == ["exit", 0, "42\n"], out


@x86_64
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become uid 65534 with setpriv")
def test_user_namespace_mode_for_real_as_an_unprivileged_user(world_readable_dir: Path) -> None:
    setpriv = shutil.which("setpriv")
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else None
    if setpriv is None or python is None:
        pytest.skip("needs setpriv and a system /usr/bin/python3 that uid 65534 can run")
    nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python]
    probe = subprocess.run([*nobody, "-I", "-c", "print(1)"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot run {python}: {probe.stderr[-200:]!r}")
    root = _standalone(python, world_readable_dir / "src")
    probes = {
        "syscalls": PROBE_SYSCALLS,
        "pid1": PROBE_PID1,
        "write_python": PROBE_WRITE_PYTHON,
        "whoami": "import os\nprint(os.getuid(), os.getpid())",
        "fork_bomb": PROBE_FORK_BOMB,
    }
    out = _run_probes(nobody, root, probes)
    if out["isolation"] != "userns":
        pytest.skip(f"the kernel refuses user namespaces to uid 65534 ({out['isolation']})")
    for name in probes:
        assert out[name][:2] == ["exit", 0], (name, out[name])
    _expect_syscalls_refused(json.loads(str(out["syscalls"][2])))
    assert out["pid1"][2] == "still here\n"
    assert "wrote" not in str(out["write_python"][2])
    assert out["whoami"][2] == "0 2\n"  # root of its own user namespace, PID 2 under the reaper
    assert int(str(out["fork_bomb"][2])) < 16  # RLIMIT_NPROC, counted in the run's namespace


CONTAINER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        os._exit(3)
    os.write(ready_w, b"x")
    os.read(go_r, 1)
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.execv(sys.executable, [sys.executable, "-I", "-c", sys.argv[1]])
os.read(ready_r, 1)
for name in ("uid_map", "gid_map"):  # root of a container: ids 0-65535 map to 100000-165535
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write("0 100000 65536\\n")
os.write(go_w, b"x")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""

CONCURRENT_RUNS = """
import sys, threading, time
sys.path.insert(0, {root!r})
from parley.scenarios.tools.sandbox import Sandbox, SandboxLimits, isolation
box = Sandbox(SandboxLimits(wall_seconds=6))
out = {{}}
def bomb():
    out["bomb"] = box.run({bomb!r}).stdout.strip()
thread = threading.Thread(target=bomb)
thread.start()
time.sleep(1.0)
out["other"] = box.run({other!r}).stdout.strip()
thread.join()
print(isolation(), out["bomb"], out["other"])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to write a user namespace's id map")
def test_runs_in_a_container_with_a_partial_uid_map_do_not_share_a_process_cap(
    world_readable_dir: Path,
) -> None:
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("needs a system /usr/bin/python3 that a container's root can run")
    root = _standalone(python, world_readable_dir / "src")
    bomb = PROBE_FORK_BOMB.replace("print(children)", "print(children, flush=True)\ntime.sleep(3)")
    other = (
        "import os, time\npids = []\nfor _ in range(5):\n    pid = os.fork()\n"
        "    if pid == 0:\n        time.sleep(0.2)\n        os._exit(0)\n    pids.append(pid)\n"
        "[os.waitpid(p, 0) for p in pids]\nprint('forked', len(pids))"
    )
    script = CONCURRENT_RUNS.format(root=str(root), bomb=bomb, other=other)
    out = subprocess.run(
        [python, "-I", "-c", CONTAINER, script], capture_output=True, text=True, timeout=60
    )
    if out.returncode == 3:
        pytest.skip("the kernel refuses to create a user namespace here")
    assert out.returncode == 0, out.stderr
    mode, bombed, other_said = out.stdout.strip().split(maxsplit=2)
    assert mode == "namespaces"
    assert int(bombed) < 16
    assert other_said == "forked 5"


def test_empty_files_cannot_pin_kernel_memory(sandbox: Sandbox) -> None:
    """Directories take no tmpfs size, yet each pins kernel memory: a run making them until
    its wall limit held 2.1 GB of slab and took ~3 s to tear down. The tmpfs has
    ``max_files`` inodes; the next mkdir fails with ENOSPC (28)."""
    result = sandbox.run(
        "import os\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        os.mkdir(f'/tmp/d{n}')\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print(n, e.errno)\n"
    )
    assert result.ok, result.stderr
    made, errno = map(int, result.stdout.split())
    assert made < SandboxLimits().max_files
    assert errno == 28
