"""Run folders for the viewer's tests: real runs (one with a hostile agent) and crafted ones;
the browser tests' page and server loop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from tests.arena.view.browser import ARTIFACTS, MISSING, LoopThread, find_chromium

if TYPE_CHECKING:
    from playwright.sync_api import Page

SCENARIO = "negotiation/deal-or-no-deal-v0"
HOSTILE = "tests.arena.view.hostile:MarkupAgent"


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``scripted/`` (3 tasks x 2 trials of scripted play) and ``hostile/`` (the markup
    agent against the scripted one), written by the real runner."""
    root = tmp_path_factory.mktemp("runs")
    out = root / "scripted"
    run(RunConfig(SCENARIO, episodes=3, trials=2, out=str(out), progress=False))
    out, hostile = root / "hostile", [HOSTILE, "scripted"]
    run(RunConfig(SCENARIO, agents=hostile, episodes=3, out=str(out), progress=False))
    return root


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    """A 1280x900 page of headless Chromium, one per test module; after the module's tests,
    fails if a script of any page it showed raised."""
    chromium = find_chromium()
    if chromium is None:
        pytest.fail(MISSING)  # in CI: a missing browser is a failure
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        context.on("pageerror", lambda e: errors.append(str(e)))
        yield context
        browser.close()
        assert errors == [], f"script errors in the pages: {errors}"


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    """An event loop in a thread, for the servers and runs a browser test drives."""
    thread = LoopThread()
    yield thread
    thread.stop()


def write_run(folder: Path, episodes: list[dict], summary: dict | None = None) -> Path:
    """A run folder with these transcripts (and summary.json when given)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "transcripts.jsonl").open("w") as f:
        for ep in episodes:
            f.write(json.dumps(ep) + "\n")
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def episode(eid: str, status: str = "ok", **fields: object) -> dict:
    """A transcript line with sensible defaults."""
    base = {
        "episode": eid,
        "index": 0,
        "task": 0,
        "trial": 0,
        "seed": 1,
        "scenario": "demo/x-v0",
        "agents": {"a": "scripted", "b": "scripted"},
        "steps": [],
        "metrics": {} if status == "failed" else {"success": 1.0},
        "returns": {"a": 1.0, "b": 0.0},
        "status": status,
        "failed": "",
    }
    base.update(fields)
    return base
