"""The bench's broadcast scenario (every seat acts every step) as a test fixture: tests
register it under an entry point in ``tests.``, which the suites over the library's own
scenarios (conformance, noninterference, scripted agents) leave out."""

from parley.arena.bench.env import Broadcast
from parley.scenarios import register

__all__ = ["Broadcast", "register_broadcast"]


def register_broadcast(scenario_id: str) -> str:
    """Register the broadcast scenario as ``scenario_id`` (each seat's baseline: the
    bench's ``Chatter``); returns the id."""
    register(
        scenario_id,
        "tests.arena.run.broadcast_fixture:Broadcast",
        baselines={"*": "parley.arena.bench.env:Chatter"},
        description="every seat says one line a step",
        override=True,
    )
    return scenario_id
