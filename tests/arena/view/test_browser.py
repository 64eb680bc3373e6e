"""The viewer and the human seat in a real browser (headless Chromium via Playwright).

Screenshots of every page go to .artifacts/view/ (not committed).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.arena.view.browser import ARTIFACTS, LoopThread, find_chromium, skip_unless_ci

skip_unless_ci()
CHROMIUM = find_chromium()
if CHROMIUM is not None:
    from playwright.sync_api import Page, expect
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

from parley.arena.run.agent_specs import SeatContext, resolve_agent_spec  # noqa: E402
from parley.arena.run.config import RunConfig  # noqa: E402
from parley.arena.run.runner import Runner  # noqa: E402
from parley.arena.view import human  # noqa: E402
from parley.arena.view.server import start  # noqa: E402
from tests.arena.view.test_human import counts, give_all  # noqa: E402

SCENARIO = "negotiation/deal-or-no-deal-v1"


def _viewer(loop: LoopThread, roots: list[Path]) -> tuple[Any, str]:
    return loop.call(lambda: start(roots))


def test_click_through_runs_run_episode_compare(
    page: Page, loop: LoopThread, runs_dir: Path
) -> None:
    runner, url = _viewer(loop, [runs_dir])
    try:
        page.goto(url)
        page.screenshot(path=ARTIFACTS / "runs.png", full_page=True)
        page.click("a.run-link:text('hostile')")
        expect(page.locator("#metrics")).to_contain_text("success")
        expect(page.locator("#invalid")).to_contain_text("player_0")
        page.screenshot(path=ARTIFACTS / "run.png", full_page=True)
        page.click("#episodes-link")
        expect(page.locator("#count")).to_contain_text("3 of 3 episodes")
        page.screenshot(path=ARTIFACTS / "episodes.png", full_page=True)
        page.locator("a.episode-link").first.click()
        bubble = page.locator(".msg", has_text="window.__xss").first
        expect(bubble).to_be_visible()
        # The agent's markup is shown as text and never ran.
        assert "<script>window.__xss = 1</script>" in bubble.inner_text()
        assert page.evaluate("window.__xss") is None
        assert page.locator("main script, main img").count() == 0
        page.screenshot(path=ARTIFACTS / "episode.png", full_page=True)
        page.goto(url)
        page.select_option("select[name=a]", "hostile")
        page.select_option("select[name=b]", "scripted")
        page.click("#compare-form button")
        row = page.locator("#compare tr", has_text="success")
        expect(row).to_contain_text("1.000 ± 0.000")
        page.screenshot(path=ARTIFACTS / "compare.png", full_page=True)
        page.goto(url + "run/scripted/episodes?status=failed")
        expect(page.locator("#count")).to_contain_text("0 of 6 episodes")
        assert page.evaluate("window.__xss") is None
    finally:
        loop.call(runner.cleanup)


def test_a_person_plays_deal_or_no_deal_in_the_browser(
    page: Page, loop: LoopThread, tmp_path: Path
) -> None:
    server = human.hub()
    seat = resolve_agent_spec("human", SeatContext(SCENARIO, "player_0"))
    config = RunConfig(SCENARIO, episodes=1, out=str(tmp_path), progress=False, act_timeout=60)
    run = loop.submit(lambda: Runner(config, agents={"player_0": seat}).run())  # type: ignore[dict-item]
    page.goto(server.url_for("player_0"))
    moves: list[str] = []
    told_invalid = False
    deadline = time.monotonic() + 90
    while not run.done() and time.monotonic() < deadline:
        field = page.locator("input.action")
        try:
            field.wait_for(state="visible", timeout=1000)
        except PlaywrightTimeout:  # no move awaited yet (or the run is over)
            continue
        game = page.locator("section.game").last
        text = game.inner_text()
        told_invalid = told_invalid or "Invalid move" in text
        hint = page.locator("#hint")
        if hint.count() and "must match the pattern" in hint.inner_text():
            move = give_all(counts(text))
        else:
            move = "" if not moves else "<selection>"
        if len(moves) == 1:
            page.screenshot(path=ARTIFACTS / "human.png", full_page=True)
        before = page.locator("#status").get_attribute("data-version")
        field.fill(move)
        field.press("Enter")
        moves.append(move)
        # The move is taken when the page shows a newer state (the move in the history).
        expect(page.locator("#status")).not_to_have_attribute("data-version", before or "")
    result = run.result(30)
    assert told_invalid, "the page said why the empty message was invalid"
    expect(page.locator("section.game .over").last).to_be_visible()
    page.screenshot(path=ARTIFACTS / "human-over.png", full_page=True)
    (ep,) = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").open()]
    assert ep["status"] == "ok"
    played = [s["actions"]["player_0"] for s in ep["steps"] if "player_0" in s["actions"]]
    assert played == moves
    assert result.summary["episodes"]["ok"] == 1
    loop.call(server.close)


TRAIN = """
scenario: negotiation/simple-trade-v0
scenario_kwargs: {{max_turns: 2}}
model: {model}
policies: [shared]
agent: {{max_tokens: 6, system_prompt: true}}
sampler: {{batch_size: 4, staleness: 1, concurrency: 8}}
pg: {{estimator: reinforce, grouping: role, lr: 0.0001}}
stages:
  - name: self-play
    agents: {{player_0: "policy:shared", player_1: "policy:shared"}}
    train: [shared]
    max_updates: 4
progress: false
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_training_dashboard_updates_while_parley_train_runs(
    page: Page, loop: LoopThread, tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(TRAIN.format(model=tiny_model_dir))
    runs = tmp_path / "runs"
    runs.mkdir()
    out = runs / "trained"
    cmd = [sys.executable, "-m", "parley.arena.cli", "train", "--config", str(config)]
    proc = subprocess.Popen([*cmd, "--out", str(out)], stdout=subprocess.DEVNULL)
    runner, url = _viewer(loop, [runs])
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").exists():
            assert proc.poll() is None, "parley train stopped before its first update"
            assert time.monotonic() < deadline
            time.sleep(0.5)
        page.goto(url + "train/trained")
        status = page.locator("#status")
        expect(status).to_have_attribute("data-updates", re.compile(r"[1-9]"), timeout=30_000)
        first = int(status.get_attribute("data-updates") or 0)
        assert proc.poll() is None or first < 4, "the page saw the run while it ran"
        # Rows arrive by server push while training goes on: no reload.
        expect(status).to_have_attribute("data-updates", "4", timeout=240_000)
        expect(status).to_contain_text("finished", timeout=60_000)
        assert first < 4
        expect(page.locator(".chart[data-name=reward]")).to_contain_text("player_1")
        expect(page.locator("#stage-table")).to_contain_text("self-play")
        page.screenshot(path=ARTIFACTS / "training.png", full_page=True)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        loop.call(runner.cleanup)


def test_the_seat_page_shows_a_hostile_partner_as_text(
    page: Page, loop: LoopThread, tmp_path: Path
) -> None:
    server = human.hub()
    seat = resolve_agent_spec("human", SeatContext(SCENARIO, "player_0"))
    config = RunConfig(
        SCENARIO,
        agents={"player_1": "tests.arena.view.hostile:MarkupAgent"},
        episodes=1,
        out=str(tmp_path),
        progress=False,
        act_timeout=60,
    )
    run = loop.submit(lambda: Runner(config, agents={"player_0": seat}).run())  # type: ignore[dict-item]
    page.goto(server.url_for("player_0"))
    saw_payload = False
    deadline = time.monotonic() + 60
    while not run.done() and time.monotonic() < deadline:
        field = page.locator("input.action")
        try:
            field.wait_for(state="visible", timeout=1000)
        except PlaywrightTimeout:
            continue
        saw_payload = saw_payload or "<script>window.__xss = 1</script>" in page.inner_text("main")
        hint = page.locator("#hint")
        chose = hint.count() and "must match" in hint.inner_text()
        before = page.locator("#status").get_attribute("data-version")
        field.fill("no agreement" if chose else "hello")
        field.press("Enter")
        expect(page.locator("#status")).not_to_have_attribute("data-version", before or "")
    run.result(30)
    assert saw_payload, "the partner's markup was shown to the person, as text"
    assert page.evaluate("window.__xss") is None
    assert page.locator("main script, main img").count() == 0
    loop.call(server.close)
