"""The verifiers environment (``vf-eval parley-verifiers``): verifiers' own ``vf-eval``
against ``parley serve --http`` plays a learner seat, and scores each episode exactly as
``parley run`` does with the same model in that seat on the same seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers.v1")

from parley.agents.llm import parse_action
from parley.arena.integrations.verifiers_env import (
    RETURN_REWARD,
    ParleyTaskset,
    ParleyTasksetConfig,
)
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import plan_episodes
from tests.arena.inference.test_pool_serve import _read_line

BIN = Path(sys.executable).parent
MCP2 = Path(sys.prefix) / "verifiers-mcp"  # mcp 2.0.0, for vf-eval only (see the Makefile)
SCENARIO = "collaboration/referential-v1"
LISTENER = "max_tokens=6&temperature=0&use_constraints=0"  # greedy: both sides sample alike


def test_tasks_are_the_episodes_parley_run_plays() -> None:
    config = ParleyTasksetConfig(id="parley-verifiers", scenario=SCENARIO, seed=11, episodes=5)
    tasks = list(ParleyTaskset(config))
    plans = list(plan_episodes(RunConfig(scenario=SCENARIO, episodes=5, seed=11), ["a", "b"]))
    assert [task.data.seed for task in tasks] == [plan.seed for plan in plans]
    assert [task.data.idx for task in tasks] == list(range(5))
    assert all(task.data.prompt is None for task in tasks)  # the env opens each episode


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """``parley serve --http`` with the tiny model: (model dir, pool address, HTTP URL)."""
    pytest.importorskip("torch")
    from parley.arena.inference.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    cmd = [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(model)]
    cmd += ["--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0", "--policy", "tiny"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, bufsize=0, env=env)
    try:
        address = _read_line(proc, "pool listening on ", 90)
        url = _read_line(proc, "openai api on ", 10)
        yield model, address, url
    finally:
        proc.kill()
        proc.wait(10)


def _vf_eval(url: str, out: Path, *options: str) -> list[dict[str, Any]]:
    """The episodes ``vf-eval parley-verifiers`` wrote (its traces.jsonl rows)."""
    if not MCP2.is_dir():
        pytest.skip(f"no {MCP2}: `make install-vllm` installs verifiers' mcp 2 there")
    cmd = [str(BIN / "vf-eval"), "parley-verifiers", "--model", "tiny", "--no-push", "--no-rich"]
    cmd += ["--client.base-url", url, "--client.api-key-var", "PARLEY_TEST_KEY", "-o", str(out)]
    cmd += ["--sampling.temperature", "0", "--sampling.max-tokens", "6", *options]
    env = {**os.environ, "PYTHONPATH": str(MCP2), "PARLEY_TEST_KEY": "unused"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (traces,) = out.rglob("traces.jsonl")
    return [json.loads(line) for line in traces.read_text().splitlines()]


def parley_run(model: Path, pool: str, out: Path) -> dict[int, dict[str, Any]]:
    """``parley run``'s episodes (transcript rows by scenario seed): referential-v1, seed 3,
    6 episodes, the tiny model served at ``pool`` in the listener seat, greedy."""
    agents = f"scripted,llm:{model}?policy=tiny&{LISTENER}"
    cmd = [str(BIN / "parley"), "run", SCENARIO, "--agents", agents, "--pool", pool]
    cmd += ["--episodes", "6", "--seed", "3", "--no-progress", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (out / "transcripts.jsonl").read_text().splitlines()
    return {row["seed"]: row for row in map(json.loads, lines)}


@pytest.mark.long
@pytest.mark.timeout(400)
def test_vf_eval_scores_each_episode_as_parley_run_does(
    served: tuple[Path, str, str], tmp_path: Path
) -> None:
    model, pool, url = served
    episodes = _vf_eval(
        url,
        tmp_path / "vf",
        *("--env.taskset.scenario", SCENARIO, "--env.taskset.learner", "listener"),
        *("--env.taskset.episodes", "6", "--env.taskset.seed", "3"),
    )
    parley = parley_run(model, pool, tmp_path / "run")

    assert len(episodes) == 6
    assert all(episode["ok"] for episode in episodes)
    seen = {}
    for episode in episodes:
        (trace,) = episode["traces"]
        seed = trace["task"]["data"]["seed"]
        row = parley[seed]
        seen[seed] = trace["rewards"][RETURN_REWARD]["score"]
        assert seen[seed] == row["returns"]["listener"]
        assert {k[7:]: v for k, v in trace["metrics"].items() if k.startswith("metric/")} == (
            row["metrics"]
        )
        replies = [parse_action(n["message"]["content"], None) for n in trace["nodes"]]
        played = [
            step["actions"]["listener"] for step in row["steps"] if "listener" in step["actions"]
        ]
        assert [r for r, n in zip(replies, trace["nodes"], strict=True) if n["sampled"]] == played
    assert sorted(seen) == sorted(parley)


@pytest.mark.long
@pytest.mark.timeout(400)
def test_an_episode_the_policy_leaves_unfinished_is_an_error_not_a_zero(
    served: tuple[Path, str, str], tmp_path: Path
) -> None:
    # One model turn where deal-or-no-deal needs several: the parley episode is still on.
    episodes = _vf_eval(
        served[2],
        tmp_path,
        *("--env.taskset.scenario", "negotiation/deal-or-no-deal-v0"),
        *("--env.taskset.episodes", "2", "--env.player.max-turns", "1"),
    )
    assert len(episodes) == 2
    for episode in episodes:
        assert not episode["ok"]
        assert "ended before the episode did" in episode["errors"][0]["message"]
        assert all(RETURN_REWARD not in trace["rewards"] for trace in episode["traces"])
