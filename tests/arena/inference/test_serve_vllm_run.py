"""``parley run`` with many LLM-agent episodes against a ``parley serve --backend vllm`` pool in
another process (issue 12 §1).

Seeded requests whose prefill vLLM splits across engine steps (chunked prefill: many agents'
long multi-turn prompts filling a step) killed the CPU engine with ``CPU Generator does not use
offset``: vLLM rewinds the request's torch generator by an offset, which only CUDA generators
have. The backend turns chunked prefill off where generators have no offset (CPU), so a prompt
waits for a step with room instead of being split.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.arena.inference.test_pool_serve import _read_line

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.long, pytest.mark.timeout(600)]  # (~2 min)


def test_sixteen_seeded_llm_episodes_against_a_served_vllm_pool(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    serve = [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(tiny_model_dir)]
    serve += ["--backend", "vllm", "--listen", "tcp://127.0.0.1:0", "--policy", "tiny"]
    serve += ["-b", "max_model_len=2048"]
    # Its own process group: on failure the whole group (vLLM's engine processes included)
    # is killed, not only the server, which would leave the engine running.
    pool = subprocess.Popen(serve, stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
    try:
        address = _read_line(pool, "pool listening on ", 240)
        # Keep reading the pool's stdout (vLLM logs there): a full pipe would block it.
        assert pool.stdout is not None
        threading.Thread(target=pool.stdout.read, daemon=True).start()
        agents = f"llm:{tiny_model_dir}?policy=tiny&max_tokens=24,scripted"
        run = [sys.executable, "-m", "parley.arena.cli", "run", "negotiation/simple-trade-v0"]
        run += ["--agents", agents, "--pool", address, "--episodes", "16", "--concurrency", "16"]
        run += ["--seed", "3", "--no-progress", "--out", str(tmp_path), "--act-timeout", "240"]
        run += ["-s", "max_turns=4"]
        done = subprocess.run(run, capture_output=True, timeout=480)
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        assert summary["episodes"] == {"total": 16, "ok": 16, "failed": 0}
        prompts = [
            len(turn["tokens"][0]["prompt_token_ids"])
            for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
            for turn in json.loads(line).get("turns", [])
            if turn.get("tokens")
        ]
        # Long multi-turn prompts: 16 of them at once overflow one engine step's budget.
        print("prompt tokens: max", max(prompts), "sum", sum(prompts), "n", len(prompts))
        assert max(prompts) > 200
        assert sum(sorted(prompts)[-16:]) > 4096
        assert pool.poll() is None, "the pool died"
        pool.send_signal(signal.SIGINT)
        assert pool.wait(60) == 0
    finally:
        if pool.poll() is None:
            os.killpg(pool.pid, signal.SIGKILL)
        pool.wait(30)
