"""Benchmark suites (parley.arena.run.suites, parley eval): a tiny real suite played and
resumed, the Welch comparison against scipy, pinned suite digests, and bad input (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.arena.cli import main
from parley.arena.run.stats import mean_ci
from parley.arena.run.suites import (
    SUITES,
    Suite,
    SuiteEntry,
    compare_reports,
    entry_agents,
    report_row,
    run_suite,
    suite_digest,
    welch_interval,
    with_forfeits,
)
from parley.protocols.errors import ConfigError

TINY = Suite(
    "tiny-v1",
    "two fast entries",
    (
        SuiteEntry("collaboration/referential-v1", episodes=3, trials=2, seed=1),
        SuiteEntry("tool_use/calc-chain-v1", episodes=2, trials=2, seed=2),
    ),
)

PINNED = {
    "negotiation-v1": "77e72d4b0d65",
    "collaboration-v1": "5a5ef267da30",
    "tool-use-v1": "e4034d473b63",
    "code-v1": "4130bbadc4e3",
    "all-v1": "4d44195bd187",
}


@pytest.mark.timeout(60)
def test_a_tiny_suite_is_played_reported_and_resumed(tmp_path: Path) -> None:
    logged: list[str] = []
    report = run_suite(TINY, "scripted", tmp_path, concurrency=2, log=logged.append)
    assert report["suite_digest"] == suite_digest(TINY)
    assert [row["scenario"] for row in report["entries"]] == [e.scenario for e in TINY.entries]
    first = report["entries"][0]
    assert first["episodes"] == {"total": 6, "ok": 6, "failed": 0}
    assert first["metrics"]["success"]["n"] == 6
    assert set(first["pass_hat_k"]) == {"1", "2"}
    assert json.loads((tmp_path / "report.json").read_text()) == report
    markdown = (tmp_path / "report.md").read_text()
    assert "collaboration/referential-v1" in markdown
    assert "pass^2" in markdown
    played = [
        tmp_path / f"{i:02d}-{e.folder}" / "transcripts.jsonl" for i, e in enumerate(TINY.entries)
    ]
    stamps = [path.stat().st_mtime_ns for path in played]

    # Started again: both runs are read back, not played (their transcripts are untouched).
    logged.clear()
    again = run_suite(TINY, "scripted", tmp_path, log=logged.append)
    assert again == report
    assert [path.stat().st_mtime_ns for path in played] == stamps
    assert sum("resumed" in line for line in logged) == 2

    # An interrupted run (partial summary) is played again; the finished one is kept.
    summary_path = played[1].parent / "summary.json"
    partial = json.loads(summary_path.read_text())
    partial["partial"] = True
    summary_path.write_text(json.dumps(partial))
    logged.clear()
    run_suite(TINY, "scripted", tmp_path, log=logged.append)
    assert played[0].stat().st_mtime_ns == stamps[0]
    assert played[1].stat().st_mtime_ns != stamps[1]
    assert sum("resumed" in line for line in logged) == 1

    # Other agents into the same folder: refused, nothing overwritten.
    with pytest.raises(ConfigError, match="another --out"):
        run_suite(TINY, {"solver": "scripted", "speaker": "tests.x:Y"}, tmp_path)
    assert played[0].stat().st_mtime_ns == stamps[0]


@pytest.mark.timeout(60)
def test_the_tasks_an_agent_fails_on_purpose_count_against_it(tmp_path: Path) -> None:
    # The dodger solves every task it plays and raises on the others: left out, as the
    # run's metrics leave failed episodes out, they would score it 1.0.
    suite = Suite("dodge-v1", "one entry", (SuiteEntry("tool_use/calc-chain-v1", 8, 2, 3),))
    report = run_suite(suite, {"solver": "tests.arena.run.dodging_agents:Dodger"}, tmp_path)
    row = report["entries"][0]
    episodes = row["episodes"]
    assert 0 < episodes["failed"] < episodes["total"] == 16, episodes
    assert row["forfeits"] == episodes["failed"]
    assert row["metrics"]["success"]["mean"] == 1.0  # the run's own: failures left out
    counted = row["metrics"]["success_with_forfeits"]
    assert counted["n"] == 16
    assert counted["mean"] == pytest.approx(episodes["ok"] / 16)
    assert row["pass_hat_k"]["1"] == pytest.approx(episodes["ok"] / 16)
    assert (
        f"| {episodes['ok']} / {episodes['failed']} ({episodes['failed']}) |"
        in (tmp_path / "report.md").read_text()
    )


def test_failures_not_of_the_evaluated_seats_are_left_out(tmp_path: Path) -> None:
    lines = [
        {"task": 0, "status": "ok", "metrics": {"success": 1.0}},
        {"task": 0, "status": "failed", "failed": "scenario_error: step raised KeyError()"},
        {"task": 1, "status": "failed", "failed": "listener: agent_error: boom"},  # baseline
        {"task": 1, "status": "failed", "failed": "speaker: bus_error: closed"},  # not its own
        {"task": 2, "status": "failed", "failed": "speaker: timeout: no reply within 60 s"},
        {"task": 2, "status": "failed", "failed": "speaker: agent_error: x, listener: timeout"},
    ]
    path = tmp_path / "transcripts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    row = {
        "agents": {"speaker": "llm:m", "listener": "scripted"},
        "metrics": {"success": {"mean": 1.0, "ci95": None, "n": 1, "sd": None}},
    }
    counted = with_forfeits(row, path, {"speaker"}, trials=2)
    assert counted["forfeits"] == 2  # task 2's two trials (the last one's detail has ", ")
    assert counted["metrics"]["success_with_forfeits"]["mean"] == pytest.approx(1 / 3)
    assert counted["pass_hat_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.0)}


def test_named_seats_apply_where_they_exist_and_unknown_seats_are_refused() -> None:
    seats = {
        "collaboration/referential-v1": ["speaker", "listener"],
        "tool_use/calc-chain-v1": ["solver"],
    }
    per_entry = entry_agents(TINY, {"speaker": "llm:m"}, seats)
    assert per_entry == [{"speaker": "llm:m", "listener": "scripted"}, {"solver": "scripted"}]
    assert entry_agents(TINY, "llm:m", seats)[1] == {"solver": "llm:m"}
    with pytest.raises(ConfigError, match="no scenario of tiny-v1"):
        entry_agents(TINY, {"speakr": "llm:m"}, seats)


def test_welch_interval_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    a = [0.1 * (i % 7) + 0.02 * i for i in range(40)]
    b = [0.3 + 0.05 * (i % 5) ** 2 for i in range(35)]
    entry = SuiteEntry("x/y-v0", episodes=1)

    def report(values: list[float]) -> dict[str, object]:
        summary = {"metrics": {"m": mean_ci(values).as_dict()}, "episodes": {}}
        row = report_row(entry, {}, summary, "run")
        return {"suite": "s-v1", "suite_digest": "d", "entries": [row]}

    (row,) = compare_reports(report(a), report(b))
    expected = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert row["diff"] == pytest.approx(sum(b) / len(b) - sum(a) / len(a))
    assert row["ci"] == pytest.approx([expected.low, expected.high], abs=1e-4)
    # A hand check at small n (df from the table): n = 2 each, sd = 1 -> df = 2, t = 4.303.
    diff, _low, high = welch_interval({"mean": 0, "sd": 1, "n": 2}, {"mean": 1, "sd": 1, "n": 2})
    assert (diff, high - diff) == (1, pytest.approx(4.303))


def test_suite_digests_are_pinned() -> None:
    """A suite is never changed in place: a changed entry must be a new suite version."""
    assert {name: suite_digest(s)[:12] for name, s in SUITES.items()} == PINNED
    for suite in SUITES.values():
        assert all(e.scenario.rsplit("-v", 1)[1].isdigit() for e in suite.entries)


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "nope-v1"]) == 2
    assert "no suite 'nope-v1'; known suites: negotiation-v1" in capsys.readouterr().err
    assert main(["eval", "all-v1", "--agents", "scripted,scripted"]) == 2
    assert "one spec for every seat" in capsys.readouterr().err
    one = {"schema": 1, "suite": "a-v1", "suite_digest": "1" * 64, "entries": []}
    other = {**one, "suite": "a-v2", "suite_digest": "2" * 64}
    (tmp_path / "a.json").write_text(json.dumps(one))
    (tmp_path / "b.json").write_text(json.dumps(other))
    assert main(["eval", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "different suites" in capsys.readouterr().err
    (tmp_path / "c.json").write_text("{}")
    assert main(["eval", "--compare", str(tmp_path / "a.json"), str(tmp_path / "c.json")]) == 2
    assert "is not a parley eval report" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_the_command_plays_a_suite_and_compares_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "collab")
    args = ["eval", "collaboration-v1", "--agents", "scripted", "--out", out, "--no-progress"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["suite_digest"].startswith(PINNED["collaboration-v1"])
    assert [row["episodes"]["ok"] for row in report["entries"]] == [150, 150]
    assert main(["eval", "--compare", out, f"{out}/report.json", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    success = next(r for r in rows if r["metric"] == "success")
    assert (success["diff"], success["ci"]) == (0.0, [0.0, 0.0])
