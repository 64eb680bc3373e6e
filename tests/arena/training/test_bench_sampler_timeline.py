"""Where the sampler bench says the time went: interval arithmetic and the two-device
estimate (pure functions), and the bench itself at its smallest (its real size takes
minutes and runs by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.arena.bench.sampler import _Clock, _overlap, _summary, _two_device_estimate, _union


def test_union_merges_overlapping_episodes_only() -> None:
    assert _union([(3, 4), (0, 2), (1, 2.5), (5, 6)]) == [(0, 2.5), (3, 4), (5, 6)]
    assert _overlap(_union([(0, 2), (1, 3)]), [(2, 10)]) == pytest.approx(1.0)


def test_summary_counts_training_overlap_and_per_update_phases() -> None:
    clock = _Clock()
    clock.events = [
        ("episode", 0.0, 2.0, 0),
        ("episode", 0.0, 5.0, 0),
        ("train", 2.0, 4.0, 0),
        ("push", 4.0, 4.5, 0),
        ("episode", 4.5, 6.0, 1),
    ]
    out = _summary("async", clock, wall=6.0, n_samples=12, n_episodes=2)
    assert out["generating_s"] == pytest.approx(6.0 - 0.0 - 0.0)  # 0-5 and 4.5-6 merge
    assert out["training_s"] == pytest.approx(2.5)
    assert out["training_overlapping_generation_s"] == pytest.approx(2.5)
    assert out["samples_per_s"] == pytest.approx(2.0)
    assert out["per_update"] == [{"update": 0, "train": [2.0, 4.0], "push": [4.0, 4.5]}]


def test_two_device_estimate_is_a_pipeline_of_the_sync_phases() -> None:
    rows = [
        {
            "update": u,
            "generate": [10 * u, 10 * u + 6],
            "train": [10 * u + 6, 10 * u + 9],
            "push": [10 * u + 9, 10 * u + 10],
        }
        for u in range(3)
    ]  # G = 6, T = 4 per update
    est = _two_device_estimate({"per_update": rows}, updates=3)
    assert est["kind"].startswith("estimate")
    # sync 3 * 10 = 30; pipeline 6 + 2 * 6 + 4 = 22
    assert est["async_ratio_vs_sync"] == pytest.approx(30 / 22, abs=1e-3)
    assert est["ceiling_many_updates"] == pytest.approx(10 / 6, abs=1e-3)


def test_the_bench_runs_end_to_end_at_its_smallest(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both paths through the real trainer set-up (load_policies, pool, runner, PG trainer):
    # a rename in the training code broke this once without a test noticing.
    from parley.arena.cli import main

    timeline = tmp_path / "timeline.json"
    argv = ["bench", "sampler", "--json", "--batch", "2", "--updates", "1"]
    argv += ["--max-tokens", "4", "--max-turns", "2", "--model", str(tiny_model_dir)]
    assert main([*argv, "--timeline", str(timeline)]) == 0
    out = json.loads(capsys.readouterr().out)
    for path in ("sync", "async"):
        assert out["timeline"][path]["samples"] > 0
        assert out["timeline"][path]["episodes_trained"] == 2
    assert out["async_ratio_vs_sync"] > 0
    assert json.loads(timeline.read_text())
