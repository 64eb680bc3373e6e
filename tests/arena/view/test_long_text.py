"""The episode page survives what a transcript holds: a 1 MB space-less move (issue 29 §6).

One such move had frozen the episode page in Chromium (a 120k-character word took 28 s to
lay out, a 1 MB one never loaded). The page folds long text (the rest behind a closed
``details``) and gives long space-less runs break opportunities. Measured by the browser's
own figures, not the wall clock: the renderer's layout and style time for the page
(Chrome's ``Performance.getMetrics``), against the same page with a short move.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.arena.view.browser import MISSING, LoopThread, find_chromium, skip_unless_ci
from tests.arena.view.conftest import episode, write_run

skip_unless_ci()
CHROMIUM = find_chromium()
if CHROMIUM is not None:
    from playwright.sync_api import Page, sync_playwright

from parley.arena.view.html import FOLD, WRAP  # noqa: E402
from parley.arena.view.server import start  # noqa: E402

MOVE = 1_000_000


def _run(root: Path, name: str, move: str) -> None:
    step = {
        "turn": 0,
        "observations": {"a": move, "b": "o"},
        "actions": {"a": move, "b": "ok"},
        "infos": {},
        "rewards": {},
    }
    write_run(root / name, [episode("t0", steps=[step])])


@pytest.fixture
def page() -> Iterator[Page]:
    if CHROMIUM is None:
        pytest.fail(MISSING)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser.new_page(viewport={"width": 1280, "height": 900})
        browser.close()


def _render_cost(page: Page, url: str) -> float:
    """Seconds the renderer spent laying out and styling ``url`` until it was shown (the
    figures start over with each document; they are collected once enabled)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    page.goto(url, timeout=60_000)
    page.locator(".msg").first.wait_for(timeout=60_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    metrics = cdp.send("Performance.getMetrics")["metrics"]
    cdp.detach()
    got: dict[str, Any] = {m["name"]: m["value"] for m in metrics}
    return float(got["LayoutDuration"] + got["RecalcStyleDuration"])


@pytest.mark.timeout(120)
def test_a_1mb_space_less_move_is_folded_and_wrapped(page: Page, tmp_path: Path) -> None:
    rng = random.Random(0)
    move = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(MOVE))
    _run(tmp_path, "long", move)
    _run(tmp_path, "plain", "hello")
    loop = LoopThread()
    runner, url = loop.call(lambda: start([tmp_path]))
    try:
        plain = min(_render_cost(page, f"{url}run/plain/episode/t0") for _ in range(2))
        long = _render_cost(page, f"{url}run/long/episode/t0")
        # Before: 0.70 s of layout and style against 0.004 s for the plain page (175x);
        # folded: 0.005 s against 0.002 s.
        print(f"layout+style: 1 MB move {long:.3f} s, plain {plain:.3f} s")
        assert long <= 10 * plain + 0.1, (long, plain)
        assert plain > 0  # (the figures are there to compare)
        bubble = page.locator(".msg").first
        head = bubble.evaluate(
            "e => Array.from(e.childNodes).filter(n => n.nodeName !== 'DETAILS')"
            ".map(n => n.textContent).join('')"
        )
        assert head == move[:FOLD]  # the first FOLD characters, then the fold
        more = bubble.locator("details.more")
        assert more.locator("summary").inner_text() == f"{MOVE - FOLD:,} more characters"
        # Opened, the whole move is there, in lines of at most WRAP characters.
        more.locator("summary").click()
        text = bubble.evaluate("e => e.textContent")
        assert text.replace(f"{MOVE - FOLD:,} more characters", "") == move
        width = bubble.evaluate("e => e.scrollWidth <= e.clientWidth")
        assert width, "the opened move overflows its bubble"
        assert bubble.evaluate("e => e.querySelectorAll('wbr').length") >= MOVE // WRAP - 2
    finally:
        loop.call(runner.cleanup)
        loop.stop()
