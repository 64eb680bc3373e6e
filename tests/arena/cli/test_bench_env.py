"""``parley bench env --json`` end to end at a tiny size (figures checked for shape only)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.timeout(120)
def test_bench_env_json_reports_the_runner_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    from parley.arena.cli import main

    argv = ["bench", "env", "--json", "--agents", "2", "--steps", "3", "--episodes", "1",
            "--env-episodes", "2", "--repeats", "1"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("runner_ratio_vs_plain_loop", "remote_ratio_vs_plain_loop",
                "env_step_ratio_vs_bare", "agent_steps_per_s_plain_loop"):  # fmt: skip
        assert results[key] > 0, key
