"""``parley bench env --json`` end to end at a tiny size (figures checked for shape only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.timeout(120)
def test_bench_env_json_reports_the_runner_ratios(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from parley.arena.cli import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its ipc sockets go

    argv = ["bench", "env", "--json", "--agents", "2", "--steps", "3", "--episodes", "1",
            "--env-episodes", "2", "--repeats", "1", "--trade-episodes", "2",
            "--ta-episodes", "2", "--concurrency", "2"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("runner_ratio_vs_plain_loop", "remote_ratio_vs_plain_loop",
                "runner_ratio_vs_plain_loop_simple_trade",
                "remote_ratio_vs_plain_loop_simple_trade",
                "env_step_ratio_vs_bare", "agent_steps_per_s_plain_loop",
                "copy_floor_ratio_vs_plain_loop", "raw_pyzmq_ratio_vs_plain_loop",
                "copy_floor_ratio_vs_plain_loop_simple_trade",
                "runner_ratio_vs_copy_floor", "runner_ratio_vs_copy_floor_simple_trade",
                "raw_pyzmq_ratio_vs_plain_loop_simple_trade",
                "runner_out_ratio_vs_runner", "runner_out_ratio_vs_runner_simple_trade",
                "runner_out_process_cpu_ratio_vs_runner",
                "remote_batched_ratio_vs_plain_loop",
                "remote_batched_ratio_vs_plain_loop_simple_trade"):  # fmt: skip
        assert results[key] > 0, key
    # TextArena is not a dependency: without it the comparison says how to install it.
    if "textarena_skipped" in results:
        assert "pip install --no-deps textarena==0.7.4" in results["textarena_skipped"]
    else:
        assert results["simple_trade_v1_ratio_vs_textarena"] > 0
    assert list(tmp_path.iterdir()) == []  # its ipc socket files stayed behind


def test_the_textarena_comparison_is_skipped_with_the_install_line_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from parley.arena.bench import textarena

    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena raises ImportError
    assert textarena.measure(1, 1) == {
        "textarena_skipped": "TextArena is not installed (import of textarena halted; None in "
        "sys.modules); to compare, run: pip install --no-deps textarena==0.7.4 nltk chess"
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_raw_pyzmq_loop_plays_every_agent_step_of_the_plain_loop(
    monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    """The reference loop must do the plain loop's work, over the wire: the same episodes,
    every acting seat asked once per step, the same moves (same transcripts)."""
    from parley.arena.bench import env, floors
    from parley.scenarios import Scenario

    env._register()
    work = env.Workload(
        "simple_trade",
        env.TRADE_ID,
        {},
        dict.fromkeys(["player_0", "player_1"], "parley.agents.scripted.negotiation:SpiralTrader"),
        5,
    )
    played: list[tuple[int, dict[str, str]]] = []
    step = Scenario.step

    def recording(self: Scenario, actions: dict[str, str]) -> object:
        played.append((self.turn, dict(actions)))
        return step(self, actions)

    monkeypatch.setattr(Scenario, "step", recording)
    env._plain_loop_steps_per_s(work)
    plain = sorted(played, key=repr)
    played.clear()
    cpu_rate, wall_rate = floors.raw_pyzmq_steps_per_s(work, concurrency)
    assert cpu_rate > 0
    assert wall_rate > 0
    assert sorted(played, key=repr) == plain
    assert sum(len(actions) for _, actions in plain) > 5
