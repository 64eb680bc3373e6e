"""What runs inside a Ray worker actor, and how its records travel back to the driver.

:class:`EpisodeWorker` is the body of each worker actor of
:class:`~parley.arena.run.ray_runner.RayRunner`: the ordinary runner with its in-process
agents, fed slices of the plan. Its records travel back as compressed MessagePack
(:func:`ship`); what of each record travels is the driver's choice (:data:`Steps`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import zlib
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
import numpy as np
from rich.console import Console

from parley.arena.run.config import RunConfig
from parley.arena.run.episode import EpisodePlan
from parley.arena.run.records import EpisodeRecord, encode_json
from parley.arena.run.runner import Runner

__all__ = ["EpisodeWorker", "Steps", "ship"]


def _ship_hook(obj: Any) -> Any:
    # What a transcript may hold beyond MessagePack's types: the values the files get.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (np.ndarray, set, frozenset)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else obj.tolist()
    return f"<unserializable {type(obj).__name__}>"


RESULT_ENCODER = msgspec.msgpack.Encoder(enc_hook=_ship_hook)
"""Records travel from workers as MessagePack, not pickles: about twice as fast both ways
for a transcript's many small strings, and a field left at its default stays absent (a
pickled ``0.0`` reward is a new object, which ``omit_defaults`` then writes out)."""
SHIP_ZLIB_LEVEL = 1
"""A slice's MessagePack is zlib-compressed (level 1) before it travels: transcripts repeat
their observations, so 8 deal-or-no-deal records shrink from 86 KB to 8 KB for 0.25 ms each
way. An actor call's cost grows with its payload (measured here: 0.8 ms of the worker's CPU
for 8 KB, 1.2 ms for 90 KB, 1.6 ms past 100 KB, where Ray moves results to its object store)."""


Steps = Literal["items", "json", "none"]
"""What a worker ships of each record (:meth:`EpisodeWorker.play`)."""


def ship(items: list[Any]) -> bytes:
    """What a worker returns for ``items``: MessagePack, compressed (:data:`SHIP_ZLIB_LEVEL`)."""
    return zlib.compress(RESULT_ENCODER.encode(items), SHIP_ZLIB_LEVEL)


class EpisodeWorker:
    """Body of one Ray worker actor: a :class:`Runner` whose bus stays open between calls.

    The driver calls :meth:`start` once, then :meth:`play` with slices of the plan (any
    number at once: the actor is asynchronous), and :meth:`stop` at the end.
    """

    def __init__(self, config: RunConfig, agents: dict[str, Any] | None = None) -> None:
        quiet = Console(stderr=True, quiet=True)
        self.runner = Runner(config.replace(progress=False, out=None), agents=agents, console=quiet)
        self._open: contextlib.AbstractAsyncContextManager[str] | None = None
        self._concurrency = max(1, config.concurrency)
        self._room: asyncio.Semaphore | None = None  # made in the actor's event loop

    async def start(self) -> dict[str, Any]:
        """Open the worker's bus; returns where it runs (node id, address, pid)."""
        if self._open is None:
            self._open = self.runner.open()
            await self._open.__aenter__()
        import ray

        context = ray.get_runtime_context()
        return {"node": context.get_node_id(), "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
                "pid": os.getpid()}  # fmt: skip

    async def play(self, plans: Sequence[EpisodePlan], steps: Steps = "items") -> bytes:
        """Play ``plans`` (at most ``concurrency`` at once); what travels back for their
        records, in the same order, as compressed MessagePack (:func:`ship`): with
        ``steps="items"`` :meth:`items`; with ``"json"`` each record paired with its
        transcript as the JSON line the files hold (the driver writes those bytes and
        never decodes them); with ``"none"`` records played without transcript steps or
        trajectory turns (a run that writes no files and keeps no records reads only what
        its summary sums, as :meth:`Runner.run` then builds no more)."""
        await self.start()
        keep = steps != "none"
        records = await asyncio.gather(*(self._play(plan, keep) for plan in plans))
        if steps == "json":
            return ship([(dataclasses.replace(r, transcript={}), encode_json(r.transcript))
                         for r in records])  # fmt: skip
        return ship(self.items(records))

    async def _play(self, plan: EpisodePlan, keep_steps: bool = True) -> EpisodeRecord:
        # At most ``concurrency`` episodes at once, however many slices the driver has
        # sent ahead: the queued ones start the moment a running episode ends.
        if self._room is None:
            self._room = asyncio.Semaphore(self._concurrency)
        async with self._room:
            self.runner.keep_steps = keep_steps  # read as the episode starts, before any await
            return await self.runner.play(plan)

    def items(self, records: Sequence[EpisodeRecord]) -> list[Any]:
        """What travels back for ``records`` (of :attr:`RayRunner.item_type`)."""
        return list(records)

    async def stop(self) -> None:
        """Close the worker's bus."""
        if self._open is not None:
            opened, self._open = self._open, None
            await opened.__aexit__(None, None, None)
