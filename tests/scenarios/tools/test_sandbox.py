"""The sandbox contains hostile programs: each test runs one and checks the host is untouched."""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from parley.scenarios.tools.sandbox import (
    Sandbox,
    SandboxError,
    SandboxLimits,
    isolation,
)

pytestmark = pytest.mark.timeout(60)

ISOLATED = isolation() != "rlimits"
needs_isolation = pytest.mark.skipif(
    not ISOLATED, reason="no namespaces here: the sandbox runs with rlimits only"
)


@pytest.fixture
def sandbox() -> Sandbox:
    limits = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_mb=200, max_output_bytes=10_000)
    return Sandbox(limits, allow_weak=True)


def _uids_alive() -> set[int]:
    uids = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            line = next(x for x in status.read_text().splitlines() if x.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        uids.add(int(line.split()[1]))
    return uids


def test_hello_world_runs_with_imports_and_extra_files(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "import helper, json\nprint(json.dumps(helper.VALUE))", files={"helper.py": "VALUE=[1]"}
    )
    assert result.ok, result.stderr
    assert result.stdout == "[1]\n"
    assert not result.stdout_truncated


def test_exit_code_and_exception_are_reported(sandbox: Sandbox) -> None:
    assert sandbox.run("raise SystemExit(3)").exit_code == 3
    failed = sandbox.run("1/0")
    assert failed.ended_by == "exit"
    assert failed.exit_code == 1
    assert "ZeroDivisionError" in failed.stderr


def test_infinite_loop_is_stopped_by_the_cpu_limit() -> None:
    # A wall limit far above the CPU limit: on a loaded machine 2 s of CPU can take more
    # than the fixture's 5 s of wall time, and the wall clock would stop the loop first.
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=60, memory_mb=200)
    result = Sandbox(limits, allow_weak=True).run("while True:\n    pass")
    assert result.ended_by == "cpu"
    assert result.signal == signal.SIGXCPU


def test_sleeping_forever_is_stopped_by_the_wall_clock() -> None:
    sandbox = Sandbox(SandboxLimits(wall_seconds=1.0), allow_weak=True)
    result = sandbox.run("import time\nprint('start', flush=True)\ntime.sleep(60)")
    assert result.ended_by == "timeout"
    assert result.stdout == "start\n"
    assert result.duration < 5


def test_memory_hog_dies_of_memory_error(sandbox: Sandbox) -> None:
    result = sandbox.run("x = bytearray(2 * 1024**3)\nprint('allocated')")
    assert result.ended_by == "memory"
    assert "allocated" not in result.stdout


def test_printing_gigabytes_is_cut_at_the_output_cap(sandbox: Sandbox) -> None:
    result = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert result.ended_by == "output"
    assert result.stdout_truncated
    assert len(result.stdout) == 10_000


@needs_isolation
def test_fork_bomb_is_capped_and_leaves_no_process_behind(sandbox: Sandbox) -> None:
    before = _uids_alive()
    code = (
        "import os\n"
        "children = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            import time; time.sleep(30); os._exit(0)\n"
        "        children += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(children)\n"
    )
    result = sandbox.run(code)
    assert result.ok, result.stderr
    assert int(result.stdout) < 16  # RLIMIT_NPROC stopped it
    assert _uids_alive() <= before  # the sleeping children died with the namespace


@needs_isolation
def test_no_network_even_to_localhost(sandbox: Sandbox) -> None:
    connected = threading.Event()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]

        def accept() -> None:
            try:
                server.accept()[0].close()
                connected.set()
            except OSError:
                pass  # the timeout: nobody came, as expected

        result = sandbox.run(
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('refused', exc)\n"
        )
        accept()
    assert result.ok, result.stderr
    assert result.stdout.startswith("refused")
    assert not connected.is_set()


@needs_isolation
def test_files_outside_the_work_directory_cannot_be_read(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the password")
    secret.chmod(0o644)  # world-readable: only the missing file system view protects it
    result = sandbox.run(
        "import os\n"
        f"for path in [{str(secret)!r}, '/etc/passwd', {str(Path.cwd() / 'pyproject.toml')!r}]:\n"
        "    try:\n"
        "        print(open(path).read())\n"
        "    except OSError as exc:\n"
        "        print('denied', type(exc).__name__)\n"
    )
    assert result.ok, result.stderr
    assert "the password" not in result.stdout
    assert result.stdout.count("denied") == 3


@needs_isolation
def test_files_outside_the_work_directory_cannot_be_deleted(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("alive")
    canary.chmod(0o666)
    tmp_path.chmod(0o777)  # even a world-writable directory stays out of reach
    result = sandbox.run(
        "import os, shutil\n"
        f"for path in [{str(canary)!r}, '/usr/bin/env']:\n"
        "    try:\n"
        "        os.remove(path)\n"
        "        print('deleted', path)\n"
        "    except OSError as exc:\n"
        "        print('denied', type(exc).__name__)\n"
        f"shutil.rmtree({str(tmp_path)!r}, ignore_errors=True)\n"
    )
    assert result.ok, result.stderr
    assert "deleted" not in result.stdout
    assert canary.read_text() == "alive"
    assert Path("/usr/bin/env").exists()


@needs_isolation
def test_the_work_directory_is_fresh_and_writable(sandbox: Sandbox) -> None:
    first = sandbox.run("open('left.txt', 'w').write('x')\nimport os\nprint(os.listdir('.'))")
    second = sandbox.run("import os\nprint(sorted(os.listdir('.')), os.environ.get('PATH'))")
    assert first.ok, first.stderr
    assert "left.txt" not in second.stdout
    assert second.stdout.startswith("['main.py']")


def test_sandbox_refuses_weak_isolation_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    import parley.scenarios.tools.sandbox as module

    monkeypatch.setattr(module, "isolation", lambda: "rlimits")
    with pytest.raises(SandboxError, match="allow_weak"):
        Sandbox()


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="cpu_seconds"):
        SandboxLimits(cpu_seconds=0)


def test_file_names_may_not_leave_the_work_directory(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError, match="leaves"):
        sandbox.run("pass", files={"../escape.py": ""})


def test_runs_leave_no_stage_directory_behind(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    # A private temporary directory: other processes' runs come and go in the shared /tmp.
    tmp_path.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert sandbox.run("print(1)").ok
    assert sandbox.run("import os\nos.fork()\nopen('x', 'w').write('y')").ok
    assert list(tmp_path.iterdir()) == []
    assert os.path.exists("/usr")


@needs_isolation
def test_code_runs_unprivileged(sandbox: Sandbox) -> None:
    result = sandbox.run("import os\nprint(os.getuid(), os.getpid())")
    assert result.ok, result.stderr
    uid, pid = map(int, result.stdout.split())
    assert pid < 10  # its own PID namespace
    if os.geteuid() == 0:
        assert uid != 0


def test_concurrent_runs_do_not_mix(sandbox: Sandbox) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: sandbox.run(f"print({i} * 2)"), range(8)))
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(8)]


def test_seccomp_program_jumps_stay_inside_the_program() -> None:
    from parley.scenarios.tools._sandbox_child import RET, seccomp_program

    program = seccomp_program()
    assert program[-1][0] == RET  # falls through to a verdict
    for i, (code, jt, jf, _k) in enumerate(program):
        if code != RET:
            assert i + 1 + max(jt, jf) < len(program)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is x86_64 only")
def test_seccomp_refuses_namespaces_ptrace_and_inet_but_not_threads_or_fork(
    sandbox: Sandbox,
) -> None:
    code = (
        "import ctypes, os, socket, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
        "print('ptrace', libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n"
        "try:\n"
        "    socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
        "except PermissionError:\n"
        "    print('inet6 refused')\n"
        "a, b = socket.socketpair()\n"
        "t = threading.Thread(target=print, args=('thread',))\n"
        "t.start()\n"
        "t.join()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "print('child', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "print('exec', subprocess.run(['/usr/bin/true']).returncode)\n"
    )
    result = sandbox.run(code)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == [
        "unshare -1 1",
        "ptrace -1 1",
        "inet6 refused",
        "thread",
        "child 7",
        "exec 0",
    ]
