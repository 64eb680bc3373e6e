"""``parley bench pool`` and ``parley demo`` run end to end (figures checked for shape only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.arena.cli import main

pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_bench_pool_json(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            *("bench", "pool", "--json", "--model", str(tiny_model_dir), "--agents", "4"),
            *("--max-tokens", "4", "--rounds", "2", "--repeat", "1", "--sequential-requests", "2"),
        ]
    )
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "sequential_tokens_per_s",
        "direct_batch_tokens_per_s",
        "pool_tokens_per_s",
        "batched_ratio_vs_sequential",
        "pool_ratio_vs_direct_batch",
    ):
        assert result[key] > 0, key
    # 4 agents, 2 rounds, one agent's next request only after its answer: batches of <= 4.
    assert 1 <= result["pool_mean_batch_size"] <= 4


@pytest.mark.timeout(300)
def test_demo_plays_llm_and_scripted_agents(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            *("demo", "--model", str(tiny_model_dir), "--episodes", "2"),
            *("--max-turns", "1", "--max-tokens", "4", "--no-train"),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "episodes ok" in out
    assert "inference pool" in out
    assert "llm:" in out


def test_demo_builds_the_model_when_absent(tmp_path: Path) -> None:
    from parley.arena.inference.models.tiny import ensure_tiny_model

    built = ensure_tiny_model(tmp_path / "model")
    assert (built / "config.json").is_file()
    mtime = (built / "config.json").stat().st_mtime_ns
    assert ensure_tiny_model(built) == built  # present: not rebuilt
    assert (built / "config.json").stat().st_mtime_ns == mtime
