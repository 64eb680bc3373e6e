"""Where the sampler bench says the time went: interval arithmetic and the two-device
estimate (pure functions; the bench itself takes minutes and runs by hand)."""

from __future__ import annotations

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
