"""A dead engine is a dead backend (issue 12 §1): ``parley serve --backend vllm`` restarts
a killed engine process (bounded), then exits with a clear error instead of answering
``backend_failed`` forever; it notices a death without a request (issue 28 §7), and its
engine processes end with it when it is killed (issue 28 §4). Each test starts one or two
engines: slow, marked ``vllm``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
psutil = pytest.importorskip("psutil")
openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def _wait_for(path: Path, prefix: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"no {prefix!r} line within {timeout} s:\n{path.read_text()[-3000:]}")


def _kill_engine(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the engine processes ``parley serve`` started (the engine core and its
    workers), not multiprocessing's resource tracker, which unlinks the shared memory
    segments a killed engine leaves (killed too, they stayed in /dev/shm)."""
    children = [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "resource_tracker" not in " ".join(p.cmdline())
    ]
    for child in children:
        child.send_signal(signal.SIGKILL)
    psutil.wait_procs(children, timeout=10)
    return len(children)


def _serve(model: Path, out: Path, *options: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(model)]
    cmd += ["--backend", "vllm", "--listen", "tcp://127.0.0.1:0", "-b", "max_model_len=256"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with out.open("wb") as log:
        return subprocess.Popen([*cmd, *options], stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.mark.long  # (~100 s: several engine starts)
def test_a_killed_engine_restarts_then_the_server_exits(tmp_path: Path) -> None:
    from parley.arena.inference.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "serve.log"
    proc = _serve(model, out, "--policy", "tiny", "--http", "127.0.0.1:0", "-b", "max_restarts=1")
    try:
        url = _wait_for(out, "openai api on ", proc, 300)
        client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=300)

        def ask() -> str:
            reply = client.completions.create(model="tiny", prompt="deal", max_tokens=4, seed=1)
            return reply.choices[0].text

        first = ask()
        assert _kill_engine(proc) > 0
        # The first request after the death waits for the restart and is answered.
        assert ask() == first
        assert _kill_engine(proc) > 0
        # Restarts used up: the server exits 1 with the reason, without waiting for a
        # request (the health check notices the death while idle).
        assert proc.wait(60) == 1
        text = out.read_text()
        assert "parley serve: the vLLM engine process died" in text
        assert "restarted 1 times" in text
    finally:
        if proc.poll() is None:
            _kill_engine(proc)  # its engine processes too: they outlive a killed server
            proc.kill()
            proc.wait(30)


# Each starts one or two engines (minutes on 2 cores): CI runs it with `make test-long`.
@pytest.mark.long
def test_an_idle_server_whose_engine_dies_exits_without_a_request(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """No request ever arrives: the health check notices the dead engine, and with no
    restart allowed the server exits 1 with the reason (before: it stayed up, serving
    nothing, until a request came)."""
    out = tmp_path / "serve.log"
    proc = _serve(tiny_model_dir, out, "-b", "max_restarts=0")
    try:
        _wait_for(out, "pool listening on ", proc, 300)
        assert _kill_engine(proc) > 0
        assert proc.wait(60) == 1
        assert "parley serve: the vLLM engine process died" in out.read_text()
    finally:
        if proc.poll() is None:
            _kill_engine(proc)
            proc.kill()
            proc.wait(30)


# Each starts one or two engines (minutes on 2 cores): CI runs it with `make test-long`.
@pytest.mark.long
def test_kill_9_of_the_server_ends_its_engine_also_after_an_idle_restart(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The engine killed while idle is restarted without a request; then SIGKILL of
    ``parley serve`` ends every process it started within seconds (before: the engine
    core ran on, orphaned)."""
    out = tmp_path / "serve.log"
    proc = _serve(tiny_model_dir, out)
    engines: list[psutil.Process] = []
    try:
        _wait_for(out, "pool listening on ", proc, 300)
        first = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        assert _kill_engine(proc) > 0
        _wait_for(out, "the vLLM engine serves again (restart 1)", proc, 300)
        engines = psutil.Process(proc.pid).children(recursive=True)
        assert {p.pid for p in engines} - first  # new processes: a restarted engine
        started = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        gone, alive = psutil.wait_procs(engines, timeout=20)
        took = time.monotonic() - started
        print(f"{len(gone)} engine processes ended within {took:.1f} s of kill -9")
        assert not alive, [p.cmdline()[:3] for p in alive]
    finally:
        for p in engines:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
