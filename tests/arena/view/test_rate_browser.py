"""Rate mode in a real browser (headless Chromium via Playwright): a person's clicks become
preferences.jsonl rows, and (long) a reward model trained on 20 of them ranks held-out pairs.

The runs are played by the real runner: seat player_0 is :class:`PoliteAgent`, which opens
with ``hello`` and ends with ``no agreement``, both followed by ``please`` for half its agent
seeds (so two trials of one task differ there alone, or not at all), and the synthetic
preference is "the one that says please".
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation
from tests.arena.view.browser import ARTIFACTS, LoopThread, find_chromium, skip_unless_ci

skip_unless_ci()
CHROMIUM = find_chromium()
if CHROMIUM is not None:
    from playwright.sync_api import Page, expect

from parley.arena.run.config import RunConfig  # noqa: E402
from parley.arena.run.runner import Runner  # noqa: E402
from parley.arena.view.data import discover  # noqa: E402
from parley.arena.view.rate import PREFERENCES, Rating, shown_text, trl_fields  # noqa: E402
from parley.arena.view.server import start  # noqa: E402

SCENARIO = "negotiation/deal-or-no-deal-v0"
POLITE = "tests.arena.view.test_rate_browser:PoliteAgent"
MARKUP = '<img src=x onerror="window.__xss = 1">'


class PoliteAgent(Agent):
    """Opens with ``hello`` and markup that must stay text, says ``<selection>``, then no
    agreement; ``please`` after the first and the last for half its seeds."""

    def reset(self, seed: int | None = None) -> None:
        rng = random.Random(seed)
        self.please = " please" if rng.random() < 0.5 else ""
        self.turns = 0

    async def act(self, observation: Observation) -> Action:
        self.turns += 1
        if observation.info.get("view", {}).get("phase") == "choose":
            text = "no agreement" + self.please
        else:
            text = f"hello{self.please} {MARKUP}" if self.turns == 1 else "<selection>"
        return Action(agent=observation.agent, text=text)


def polite_run(loop: LoopThread, folder: Path, tasks: int) -> Path:
    """``tasks`` tasks x 2 trials of PoliteAgent against the scripted player_1 (run on the
    loop's thread: Playwright's sync API holds an event loop in this one)."""
    agents = [POLITE, "scripted"]
    config = RunConfig(
        SCENARIO, agents=agents, episodes=tasks, trials=2, out=str(folder), progress=False
    )
    loop.call(lambda: Runner(config).run(), timeout=120)
    return folder


def rate_in_browser(page: Page, url: str, n: int) -> list[str]:
    """Rate ``n`` pairs as a person following the synthetic preference; the choices."""
    page.goto(url)
    choices = []
    for i in range(n):
        expect(page.locator("#status")).to_contain_text(f"{i} rated")
        a, b = (page.locator(f"#side-{s}").inner_text() for s in "AB")
        choice = "A" if "please" in a else "B" if "please" in b else "tie"
        if i == 0:
            expect(page.locator("#side-A")).to_contain_text(MARKUP)  # as text
            page.screenshot(path=ARTIFACTS / "rate.png", full_page=True)
            page.fill("#reason", "says please")
        page.click(f"#choose-{choice}")
        choices.append(choice)
    expect(page.locator("#status")).to_contain_text(f"{n} rated")
    return choices


def test_a_person_rates_a_pair_in_the_browser(page: Page, loop: LoopThread, tmp_path: Path) -> None:
    folder = polite_run(loop, tmp_path / "run", 6)
    rating = Rating(folder, raters=["ann"], seat="player_0")
    runner, url = loop.call(lambda: start([folder], rating=rating))
    try:
        (ann,) = rating.urls(url).values()
        choices = rate_in_browser(page, ann, 1)
        assert page.evaluate("window.__xss") is None  # the markup shown never ran
        assert page.locator("#rate img").count() == 0
    finally:
        loop.call(runner.cleanup)
    (row,) = [json.loads(line) for line in (folder / PREFERENCES).open()]
    assert row["choice"] == choices[0] != "tie"
    assert row["rater"] == "ann"
    assert row["reason"] == "says please"
    assert "please" in row["chosen"]
    assert "please" not in row["rejected"]


@pytest.mark.long
@pytest.mark.timeout(300)
def test_ratings_from_the_browser_train_a_reward_model(
    page: Page, loop: LoopThread, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from parley.arena.cli import main
    from parley.arena.training.reward_model import Preference, load_reward_model, pair_accuracy

    folder = polite_run(loop, tmp_path / "run", 120)
    # Every seat's moves (~120 tokens an episode; seat player_0's view is ~300, and the tiny
    # model then took 4x the CPU and missed the please at the start).
    rating = Rating(folder, raters=["ann"], rng=random.Random(0))
    runner, url = loop.call(lambda: start([folder], rating=rating))
    try:
        (ann,) = rating.urls(url).values()
        choices = rate_in_browser(page, ann, 20)
    finally:
        loop.call(runner.cleanup)
    assert "tie" not in choices  # (every pair offered differs by the please alone)
    rows = [json.loads(line) for line in (folder / PREFERENCES).open()]
    assert len(rows) == 20
    assert all("please" in r["chosen"] and "please" not in r["rejected"] for r in rows)

    # 20 held-out pairs: pairs not rated, labelled by the same preference.
    rated = {frozenset((r["a"]["digest"], r["b"]["digest"])) for r in rows}
    held_out: list[Preference] = []
    for a, b in rating.candidates(discover([folder])):
        key = frozenset((a.digest, b.digest))
        if key not in rated and len(held_out) < 20:
            rated.add(key)
            fields = trl_fields(a, b, "A" if "please" in shown_text(a.items) else "B")
            held_out.append(Preference(fields["prompt"], fields["chosen"], fields["rejected"]))
    assert len(held_out) == 20, "the run has too few pairs: play more tasks"

    out = tmp_path / "rm"
    argv = ["train-rm", "--data", str(folder / PREFERENCES), "--model", str(tiny_model_dir)]
    assert main([*argv, "--out", str(out), "--lr", "3e-4"]) == 0
    model, tokenizer = load_reward_model(out)
    accuracy = pair_accuracy(model, tokenizer, held_out)
    # Above chance: 15 of 20 or more (one-sided binomial p = 0.021 under chance).
    assert accuracy >= 0.75, accuracy
