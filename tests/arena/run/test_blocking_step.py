"""A scenario whose step blocks (code/debug runs sandboxed subprocesses) is stepped in a
worker thread, so other episodes go on meanwhile (``metadata["blocking_step"]``)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from parley.scenarios import register
from tests.arena.run.test_runner import CountEnv

SCENARIO = "test/blocking-count-v0"


class BlockingCountEnv(CountEnv):
    """CountEnv whose every step waits (blocking the thread) for another episode's step."""

    metadata: ClassVar[dict[str, Any]] = {**CountEnv.metadata, "name": SCENARIO}
    meet: ClassVar[threading.Barrier] = threading.Barrier(2, timeout=10)

    def step(self, actions: dict[str, str]) -> tuple[Any, Any, Any, Any, Any]:
        # Two episodes' steps can only meet here if neither blocks the event loop.
        BlockingCountEnv.meet.wait()
        return super().step(actions)


register(
    SCENARIO,
    f"{__name__}:BlockingCountEnv",
    baselines={"*": "tests.arena.run.test_runner:TargetAgent"},
    description="test scenario: steps that block their thread",
    override=True,
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("blocking", [True, False])
def test_blocking_steps_run_off_the_event_loop(blocking: bool) -> None:
    BlockingCountEnv.metadata = {**CountEnv.metadata, "name": SCENARIO, "blocking_step": blocking}
    BlockingCountEnv.meet = threading.Barrier(2, timeout=10 if blocking else 0.5)
    config = RunConfig(scenario=SCENARIO, episodes=2, concurrency=2, progress=False)
    episodes = run(config).summary["episodes"]
    if blocking:
        assert episodes == {"total": 2, "ok": 2, "failed": 0}
    else:  # stepped on the loop, the first step waits alone: the barrier breaks
        assert episodes["failed"] >= 1
