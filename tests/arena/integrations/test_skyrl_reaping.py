"""ParleyTextEnv's reaping (as the review found in verl's tool): an episode is reaped when no
call of its trajectory came in ``idle_calls`` calls of the arena; one whose step is still
being played (its partner slow to answer) is not idle, and must not be reaped from under its
own step when other trajectories make calls meanwhile."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("skyrl_gym")

import skyrl_gym

from parley.agents.scripted.collaboration import CodeListener
from parley.arena.integrations.skyrl_env import dataset_rows, register, shutdown
from parley.protocols.messages import Action, Observation
from tests.arena.integrations.test_skyrl import _make

pytestmark = pytest.mark.timeout(120)

ENV = "parley-test-slow-partner"
ASKED, OPEN = threading.Event(), threading.Event()


class _SlowFirst(CodeListener):
    """The listener; the first one made answers only once the test opens the gate."""

    made = 0

    def __init__(self) -> None:
        super().__init__()
        _SlowFirst.made += 1
        self.slow = _SlowFirst.made == 1

    async def act(self, observation: Observation) -> Action:
        if self.slow:
            ASKED.set()
            await asyncio.to_thread(OPEN.wait, 60)
        return await super().act(observation)


@pytest.fixture
def env_id() -> Iterator[str]:
    settings: dict[str, Any] = {
        "scenario": "collaboration/referential-v1",
        "learner": "speaker",
        "agents": [f"{__name__}:_SlowFirst"],
        "idle_calls": 3,
        "max_sessions": 16,
    }
    register(ENV, **settings)
    yield ENV
    skyrl_gym.envs.registration.deregister(ENV)
    shutdown()  # (the arena thread's run holds the process's frozen heap)


def test_an_episode_whose_step_is_being_played_is_not_idle(env_id: str) -> None:
    ASKED.clear()
    OPEN.clear()
    _SlowFirst.made = 0
    rows = dataset_rows(env_id, 8, seed=1)
    slow = _make(env_id, rows[0])
    slow.init(json.loads(json.dumps(rows[0]["prompt"])))
    out: list[Any] = []
    errors: list[BaseException] = []

    def play() -> None:
        try:
            out.append(slow.step("ab"))
        except BaseException as exc:  # (reported below, in the test's thread)
            errors.append(exc)

    stepping = threading.Thread(target=play)
    stepping.start()
    assert ASKED.wait(30)
    others = []
    for row in rows[1:]:  # other trajectories' calls while the slow one's step is played
        env = _make(env_id, row)
        env.init(json.loads(json.dumps(row["prompt"])))
        env.step("ab")
        others.append(env)
    OPEN.set()
    stepping.join(60)
    assert not errors, errors
    assert out, "the step did not return"
    assert out[0]["done"], out
    assert slow.get_metrics()["parley_failed"] == 0.0
    for env in [slow, *others]:
        env.close()
