"""``parley bench pool --adapters N``: the multi-adapter figures, end to end on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.arena.cli import main

pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.mark.timeout(300)
def test_bench_pool_reports_multi_adapter_ratio(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            *("bench", "pool", "--json", "--model", str(tiny_model_dir), "--agents", "6"),
            *("--max-tokens", "4", "--rounds", "1", "--repeat", "1", "--sequential-requests", "1"),
            *("--adapters", "3", "--lora-rank", "4"),
        ]
    )
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["adapters"], result["lora_rank"]) == (3, 4)
    # B = 0 adapters: the same tokens as the plain model, so the ratio compares like with like.
    assert result["same_tokens"] is True
    assert result["generated_tokens"][0] == result["generated_tokens"][1] > 0
    assert result["multi_adapter_mean_batch_size"] == 6  # the three adapters in one batch
    assert result["multi_adapter_ratio_vs_single"] > 0
    assert result["multi_adapter_ratio_median_of_turns"] > 0  # plain and adapters in turns
    assert result["targets"]["multi_adapter_ratio_vs_single"] == ">= 0.7"
