"""A pool behind CURVE keys (issue 11 §1): ``parley serve --curve-key --client-key`` admits
only listed clients; ``parley run --pool --pool-key --curve-key`` plays through it; a run
without the keys is refused at once, naming the pool and the options."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from parley.arena.cli import main
from parley.protocols.keys import make_key_pair
from tests.arena.inference.test_pool_serve import _read_line

pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_curve_pool_serves_only_listed_clients(tiny_model_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    for name in ("pool", "arena", "stranger"):
        make_key_pair(keys, name)
    serve = [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(tiny_model_dir)]
    serve += ["--listen", "tcp://127.0.0.1:0", "--policy", "tiny"]
    serve += ["--curve-key", str(keys / "pool.key_secret"), "--client-key", str(keys / "arena.key")]
    pool = subprocess.Popen(serve, stdout=subprocess.PIPE, bufsize=0)
    try:
        address = _read_line(pool, "pool listening on ", 120)
        agents = f"llm:{tiny_model_dir}?policy=tiny&max_tokens=6,scripted"
        base = ["run", "negotiation/deal-or-no-deal-v0", "--agents", agents, "--pool", address]
        base += ["--episodes", "2", "--no-progress", "-s", "max_turns=2"]
        ok = main([*base, "--out", str(tmp_path / "ok"), "--pool-key", str(keys / "pool.key"),
                   "--curve-key", str(keys / "arena.key_secret")])  # fmt: skip
        assert ok == 0
        summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
        assert summary["episodes"]["ok"] == 2
        for attempt in (
            [],  # no keys at all: plain text to a CURVE server completes no handshake
            [
                "--pool-key",
                str(keys / "pool.key"),
                "--curve-key",
                str(keys / "stranger.key_secret"),
            ],
        ):
            run = [sys.executable, "-m", "parley.arena.cli", *base, *attempt]
            done = subprocess.run(run, capture_output=True, timeout=120)
            assert done.returncode == 2, done.stderr.decode()[-2000:]
            assert f"no inference pool answers at {address}" in done.stderr.decode()
        pool.send_signal(signal.SIGINT)
        assert pool.wait(30) == 0
    finally:
        if pool.poll() is None:
            pool.kill()
        pool.wait(10)
