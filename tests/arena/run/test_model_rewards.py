"""The reward model as a run's reward component (``parley run --reward-model``), in-process
and through a pool ``parley serve --reward-model`` started, on the tiny model."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.arena.cli import main
from parley.arena.run.model_rewards import canonical, scored_text, shown_items, shown_text
from parley.protocols.errors import ConfigError

torch = pytest.importorskip("torch")
from parley.arena.inference.backends.scorer import (  # noqa: E402
    SequenceScorer,
)

SCENARIO = "negotiation/deal-or-no-deal-v0"
RUN = ["--episodes", "2", "--no-progress", "-s", "max_turns=2"]


@pytest.fixture(scope="module")
def rm_dir(tiny_rm_dir: Path) -> Path:
    return tiny_rm_dir


@pytest.fixture(scope="module")
def scorer(rm_dir: Path) -> SequenceScorer:
    return SequenceScorer.load(rm_dir)


def _expected(scorer: SequenceScorer, transcript: dict[str, Any], seat: str) -> float:
    """The reward model's own score of what the component scores for ``seat``."""
    items = [{**i, "text": canonical(i["text"])} for i in shown_items(transcript, seat)]
    return scorer.score([scored_text(shown_text(items))])[0]


def _read(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    transcripts = [json.loads(line) for line in (out / "transcripts.jsonl").open()]
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").open()]
    return transcripts, trajectories, json.loads((out / "summary.json").read_text())


@pytest.mark.timeout(120)
def test_parley_run_with_a_reward_model(
    rm_dir: Path, scorer: SequenceScorer, tmp_path: Path
) -> None:
    from parley.arena.view.episode import _cell

    out = tmp_path / "out"
    args = ["run", SCENARIO, *RUN, "--out", str(out), "--reward-model", str(rm_dir)]
    assert main([*args, "--rm-weight", "0.5"]) == 0
    transcripts, trajectories, summary = _read(out)
    for transcript in transcripts:
        last = transcript["steps"][-1]
        for seat, entry in transcript["rm"].items():
            assert entry["score"] == pytest.approx(
                0.5 * _expected(scorer, transcript, seat), abs=1e-4
            )
            assert last["infos"][seat]["components"]["rm"] == entry["score"]
            assert "rm" in _cell(seat, last)  # the viewer shows it with the components
    for trajectory in trajectories:  # what exports and trainers read
        assert "rm" in trajectory["components"]
        assert trajectory["reward"] == pytest.approx(sum(trajectory["components"].values()))
    assert summary["metrics"]["rm_failed"]["mean"] == 0.0
    assert "rm" in summary["metrics"]


@pytest.fixture
def served(tiny_model_dir: Path, rm_dir: Path) -> Iterator[str]:
    """A pool (``parley serve``'s :func:`serving`) with the reward model, in a thread of
    its own; yields its bus address."""
    from parley.arena.cli.serve import ServeOptions, serving

    options = ServeOptions(
        model=str(tiny_model_dir),
        listen="tcp://127.0.0.1:0",
        policy="tiny",
        reward_models=(("graded", str(rm_dir)),),
    )
    address: list[str] = []
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        try:
            async with serving(options) as (bound, _, _):
                address.append(bound)
                ready.set()
                await stop.wait()
        finally:
            ready.set()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    try:
        assert ready.wait(60)
        assert address, "the pool did not start"
        yield address[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


@pytest.mark.timeout(120)
def test_a_run_scores_through_the_pool_parley_serve_started(
    served: str,
    rm_dir: Path,
    scorer: SequenceScorer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``parley serve --reward-model NAME=DIR`` serves the score bus kind; a run naming a
    directory called NAME is scored there (the same numbers as the model's own); a run
    naming a reward model the pool lacks stops before play (exit 2)."""
    named = tmp_path / "graded"
    named.symlink_to(rm_dir)
    out = tmp_path / "out"
    args = ["run", SCENARIO, *RUN, "--pool", served]
    assert main([*args, "--out", str(out), "--reward-model", str(named)]) == 0
    transcripts, _, _ = _read(out)
    for transcript in transcripts:
        for seat, entry in transcript["rm"].items():
            assert entry["score"] == pytest.approx(_expected(scorer, transcript, seat), abs=1e-4)
    # A reward model the pool lacks stops the run before play, naming what to start.
    other = tmp_path / "other"
    assert main([*args, "--out", str(other), "--reward-model", str(rm_dir)]) == 2
    assert f"does not score with reward model {rm_dir.name!r}" in capsys.readouterr().err
    assert not (other / "transcripts.jsonl").exists()


@pytest.mark.timeout(60)
def test_reward_model_options_are_checked_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from parley.arena.run.config import RunConfig

    assert main(["serve", "--model", "x", "--reward-model", str(tmp_path)]) == 2
    assert "no reward model at" in capsys.readouterr().err
    assert main(["run", SCENARIO, *RUN, "--reward-model", str(tmp_path)]) == 2
    assert "parley train-rm" in capsys.readouterr().err
    # No pool at --pool: said within the probe's 5 s, before any episode waits for it.
    absent = ["--pool", "tcp://127.0.0.1:9", "--reward-model", "models/rm"]
    assert main(["run", SCENARIO, *RUN, "--out", str(tmp_path / "o"), *absent]) == 2
    assert "no inference pool answers at tcp://127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "o" / "transcripts.jsonl").exists()
    with pytest.raises(ConfigError, match="rm_scope"):
        RunConfig(SCENARIO, rm_scope="team")
    with pytest.raises(ConfigError, match="rm_weight"):
        RunConfig(SCENARIO, rm_weight=float("nan"))


@pytest.mark.timeout(60)
async def test_episode_scope_scores_every_seat_s_moves_once(scorer: SequenceScorer) -> None:
    """``--rm-scope episode``: one score of every seat's moves, given to every seat."""
    from parley.arena.inference.backends.scorer import ScoreBatcher
    from parley.arena.run.config import RunConfig
    from parley.arena.run.model_rewards import ScoredReward
    from parley.arena.run.runner import Runner

    config = RunConfig(SCENARIO, episodes=1, progress=False, scenario_kwargs={"max_turns": 2})
    (record,) = (await Runner(config, keep_records=True).run()).records
    batcher = ScoreBatcher(scorer)
    component = ScoredReward(batcher.score, scope="episode")
    try:
        await component.apply(record)
    finally:
        await batcher.close()
    items = [{**i, "text": canonical(i["text"])} for i in shown_items(record.transcript, None)]
    (expected,) = scorer.score([scored_text(shown_text(items))])
    assert component.requests == 1
    for trajectory in record.trajectories:
        assert trajectory.components["rm"] == pytest.approx(expected, abs=1e-4)
