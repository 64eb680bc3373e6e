"""A model name that is not a local directory fails fast, or loads from the cache offline.

Hugging Face's loaders retry an unreachable hub for about a minute before failing (issue 14:
``parley serve --model NONEXISTENT-HUB-ID`` took > 60 s). Each case runs in a subprocess with
its own ``HF_ENDPOINT`` (a closed port, or a local server that answers 404 like the hub) and
``HF_HUB_CACHE`` (empty, or holding the tiny model as a cached hub repository), since
``huggingface_hub`` reads both at import.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("transformers")

PARLEY = str(Path(sys.executable).with_name("parley"))
PROBE = (
    "import os, sys\n"
    "from parley.arena.inference.backends.tokenizer import load_tokenizer\n"
    "tok = load_tokenizer(sys.argv[1])\n"
    "print('loaded', len(tok), os.environ.get('HF_HUB_OFFLINE'))\n"
)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HOME=str(tmp_path))
    return env


class _NotFound(http.server.BaseHTTPRequestHandler):
    """Answers every request as the hub answers a repository that does not exist."""

    def _answer(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b'{"error": "Repository not found"}')

    do_GET = do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def not_found_hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_unreachable_hub_and_no_cache_is_one_line_at_once(tmp_path: Path, backend: str) -> None:
    # Checked before the backend is imported (vLLM's import alone takes 10-30 s here).
    env = _env(tmp_path, f"http://127.0.0.1:{_closed_port()}")
    cmd = [PARLEY, "serve", "--model", "nobody/no-such-model", "--backend", backend]
    # 60 s: Hugging Face's own retries alone take longer than that.
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "Retrying" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("parley serve: 'nobody/no-such-model' is not a local directory")
    assert "cannot be reached" in line
    assert "HF_HUB_OFFLINE=1" in line


def test_missing_repository_is_named(tmp_path: Path, not_found_hub: str) -> None:
    cmd = [PARLEY, "serve", "--model", "nobody/no-such-model", "--backend", "transformers"]
    env = _env(tmp_path, not_found_hub)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "no model 'nobody/no-such-model' on the Hugging Face hub" in line
    assert "RepositoryNotFoundError" in line


def test_cached_model_loads_offline_when_the_hub_is_unreachable(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # The tiny model laid out as the hub cache holds a downloaded repository.
    repo = tmp_path / "hub" / "models--someone--tiny"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    env = _env(tmp_path, f"http://127.0.0.1:{_closed_port()}")
    cmd = [sys.executable, "-c", PROBE, "someone/tiny"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["loaded", done.stdout.split()[1], "1"]
    assert int(done.stdout.split()[1]) > 100
    assert "loading someone/tiny from the cache" in done.stderr
    assert "Retrying" not in done.stderr
