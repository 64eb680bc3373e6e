"""Episodes on Ray: the same run spread over worker actors on every node of a Ray cluster.

``parley run … --ray [ADDRESS]`` (``ray:`` in YAML) plays the episode plan of a
:class:`~parley.arena.run.config.RunConfig` on ``ray_workers`` Ray actors (default: one per
CPU of the cluster). Each :class:`EpisodeWorker` runs the ordinary runner machinery
(:class:`~parley.arena.run.runner.Runner` with its in-process agents) on the slices of the
plan it is handed; the driver folds the records it gets back into the same
:class:`~parley.arena.run.records.RecordWriter` and
:class:`~parley.arena.run.summary.SummaryBuilder` as a single-host run. Seeds live in the plan
(:func:`~parley.arena.run.episode.plan_episodes`), so an episode played on any worker writes
the same transcript as in a local run.

Slices: up to ``8 x concurrency`` episodes each (one actor call; fewer when the plan is
short), three slices sent ahead to each worker, which plays at most ``concurrency`` episodes
at once (``concurrency`` is per worker here): the next slice's episodes start the moment
running ones end, never waiting for the driver, and a slice comes back as one compressed
MessagePack payload
(:func:`~parley.arena.run.ray_worker.ship`).

Faults: a slice whose worker dies (``ray.kill``, a crash, its node removed) is never
counted; its episodes go back to the front of the queue, are played again with the same
seeds by another worker (a replacement actor is started in the dead one's place), and are
listed in ``summary["ray"]["retried"]``. A slice that has lost ``MAX_ATTEMPTS`` workers is
recorded as failed (``worker_lost``) rather than retried forever. Replacements that cannot
start (no free CPU) are not waited for while other workers play; with none left, the run
stops after ``replacement_wait_s`` (:class:`RayWorkersLost`; a stall of the driver is given
back), and once the head's GCS port refuses connections for ``head_lost_after_s``
(:class:`RayHeadGone`), each with a partial summary. Per-node figures (workers, episodes,
agent steps, busy seconds): ``summary["ray"]["nodes"]``.

Ray is an optional extra (``pip install 'parley[ray]'``), imported only here and only when
used. Remote seats (``parley agent``) are not supported on Ray: workers host their agents.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from rich.markup import escape
from rich.table import Table

from parley.arena.run.config import RunConfig
from parley.arena.run.episode import EpisodeLog, EpisodePlan, plan_episodes
from parley.arena.run.ray_cluster import (
    LOCAL,
    HeadWatch,
    RayHeadGone,
    RayWorkersLost,
    import_ray,
    init_ray,
)
from parley.arena.run.ray_slots import Slice, SliceQueue, Slot, replace_off_loop
from parley.arena.run.ray_worker import EpisodeWorker, Steps
from parley.arena.run.records import EpisodeRecord, RecordWriter
from parley.arena.run.runner import Runner, RunResult
from parley.arena.run.summary import SummaryBuilder
from parley.protocols.errors import ConfigError

__all__ = [
    "LOCAL",
    "EpisodeWorker",
    "RayHeadGone",
    "RayRunner",
    "RayWorkersLost",
    "import_ray",
    "init_ray",
    "ray_table",
    "run_on_ray",
]

MAX_ATTEMPTS = 3
"""Workers a slice may lose before its episodes are recorded as failed (``worker_lost``)."""
MAX_LISTED_RETRIES = 1_000
"""Retried episode ids listed in the summary; the rest are counted."""
STALL_S = 0.05
"""A replacement's wait ending this late was a stall of the driver (stopped, its loop held):
on SIGCONT the timer fires before Ray's threads hand over a start that came in time, so
the lateness is waited again (at most ``replacement_wait_s``) before the verdict."""


class RayRunner(Runner):
    """A :class:`Runner` whose :meth:`run` plays the plan on Ray worker actors.

    ``workers`` overrides ``config.ray_workers`` (0: one per CPU of the cluster);
    ``actor_options`` are handed to ``ray.remote`` for each worker (default
    ``num_cpus=1``, ``max_restarts=0``: the driver replaces dead workers itself).
    :attr:`slots` lists the live and dead workers (tests kill them).

    Subclasses may set :attr:`worker_class` (an :class:`EpisodeWorker` whose ``items`` are
    more than records: the training runner ships constraint logs with each episode) with
    :attr:`item_type`, and override :meth:`_record` to take the record out of an item.
    """

    worker_class: type[EpisodeWorker] = EpisodeWorker
    item_type: Any = EpisodeRecord
    """The type of each item of what :attr:`worker_class`'s ``play`` returns."""
    slices_in_flight = 3
    """Slices :meth:`run` keeps sent to each worker (it plays ``concurrency`` episodes at
    once; the rest wait there, so it never idles while the driver reads a result)."""
    replacement_wait_s = 120.0
    """Seconds :meth:`run` waits for a replacement worker to start when no worker is left
    (a cluster with no free CPU never starts one); then it stops with
    :class:`RayWorkersLost` and a partial summary. While some worker plays, replacements
    are never waited for."""
    head_lost_after_s = 15.0
    """Seconds the Ray head's GCS port must refuse every connection before :meth:`run`
    stops with :class:`RayHeadGone` (Ray's client ends the process itself after 60 s)."""
    head_stuck_after_s = 10.0
    """Seconds the event loop has to end the run after the head-lost verdict; past them (a
    call blocked on the dead head holds it) the watch's thread writes the partial summary
    and ends the process, status 4 (:class:`~parley.arena.run.ray_cluster.HeadWatch`)."""
    slice_concurrency = 8
    """A slice (one actor call) is at most ``slice_concurrency x concurrency`` episodes, fewer
    when the plan is short (every worker gets ``slices_in_flight`` of them): an actor call
    costs the worker about 0.8 ms of CPU and the driver 0.6 ms (measured, 1.6 ms past Ray's
    100 KB inline limit), so fewer, larger calls. Measured alternating, 1 worker ÷ the
    local runner: 2x concurrency 0.79-0.80, 4x 0.93, 8x 0.86-0.98; a lost worker costs
    a re-run of at most ``slices_in_flight`` slices."""

    def __init__(
        self,
        config: RunConfig,
        *,
        workers: int | None = None,
        actor_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, **kwargs)
        if self._remote():
            raise ConfigError(
                "--ray plays in-process agents only (scripted, module:Class, llm:); remote "
                f"seats {sorted(self._remote())} need a single-host run with --listen"
            )
        from parley.arena.run.bus_replicas import BusReplicas

        listening = sorted(s for s, src in self.sources.items() if isinstance(src, BusReplicas))
        if listening:
            raise ConfigError(
                f"--ray cannot host seats {listening} of replicas:N:ADDRESS (their listener "
                "lives in one process); use replicas:N:SPEC, whose replicas are Ray actors"
            )
        self._agents = kwargs.get("agents")
        self._workers = config.ray_workers if workers is None else workers
        self._actor_options = {"num_cpus": 1, "max_restarts": 0, **(actor_options or {})}
        self.slots: list[Slot] = []
        self.retried: list[str] = []
        self.retried_count = 0
        self.workers_lost: list[str] = []
        self.startup_s = 0.0
        self._max_spawns = 0
        self._head_lost = False
        self._ray: Any = None
        self._decoder = msgspec.msgpack.Decoder(list[self.item_type])  # type: ignore[name-defined]
        self._json_decoder = msgspec.msgpack.Decoder(list[tuple[EpisodeRecord, bytes]])
        self._gathering: dict[str, list[tuple[EpisodePlan, asyncio.Future[Any]]]] = {}
        self._call_size = max(1, math.ceil(config.concurrency / 2))

    # ------------------------------------------------------------------ workers

    def _spawn(self, ray: Any) -> Slot:
        actor = self._create(ray)
        slot = Slot(f"worker-{len(self.slots)}", actor, actor.start.remote().future())
        self.slots.append(slot)
        return slot

    def _create(self, ray: Any) -> Any:
        cls = ray.remote(**self._actor_options)(self.worker_class)
        return cls.options(scheduling_strategy="SPREAD").remote(*self._worker_args())

    def _replace(self, ray: Any, lost: Slot) -> Slot:
        """A new slot in place of ``lost``'s worker, killed and replaced off the event loop
        (:func:`~parley.arena.run.ray_slots.replace_off_loop`): both calls block on the head."""
        slot = Slot(f"worker-{len(self.slots)}", None, concurrent.futures.Future())
        self.slots.append(slot)
        replace_off_loop(ray, lost, slot, self._create)
        return slot

    def _worker_args(self) -> tuple[Any, ...]:
        """Arguments of each :attr:`worker_class` actor."""
        return self.config.replace(ray=None), self._agents

    def _worker_count(self, ray: Any) -> int:
        if self._workers > 0:
            return self._workers
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    # ------------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        """Play every planned episode on Ray workers and write the output files."""
        started_ray = init_ray(self.config.ray)
        ray = import_ray()
        try:
            return await self._run(ray)
        finally:
            await self._stop_workers(ray)
            # With the head gone, ray.shutdown() waits on it (6 s measured, at load 10): the
            # process ends anyway, by its caller or by Ray's client 60 s after the head went.
            if started_ray and not self._head_lost:
                ray.shutdown()

    async def _stop_workers(self, ray: Any) -> None:
        if self._head_lost:  # nothing reaches them; they end with their cluster
            return
        live = [slot for slot in self.slots if slot.alive and slot.where]
        stops = [_await_ref(slot.actor.stop.remote()) for slot in live]
        with contextlib.suppress(Exception):  # a worker that died on the way out
            await asyncio.wait_for(asyncio.gather(*stops, return_exceptions=True), 10)
        for slot in self.slots:
            with contextlib.suppress(Exception):  # a dead or unreachable actor
                ray.kill(slot.actor)

    # ------------------------------------------------------------------ one episode at a time

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[str]:
        """Start the worker actors; yields the Ray address. Inside it, :meth:`play` plays
        one plan on the least-busy worker, as :meth:`Runner.play` does in-process (a
        sampler that keeps episodes running uses it unchanged)."""
        started_ray = init_ray(self.config.ray)
        ray = import_ray()
        try:
            wanted = self._worker_count(ray)
            for _ in range(wanted):
                self._spawn(ray)
            self._max_spawns = wanted * (MAX_ATTEMPTS + 2)
            for slot in self.slots:
                slot.where = await _await_ref(slot.started)
            self._ray = ray
            yield str(ray.get_runtime_context().gcs_address)
        finally:
            self._ray = None
            await self._stop_workers(ray)
            if started_ray:
                ray.shutdown()

    async def play(self, plan: EpisodePlan) -> EpisodeRecord:
        """Play ``plan`` on a worker actor; a worker that dies meanwhile is replaced and the
        episode played again elsewhere with the same seeds (failed after
        :data:`MAX_ATTEMPTS` lost workers)."""
        ray = self._ray
        if ray is None:
            raise ConfigError("play episodes inside RayRunner.open()")
        reasons: list[str] = []
        while len(reasons) < MAX_ATTEMPTS:
            live = [s for s in self.slots if s.alive and s.where]
            if not live:
                starting = [s for s in self.slots if s.alive]
                if not starting:
                    raise RuntimeError("no Ray worker is left to play episodes")
                try:
                    starting[0].where = await _await_ref(starting[0].started)
                except ray.exceptions.RayError as exc:
                    self._lost(ray, starting[0], None, exc, None, None)
                continue
            slot = min(live, key=lambda s: s.in_flight)
            slot.in_flight += 1
            try:
                result = await self._gathered(slot, plan)
            except ray.exceptions.RayActorError as exc:
                reasons.append(f"{slot.name}: {type(exc).__name__}")
                self._lost(ray, slot, None, exc, None, None)
                self.retried_count += 1
                if len(self.retried) < MAX_LISTED_RETRIES:
                    self.retried.append(plan.episode_id)
                continue
            finally:
                slot.in_flight -= 1
            return self._record(result)
        log = EpisodeLog(plan, self.config.scenario, self.seats, self.specs)
        log.failed = f"worker_lost: {MAX_ATTEMPTS} workers died playing it ({reasons[-1]})"
        return log.record()

    async def _gathered(self, slot: Slot, plan: EpisodePlan) -> Any:
        """``plan``'s item, played on ``slot`` in one actor call with the other plans handed
        to that worker in this turn of the event loop (at most ``ceil(concurrency / 2)``).

        A sampler starts a batch's episodes together: one call each made them reach the
        worker, and their generate requests the pool, spread out (measured: the training
        pool's mean batch fell from 64 to 6). A failed call fails each of its plays."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        waiting = self._gathering.setdefault(slot.name, [])
        waiting.append((plan, future))
        if len(waiting) == 1:
            loop.call_soon(self._send_gathered, slot)
        elif len(waiting) >= self._call_size:
            self._send_gathered(slot)
        return await future

    def _send_gathered(self, slot: Slot) -> None:
        waiting = self._gathering.pop(slot.name, None)
        if not waiting:  # sent already, full
            return
        call = asyncio.wrap_future(slot.actor.play.remote([p for p, _ in waiting]).future())
        futures = [f for _, f in waiting]

        def deliver(done: asyncio.Future[Any]) -> None:
            if done.cancelled():
                for f in futures:
                    f.cancel()
                return
            try:
                items = self._unship(done.result())
            except Exception as exc:  # a dead worker (RayActorError): each play retries
                for f in futures:
                    if not f.done():
                        f.set_exception(exc)
                return
            for f, item in zip(futures, items, strict=True):
                if not f.done():  # its play was cancelled meanwhile
                    f.set_result(item)

        call.add_done_callback(deliver)

    async def _run(self, ray: Any) -> RunResult:
        plans = plan_episodes(self.config, self.seats)
        started = time.perf_counter()
        kept: list[EpisodeRecord] | None = [] if self.keep_records else None
        builder = SummaryBuilder(trials=self.config.trials)
        steps = self._steps()
        workers = self._worker_count(ray)
        share = math.ceil(len(plans) / (workers * self.slices_in_flight))
        size = max(1, min(self.slice_concurrency * self.config.concurrency, share))
        queue = SliceQueue(plans.slices(size))
        wanted = min(workers, math.ceil(len(plans) / size)) or 1
        for _ in range(wanted):
            self._spawn(ray)
        self._max_spawns = wanted * (MAX_ATTEMPTS + 2)
        # Start-up errors (a bad agent class, a scenario that does not import) end the run
        # here, once, rather than as a stream of lost workers.
        for slot in self.slots:
            slot.where = await _await_ref(slot.started)
            slot.started = None
        piece: Slice | None
        self.startup_s = time.perf_counter() - started
        nodes: dict[str, dict[str, Any]] = {}
        done = bytearray(len(plans))  # 1 byte an episode, not a set's ~60
        duplicates = 0
        pending: dict[asyncio.Future[Any], tuple[Slot, Slice | None]] = {}
        state = threading.Lock()
        with RecordWriter(self.config.out) as writer, self._progress(len(plans)) as advance:

            def accept(record: EpisodeRecord, where: dict[str, Any], slot: str) -> None:
                nonlocal duplicates
                with state:  # (the head watch's last resort reads a whole state)
                    if done[record.index]:  # never counted twice, whatever Ray replays
                        duplicates += 1
                        return
                    done[record.index] = 1
                    builder.add(record)
                    writer.add(record)
                    advance(record)
                    node = nodes.setdefault(
                        where.get("node", "?"),
                        {"ip": where.get("ip", ""), "workers": [], "episodes": 0,
                         "failed": 0, "agent_steps": 0, "busy_s": 0.0},
                    )  # fmt: skip
                    if slot not in node["workers"]:
                        node["workers"].append(slot)
                    node["episodes"] += 1
                    node["failed"] += bool(record.failed)
                    node["agent_steps"] += record.agent_steps
                    node["busy_s"] += record.wall_s
                    if kept is not None:
                        kept.append(record)

            def partial() -> dict[str, Any]:  # (written, of the episodes accepted so far)
                summary = self._summary(builder, time.perf_counter() - started)
                summary["ray"] = self._ray_summary(ray, nodes, duplicates)
                summary.update(partial=True, episodes_planned=len(plans))
                writer.write_summary(summary)
                return summary

            def stuck() -> str:
                """The head watch's last resort, on its thread (the loop is blocked)."""
                if not state.acquire(timeout=5):  # (blocked inside accept)
                    return "with no summary written (the event loop held the records)"
                writer.close()  # every accepted episode written, whole
                total = partial()["episodes"]["total"]
                return f"after {total} of {len(plans)} episodes; summary.json is marked partial"

            watch = HeadWatch(
                ray,
                lost_after_s=self.head_lost_after_s,
                stuck_after_s=self.head_stuck_after_s,
                on_stuck=stuck,
            )
            head = watch.start()
            try:
                # Until every slice is played: replacement workers still starting are not
                # waited for once nothing is left (a node removed with one worker per CPU
                # leaves their replacements no CPU to start on: the run hung for ever).
                while queue or any(piece is not None for _, piece in pending.values()):
                    # Round-robin, one slice per worker per pass: a short plan spreads over
                    # every worker instead of filling the first ones' pipelines.
                    live = [s for s in self.slots if s.alive and s.where]
                    for _ in range(self.slices_in_flight):
                        for slot in live:
                            if queue and slot.in_flight < self.slices_in_flight:
                                piece = queue.popleft()
                                ref = slot.actor.play.remote(piece.plans, steps)
                                pending[asyncio.wrap_future(ref.future())] = (slot, piece)
                                slot.in_flight += 1
                    for slot in self.slots:  # replacements: wait for their start, not on them
                        if slot.alive and not slot.where and slot.started is not None:
                            pending[asyncio.wrap_future(slot.started)] = (slot, None)
                            slot.started = None
                    if not pending:
                        raise RayWorkersLost("no Ray worker is left to play the run's episodes")
                    # With no live worker, a replacement gets replacement_wait_s to start.
                    playing = any(s.alive and s.where for s in self.slots)
                    waited = time.monotonic()
                    finished, _ = await asyncio.wait(
                        [*pending, head],
                        timeout=None if playing else self.replacement_wait_s,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    late = time.monotonic() - waited - self.replacement_wait_s
                    if not finished and late > STALL_S:  # a stall: its time given back, once
                        finished, _ = await asyncio.wait(
                            [*pending, head],
                            timeout=min(late, self.replacement_wait_s),
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                    if head in finished:
                        self._head_lost = True
                        raise head.result()
                    if not finished:
                        raise RayWorkersLost(self._no_replacement(ray))
                    for future in finished:
                        slot, piece = pending.pop(future)
                        if piece is None:  # a replacement worker started (or could not)
                            try:
                                slot.where = future.result()
                            except ray.exceptions.RayError as exc:
                                self._lost(ray, slot, None, exc, queue, accept)
                            continue
                        slot.in_flight -= 1
                        try:
                            records = self._unship(future.result(), steps)
                        except ray.exceptions.RayActorError as exc:
                            self._lost(ray, slot, piece, exc, queue, accept)
                            continue
                        for record in records:
                            accept(self._record(record), slot.where, slot.name)
            except (asyncio.CancelledError, RayWorkersLost) as exc:
                # SIGINT/SIGTERM, or no worker left: the files hold whole episodes.
                with state:
                    self.partial_summary = partial()
                if isinstance(exc, RayWorkersLost):
                    exc.summary = self.partial_summary
                raise
            finally:
                watch.end()
                head.cancel()
                for future in pending:  # replacements still starting: nobody reads them
                    future.cancel()
            wall = time.perf_counter() - started
            summary = self._summary(builder, wall)
            summary["ray"] = self._ray_summary(ray, nodes, duplicates)
            played = wall - self.startup_s
            summary["ray"]["startup_s"] = round(self.startup_s, 3)
            summary["ray"]["episodes_per_s_after_startup"] = (
                round(builder.total / played, 3) if played > 0 else None
            )
            writer.write_summary(summary)
        if kept is not None:
            kept.sort(key=lambda r: r.index)
        address = str(ray.get_runtime_context().gcs_address)
        return RunResult(summary, address, wall, self.config.out, kept_records=kept)

    def _no_replacement(self, ray: Any) -> str:
        """Why the run stops: every worker is lost and none of their replacements started."""
        need = self._actor_options.get("num_cpus", 1)
        free = ray.available_resources().get("CPU", 0.0)
        return (
            f"every Ray worker was lost ({len(self.workers_lost)}) and no replacement "
            f"started within {self.replacement_wait_s:.0f} s (each needs {need} CPU; the "
            f"cluster has {free:g} free): add nodes, or free CPUs, and run again"
        )

    def _steps(self) -> Steps:
        """What :meth:`run`'s workers ship (:meth:`EpisodeWorker.play`): no steps when
        nobody reads them (as :meth:`Runner.run`), transcripts as their files' JSON lines
        when only the files do."""
        if self.keep_records or self.item_type is not EpisodeRecord:
            return "items"
        return "none" if self.config.out is None else "json"

    def _unship(self, payload: bytes, steps: Steps = "items") -> list[Any]:
        """The items a worker's :meth:`EpisodeWorker.play` returned (:func:`ship`)."""
        data = zlib.decompress(payload)
        if steps != "json":
            items: list[Any] = self._decoder.decode(data)
            return items
        records = []
        for record, line in self._json_decoder.decode(data):
            # msgspec writes a Raw value's bytes as they are: the worker's own encoding.
            record.transcript = msgspec.Raw(line)  # type: ignore[assignment]
            records.append(record)
        return records

    def _record(self, result: Any) -> EpisodeRecord:
        """The record in one item of what :attr:`worker_class`'s ``play`` returns."""
        if not isinstance(result, EpisodeRecord):
            raise TypeError(f"a Ray worker returned {type(result).__name__}, not a record")
        return result

    def _lost(
        self,
        ray: Any,
        slot: Slot,
        piece: Slice | None,
        exc: BaseException,
        queue: Any,
        accept: Any,
    ) -> None:
        """``slot``'s worker died with ``piece`` in flight: retry it elsewhere (or record it
        as failed after :data:`MAX_ATTEMPTS`) and start a replacement worker."""
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        reason = f"{slot.name}: {type(exc).__name__}: {first}"
        if slot.alive:
            slot.alive = False
            self.workers_lost.append(reason)
            if len(self.slots) < self._max_spawns:
                self._replace(ray, slot)
            else:
                with contextlib.suppress(Exception):  # (a call on the head: not on the loop)
                    threading.Thread(target=ray.kill, args=(slot.actor,), daemon=True).start()
        if piece is None:
            return
        piece.attempts += 1
        piece.reasons.append(reason)
        if piece.attempts < MAX_ATTEMPTS:
            self.retried_count += len(piece.plans)
            room = MAX_LISTED_RETRIES - len(self.retried)
            self.retried.extend(plan.episode_id for plan in piece.plans[: max(room, 0)])
            queue.appendleft(piece)
            return
        for plan in piece.plans:
            log = EpisodeLog(plan, self.config.scenario, self.seats, self.specs)
            log.failed = f"worker_lost: {MAX_ATTEMPTS} workers died playing it ({reason})"
            accept(log.record(), {"node": "lost"}, slot.name)

    def _ray_summary(
        self, ray: Any, nodes: dict[str, dict[str, Any]], duplicates: int
    ) -> dict[str, Any]:
        for node in nodes.values():
            node["busy_s"] = round(node["busy_s"], 3)
        return {
            "address": str(ray.get_runtime_context().gcs_address),
            "workers": len([s for s in self.slots if s.alive]),
            "workers_started": len(self.slots),
            "workers_lost": list(self.workers_lost),
            "nodes": nodes,
            "retried": {
                "episodes": self.retried_count,
                "episode_ids": sorted(set(self.retried)),
            },
            "duplicates_dropped": duplicates,
        }


def ray_table(figures: dict[str, Any]) -> Table:
    """A rich table of ``summary["ray"]``: one row per node, then retries and lost workers."""
    table = Table(title=f"Ray: {figures['workers']} workers at {figures['address']}")
    for name in ("node", "ip", "workers", "episodes", "failed", "agent steps", "busy s"):
        table.add_column(name, justify="left" if name in ("node", "ip") else "right")
    for node, row in sorted(figures["nodes"].items()):
        table.add_row(
            escape(node[:12]), escape(str(row["ip"])), str(len(row["workers"])),
            str(row["episodes"]), str(row["failed"]), str(row["agent_steps"]),
            f"{row['busy_s']:.1f}",
        )  # fmt: skip
    table.add_section()
    table.add_row("retried", "", "", str(figures["retried"]["episodes"]), "", "", "")
    for lost in figures["workers_lost"]:
        table.add_row("worker lost", escape(lost[:60]), "", "", "", "", "")
    return table


async def _await_ref(started: concurrent.futures.Future[Any] | None) -> Any:
    if started is None:
        raise RuntimeError("a Ray worker's start was already awaited")
    return await asyncio.wrap_future(started)


def run_on_ray(config: RunConfig, **kwargs: Any) -> RunResult:
    """Play ``config`` on Ray in a fresh event loop (``RayRunner(config, **kwargs).run()``)."""
    return asyncio.run(RayRunner(config, **kwargs).run())
