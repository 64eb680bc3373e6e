"""What a run does to its process: when play began, and the GC's view of the old heap.

:class:`PlayClock` times play apart from binding and joining (``summary["timing"]``);
:func:`frozen_heap` keeps the cyclic garbage collector's full collections off the objects
that were alive when the run opened (see its docstring for the measured cost).
"""

from __future__ import annotations

import contextlib
import gc
import time

__all__ = ["PlayClock", "frozen_heap"]


class PlayClock:
    """When play began (binding and joining are not play) and the episodes' waits summed."""

    def __init__(self) -> None:
        self.started = 0.0
        self.cpu_started = 0.0
        self.agents_s = 0.0

    def start(self) -> None:
        """An episode starts (the first call sets the start of play)."""
        if not self.started:
            self.started = time.perf_counter()
            self.cpu_started = time.process_time()

    def play_s(self) -> float:
        """Seconds since play began (0.0 before)."""
        return time.perf_counter() - self.started if self.started else 0.0

    def play_cpu_s(self) -> float:
        """CPU seconds this process spent since play began (0.0 before): what play cost
        it, whatever else the machine ran meanwhile."""
        return time.process_time() - self.cpu_started if self.started else 0.0


def frozen_heap() -> contextlib.ExitStack:
    """Keep the cyclic GC's full collections off the objects alive when a run opens.

    A run's transcripts live for a whole episode, so they reach the oldest GC generation and
    set off full collections, each of which walked every object of the process (modules,
    scenario registry: ~40 ms for ~40,000 objects, measured; ~40 % of an in-process runner's
    time on the bench). Those objects are moved to the permanent generation
    (:func:`gc.freeze`) until the returned stack is closed, then handed back to the collector
    (:func:`gc.unfreeze`): nothing is ever left uncollected after the run. Skipped when the
    process already froze objects itself or turned the collector off.
    """
    stack = contextlib.ExitStack()
    if gc.isenabled() and gc.get_freeze_count() == 0:
        gc.freeze()
        stack.callback(gc.unfreeze)
    return stack
