"""The eval page of ``parley view`` (:mod:`parley.arena.view.evals`), built from a real
small ``parley eval`` report: the suite, per-entry rows with CIs and pass^k, the Welch
comparison with another report of the same suite, all text escaped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from parley.arena.run.suites import Suite, SuiteEntry, compare_reports, run_suite, suite_digest
from parley.arena.view.data import discover
from parley.arena.view.evals import eval_page
from parley.arena.view.html import Links
from parley.arena.view.pages import index_page
from tests.arena.view.hostile import PAYLOAD

TINY = Suite(
    "tiny-v1",
    "two fast entries",
    (
        SuiteEntry("collaboration/referential-v1", episodes=3, trials=2, seed=1),
        SuiteEntry("tool_use/calc-chain-v1", episodes=2, trials=2, seed=2),
    ),
)


@pytest.mark.timeout(60)
def test_the_eval_page_shows_the_report_and_its_comparison_escaped(tmp_path: Path) -> None:
    a_dir = tmp_path / "eval-a"
    report = run_suite(TINY, "scripted", a_dir, concurrency=2, log=lambda _: None)
    # B: the same suite, another agent (named with markup), success 0.25 higher.
    b_dir = tmp_path / "eval-b"
    shutil.copytree(a_dir, b_dir)
    other = json.loads((b_dir / "report.json").read_text())
    other["agents"] = {"speaker": PAYLOAD}
    for row in other["entries"]:
        row["metrics"]["success"]["mean"] -= 0.25
    (b_dir / "report.json").write_text(json.dumps(other))
    # A's own report names an agent and a scenario with markup (a hand-edited file).
    report["agents"] = PAYLOAD
    report["entries"][1]["scenario"] = PAYLOAD
    (a_dir / "report.json").write_text(json.dumps(report))

    sources = discover([tmp_path])
    links = Links()
    evals = {s.path.name: s for s in sources.values() if s.kind == "eval"}
    assert set(evals) == {"eval-a", "eval-b"}
    html = eval_page(evals["eval-a"], sources, links)

    assert "<script" not in html.split("</head>")[1]  # no markup from the report runs
    assert "onerror=" not in html.replace("onerror=&quot;", "")
    assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in html
    assert suite_digest(TINY) in html
    entries = re.search(r"<table id=eval-entries>.*?</table>", html)
    assert entries is not None
    first = report["entries"][0]
    success = first["metrics"]["success_with_forfeits"]  # (the agent's forfeits count)
    assert f"{success['mean']:.3f} ± {success['ci95']:.3f}" in entries.group(0)
    assert f"{first['episodes']['ok']} / 0 (0)" in entries.group(0)
    passes = " / ".join(f"{v:.3f}" for v in first["pass_hat_k"].values())
    assert passes in entries.group(0)  # pass^1 / pass^2
    run_link = links.run(next(s.id for s in sources.values() if s.path.parent == a_dir))
    assert f'href="{run_link}"' in entries.group(0)  # each entry links to its run page
    rows = compare_reports(report, other)
    welch = next(r for r in rows if r["metric"] == "success" and r["ci"] is not None)
    assert f"{welch['diff']:.3f}" in html  # --compare's B - A
    assert f"[{welch['ci'][0]:.3f}, {welch['ci'][1]:.3f}]" in html  # and its Welch interval
    assert f'href="{links.eval(evals["eval-b"].id)}"' in html
    index = index_page(sources, links)
    assert f'href="{links.eval(evals["eval-a"].id)}"' in index  # linked from the index


def test_a_folder_whose_report_is_not_an_eval_report_says_so(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps({"schema": 99, "agents": PAYLOAD}))
    sources = discover([tmp_path])
    (src,) = sources.values()
    html = eval_page(src, sources, Links())
    assert "not a parley eval report" in html
    assert "__xss" not in html
