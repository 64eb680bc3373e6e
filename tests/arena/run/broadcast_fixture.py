"""The bench's broadcast scenario (every seat acts every step) as a test fixture: tests
register it under an entry point in ``tests.``, which the suites over the library's own
scenarios (conformance, noninterference, scripted agents) leave out."""

from parley.arena.bench.env import Broadcast

__all__ = ["Broadcast"]
