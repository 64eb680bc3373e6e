"""A parley scenario as a NeMo Gym resources server (``gymnasium`` contract): NeMo Gym's own
rollout collection, ``gymnasium_agent`` and ``vllm_model`` servers (nemo-gym 0.4.0, in its
own Python 3.12 environment) play it with ``parley serve --http`` as the policy, and score
each episode as ``parley run`` does; the contract's answers in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("openenv")  # the server reuses the OpenEnv server's loopback guard

from parley.arena.integrations.learner import LearnerArena
from parley.arena.integrations.nemo_gym import SESSION_COOKIE, create_nemo_gym_app, dataset_rows
from tests.arena.integrations.test_verifiers import parley_run, served  # noqa: F401 - fixture

NEMO_PYTHON = Path(sys.prefix) / "nemo-gym" / "bin" / "python"  # the Makefile's, if built
SCRIPT = Path(__file__).with_name("nemo_gym_rollouts.py")
SCENARIO = "collaboration/referential-v1"

pytestmark = pytest.mark.timeout(60)


def _reply(text: str) -> dict:
    """A Responses-API object whose output message says ``text``."""
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"output": [{"type": "message", "role": "assistant", "content": content}]}


async def test_a_rollout_over_the_contract_sums_to_the_seats_return() -> None:
    async with LearnerArena(SCENARIO, learners=["listener"]) as arena:
        app = create_nemo_gym_app(arena)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            step = await client.post("/step", json={"response": _reply("1")})
            assert step.status_code == 409
            assert step.json()["code"] == "no_episode"
            (row,) = list(dataset_rows(arena, seed=5, episodes=1))
            first = await client.post("/reset", json=row)
            assert first.status_code == 200
            assert SESSION_COOKIE in first.cookies
            assert first.json()["observation"].startswith("Message:")
            last = await client.post("/step", json={**row, "response": _reply(" 1 ")})
            body = last.json()
            assert body["terminated"]
            assert body["reward"] == body["info"]["returns"]["listener"]
            assert set(body["info"]["metrics"]) >= {"success", "turns"}
            over = await client.post("/step", json={**row, "response": _reply("1")})
            assert over.json()["code"] == "no_episode"  # the finished rollout's session is gone


async def test_a_failed_episode_is_an_error_not_a_zero_reward() -> None:
    async with LearnerArena(SCENARIO, learners=["listener"], max_steps=1) as arena:
        transport = httpx.ASGITransport(app=create_nemo_gym_app(arena))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            reset = await client.post("/reset", json={"seed": 3})
            assert reset.status_code == 409
            assert reset.json()["code"] == "episode_failed"
            assert "max_steps" in reset.json()["detail"]
            bad = await client.post("/reset", json={"seed": -1})
            assert bad.status_code == 422
        assert arena.sessions == 0


@pytest.fixture
def resources_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``python -m parley.arena.integrations.nemo_gym``: (its URL, the dataset it wrote)."""
    rows = tmp_path / "rows.jsonl"
    cmd = [sys.executable, "-m", "parley.arena.integrations.nemo_gym", SCENARIO]
    cmd += ["--learner", "listener", "--dataset", str(rows), "--episodes", "6", "--seed", "3"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("nemo-gym: serving"), line + proc.stdout.read()
        yield line.split(" at ")[1].strip(), rows
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.mark.long
@pytest.mark.timeout(400)
def test_nemo_gym_rollout_collection_scores_as_parley_run(
    served: tuple[Path, str, str],  # noqa: F811 - the fixture
    resources_server: tuple[str, Path],
    tmp_path: Path,
) -> None:
    if not NEMO_PYTHON.exists():
        pytest.skip(
            f"no {NEMO_PYTHON}: nemo-gym needs Python 3.12 (make install-nemo-gym builds it)"
        )
    model, pool, url = served
    resources, rows = resources_server
    out = tmp_path / "rollouts.jsonl"
    done = subprocess.run(
        [str(NEMO_PYTHON), str(SCRIPT), resources, url, str(rows), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rollouts = [json.loads(line) for line in out.read_text().splitlines()]
    parley = parley_run(model, pool, tmp_path / "run")

    assert [r["ok"] for r in rollouts] == [True] * 6, rollouts
    assert sorted(r["seed"] for r in rollouts) == sorted(parley)
    for rollout in rollouts:
        result, row = rollout["result"], parley[rollout["seed"]]
        assert result["reward"] == row["returns"]["listener"]
        assert result["info"]["metrics"] == row["metrics"]
        said = [
            part["text"]
            for item in result["response"]["output"]
            if item.get("type") == "message" and item.get("role") == "assistant"
            for part in item["content"]
        ]
        played = [s["actions"]["listener"] for s in row["steps"] if "listener" in s["actions"]]
        assert [text.strip() for text in said] == played
