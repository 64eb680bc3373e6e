"""Training on Ray: a stage's episodes on Ray worker actors, its LLM seats on the trainer's pool.

``parley train --ray [ADDRESS]`` (``ray:`` in the config) plays each RL stage's episodes
with a :class:`TrainRayRunner`: a :class:`~parley.arena.run.ray_runner.RayRunner` (worker
actors on every node, dead workers replaced, their episodes re-run with the same seeds)
whose seats played by a trained policy (``policy:NAME``) are :class:`PolicySeat` agents.
They ask the trainer's own inference pool over the bus, so every action is tagged with the
version of the weights the trainer last pushed, exactly as in a local run:

- The pool is served on ``tcp://`` (``127.0.0.1`` for a local Ray, the driver's node
  address on a cluster), always with CURVE: a key pair for the pool and one for the
  workers are made for each stage, the pool admits only the workers' key, and the keys
  travel to the workers with the actors' arguments (inside Ray, never on the listener).
  The listener answers generate requests only: weights reach the pool from the trainer.
- Each worker notes the constraint of every generate request its agents make
  (:class:`~parley.arena.training.sampler.RecordingClient`) and ships, with each
  finished episode, the constraints of that episode's generations; the driver notes them in
  the run's :class:`~parley.arena.training.sampler.ConstraintLog`, so
  :func:`~parley.arena.training.sampler.samples_from_record` rebuilds the same legal-token
  masks as for a local episode. Token ids and logprobs travel in the episode record itself.
- The :class:`~parley.arena.training.sampler.AsyncSampler` is unchanged: it calls
  :meth:`RayRunner.play` per episode, so its staleness rule (drop at batch time) and its
  admission budget hold as they do locally.

With ``ray_pool_replicas: N`` (``--pool-replicas N``) the pool behind that listener is N
replicas behind one front (:mod:`~parley.arena.training.ray_replicas`), every weight push
reaching each of them.

The trainer and its pool (they share the weights) run in the driver process, or, with
``ray_trainer_actor`` (``--trainer-actor``; by default when ``device`` asks for a GPU and
the cluster has one), together in a :class:`TrainerActor` of their own, placed on a GPU:
:func:`train_in_actor`. The driver then shows the progress bar and gets the outputs back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.agents.llm import LLMAgentConfig
from parley.arena.run.config import RunConfig
from parley.arena.run.ray_runner import LOCAL, EpisodeWorker, RayRunner, import_ray, init_ray
from parley.arena.run.records import EpisodeRecord
from parley.arena.training.sampler import ConstraintLog, RecordingClient
from parley.protocols.errors import ConfigError
from parley.protocols.messages import (
    Constraint,
    Envelope,
    Error,
    GenerateRequest,
    GenerateResult,
)

__all__ = [
    "TrainRayRunner",
    "ray_stage_runner",
    "train_in_actor",
]

Verdicts = list[Constraint | str | None]
"""What a worker's :class:`ConstraintLog` knows of each decision of an episode (its
constraint, None, or ``FORGOTTEN``), shipped with the episode."""


@dataclass(frozen=True)
class SeatPolicy:
    """How one seat is played by a policy the trainer serves: its agent's config (which
    names the policy) and system prompt."""

    agent: LLMAgentConfig
    system_prompt: str = ""


@dataclass(frozen=True)
class _PoolAccess:
    """Where the trainer's pool listens and the CURVE keys to reach it (Z85)."""

    address: str
    server_key: bytes
    client_public: bytes
    client_secret: bytes


class _BusPool:
    """One bus client per worker, connected on first use (inside the worker's event loop)."""

    def __init__(self, access: _PoolAccess) -> None:
        self.access = access
        self.client: Any = None
        self._lock: asyncio.Lock | None = None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.client is None:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self.client is None:
                    self.client = await self._connect()
        result: GenerateResult = await self.client.generate(request)
        return result

    async def _connect(self) -> Any:
        from parley.agents.llm import BusPoolClient
        from parley.protocols.bus.config import BusConfig

        access = self.access
        config = BusConfig(
            curve_public_key=access.client_public,
            curve_secret_key=access.client_secret,
            curve_server_key=access.server_key,
        )
        return await BusPoolClient.connect(access.address, timeout=30.0, config=config)

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.close()


class PolicySeat:
    """Factory of the :class:`~parley.agents.llm.LLMAgent` of a seat played by a trained
    policy, pickled to each Ray worker; the worker :meth:`bind` s it to its pool client."""

    def __init__(self, seat: SeatPolicy, tokenizer: Any) -> None:
        self.seat = seat
        self.tokenizer = tokenizer
        self.client: RecordingClient | None = None

    def bind(self, client: RecordingClient) -> None:
        self.client = client

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "client": None}  # each worker binds its own

    def __call__(self) -> Any:
        from parley.agents.llm import LLMAgent

        if self.client is None:
            raise ConfigError(f"policy {self.seat.agent.policy!r}'s seat has no pool client")
        return LLMAgent(
            self.client,
            self.tokenizer,
            system_prompt=self.seat.system_prompt,
            config=self.seat.agent,
        )


class TrainEpisodeWorker(EpisodeWorker):
    """An :class:`EpisodeWorker` whose policy seats ask the trainer's pool; :meth:`play`
    returns each record with the constraints of its generations."""

    def __init__(
        self, config: RunConfig, agents: dict[str, Any] | None = None, access: Any = None
    ) -> None:
        super().__init__(config, agents)
        if not isinstance(access, _PoolAccess):
            raise ConfigError("a training worker needs the trainer pool's address and keys")
        self.pool = _BusPool(access)
        self.log = ConstraintLog()
        for source in (agents or {}).values():
            if isinstance(source, PolicySeat):
                source.bind(RecordingClient(self.pool, self.log))

    def items(self, records: Sequence[EpisodeRecord]) -> list[Any]:
        return [(record, self.log.verdicts(record)) for record in records]

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            await self.pool.close()


class TrainRayRunner(RayRunner):
    """A stage's runner on Ray: seats in ``policy_seats`` ask ``pool`` (served on the bus
    while :meth:`open` lasts); the others are played by their spec in ``config.agents``.

    ``log`` is the run's :class:`ConstraintLog`: the constraints shipped with each episode
    are noted there before the sampler sees the episode.
    """

    worker_class = TrainEpisodeWorker
    item_type = tuple[EpisodeRecord, Verdicts]

    def __init__(
        self,
        config: RunConfig,
        policy_seats: Mapping[str, SeatPolicy],
        *,
        pool: Any,
        tokenizer: Any,
        log: ConstraintLog,
        **kwargs: Any,
    ) -> None:
        if config.ray is None:
            config = config.replace(ray=LOCAL)
        agents = {seat: PolicySeat(s, tokenizer) for seat, s in policy_seats.items()}
        super().__init__(config, agents=agents, **kwargs)
        self.pool = pool
        self.log = log
        self.access: _PoolAccess | None = None
        self.address = ""  # the Ray address, once open
        self.node_episodes: dict[str, int] = {}  # node id -> episodes played there
        self._initial_workers = 0
        self.pool_address = ""
        self._joining: set[asyncio.Task[None]] = set()

    def figures(self) -> dict[str, Any]:
        """The stage's Ray figures for ``summary.json`` (its ``ray`` entry), counted as
        ``parley run --ray`` counts them (``summary["ray"]``): workers started, lost and
        replaced, episodes retried (re-run elsewhere with the same seeds) and per node its
        workers and the episodes they played."""
        nodes: dict[str, dict[str, Any]] = {}
        for slot in self.slots:
            if slot.where:
                row = nodes.setdefault(
                    slot.where["node"], {"ip": slot.where["ip"], "workers": [], "episodes": 0}
                )
                row["workers"].append(slot.name)
        for node, episodes in self.node_episodes.items():
            nodes.setdefault(node, {"ip": "", "workers": [], "episodes": 0})["episodes"] = episodes
        return {
            "address": self.address,
            "pool": self.pool_address,  # where the workers reached the trainer's pool
            "workers": sum(1 for slot in self.slots if slot.alive),
            "workers_started": len(self.slots),
            "workers_lost": list(self.workers_lost),
            "workers_replaced": max(0, len(self.slots) - self._initial_workers),
            "retried": {
                "episodes": self.retried_count,
                "episode_ids": sorted(set(self.retried)),
            },
            "nodes": nodes,
            **self._pool_figures(),
        }

    def _pool_figures(self) -> dict[str, Any]:
        # With pool replicas (ray_pool_replicas), the front's view of them.
        figures = getattr(self.pool, "figures", None)
        return {"pool_replicas": figures()} if callable(figures) else {}

    def _replace(self, ray: Any, lost: Any) -> Any:
        slot = super()._replace(ray, lost)
        if self._ray is not None:  # mid-stage: it takes episodes once started
            task = asyncio.get_running_loop().create_task(self._join(ray, slot))
            self._joining.add(task)
            task.add_done_callback(self._joining.discard)
        return slot

    async def _join(self, ray: Any, slot: Any) -> None:
        """Note where a replacement worker runs once it has started: :meth:`play` hands
        episodes only to started workers (``where`` set), so without this a stage that lost
        a worker went on with one worker fewer."""
        try:
            slot.where = await asyncio.wrap_future(slot.started)
        except ray.exceptions.RayError as exc:
            self._lost(ray, slot, None, exc, None, None)

    async def _gathered(self, slot: Any, plan: Any) -> Any:
        result = await super()._gathered(slot, plan)
        node = slot.where.get("node", "?")
        self.node_episodes[node] = self.node_episodes.get(node, 0) + 1
        return result

    def _worker_args(self) -> tuple[Any, ...]:
        if self.access is None:
            raise ConfigError("start training workers inside TrainRayRunner.open()")
        return (*super()._worker_args(), self.access)

    def _record(self, result: Any) -> EpisodeRecord:
        record, verdicts = result
        self.log.learn(record, verdicts)
        return super()._record(record)

    async def _on_generate(self, envelope: Envelope) -> GenerateResult | Error:
        from parley.arena.inference.pool import PoolError

        if not isinstance(envelope.body, GenerateRequest):  # the bus dispatches by type
            raise TypeError(f"expected a generate request, got {type(envelope.body).__name__}")
        try:
            result: GenerateResult = await self.pool.generate(envelope.body)
        except PoolError as exc:
            return exc.to_message()
        return result

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[str]:
        """Serve the pool on an authenticated ``tcp://`` listener, then start the workers."""
        import zmq

        from parley.arena.inference.pool import POOL_ENDPOINT
        from parley.protocols.bus import Endpoint
        from parley.protocols.bus.config import BusConfig

        started_ray = init_ray(self.config.ray)
        ray = import_ray()
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        bus = BusConfig(
            curve_public_key=server_public,
            curve_secret_key=server_secret,
            curve_allowed_clients=(client_public,),
            accept=frozenset({"generate"}),  # generation only (see below)
        )
        host = "127.0.0.1" if self.config.ray in (None, "", LOCAL) else _node_ip(ray)
        endpoint = Endpoint(POOL_ENDPOINT, config=bus)
        try:
            # Generation only: a worker (or whoever holds its key) never pushes weights.
            endpoint.on(GenerateRequest, self._on_generate)
            address = await endpoint.bind(f"tcp://{host}:0")
            self.access = _PoolAccess(address, server_public, client_public, client_secret)
            self.pool_address = address
            async with super().open() as ray_address:
                self.address = ray_address
                self._initial_workers = len(self.slots)
                yield ray_address
        finally:
            self.access = None
            for task in list(self._joining):  # replacements still starting: stopped below
                task.cancel()
            await endpoint.close()
            if started_ray:
                ray.shutdown()


def ray_stage_runner(run: Any, stage: Any, config: RunConfig) -> TrainRayRunner:
    """The runner of one RL stage of a training run on Ray (``TrainConfig.ray``): ``run`` is
    the loop's state (its pool, tokenizer, system prompts, constraint log), ``config`` the
    stage's run config; seats played by ``policy:NAME`` ask the run's pool."""
    from parley.arena.training.loop import llm_agent_config

    seats = {
        seat: SeatPolicy(llm_agent_config(run.config.agent, spec[7:]), run.system.get(seat, ""))
        for seat, spec in stage.agents.items()
        if spec.startswith("policy:")
    }
    # Ray is started once for the run, not per stage (ray.init costs 8-24 s here); it stays
    # up for this process, as any ray.init does, and Ray shuts it down at exit.
    init_ray(run.config.ray)
    ray_config = config.replace(ray=run.config.ray, ray_workers=run.config.ray_workers)
    return TrainRayRunner(
        ray_config, seats, pool=run.sync.pool, tokenizer=run.tokenizer, log=run.log
    )


# ------------------------------------------------------------------ the trainer's own actor


class TrainerActor:
    """Body of the trainer's Ray actor: :func:`~parley.arena.training.loop.run_training`
    (trainer, pool, the stages' runners) with a hidden progress bar the driver reads, and
    the run's output files for a driver on another node."""

    def __init__(self) -> None:
        from rich.progress import Progress

        self.progress = Progress(disable=True)

    async def where(self) -> dict[str, Any]:
        import os

        ray = import_ray()
        context = ray.get_runtime_context()
        return {"node": context.get_node_id(), "ip": _node_ip(ray), "pid": os.getpid(),
                "gpus": [str(g) for g in ray.get_gpu_ids()]}  # fmt: skip

    async def train(self, config: Any) -> Any:
        import os

        from parley.arena.training.loop import run_training

        changes: dict[str, Any] = {"ray_trainer_actor": False, "progress": False}
        if not config.threads:  # Ray gives an actor one torch thread; the driver had all
            changes["threads"] = len(os.sched_getaffinity(0))
        if config.device.startswith("cuda"):  # the one GPU Ray gave the actor is cuda:0
            changes["device"] = "cuda"
        return await run_training(dataclasses.replace(config, **changes), progress=self.progress)

    async def state(self) -> dict[str, Any] | None:
        """The bar: completed steps, its total (grown by each restart of a stage), the
        stage's name, the watched metric."""
        tasks = self.progress.tasks
        if not tasks:
            return None
        task = tasks[0]
        return {"completed": task.completed, "total": task.total,
                "description": task.description,
                "metric": task.fields.get("metric", "")}  # fmt: skip

    async def files(self, out: str) -> list[tuple[str, int]]:
        """Every file under ``out``: its path relative to ``out`` and its size."""
        return _listing(Path(out))

    async def read(self, out: str, name: str, offset: int, size: int) -> bytes:
        with (Path(out) / name).open("rb") as f:
            f.seek(offset)
            return f.read(size)


SHIP_CHUNK = 64 << 20
"""Bytes per call when output files travel from the trainer's actor to the driver."""


def _trainer_options(ray: Any, config: Any) -> dict[str, Any] | None:
    """The trainer actor's resources, or None where the trainer stays in the driver
    (``ray_trainer_actor`` unset and no GPU for it)."""
    wants_gpu = config.device != "cpu"
    gpu = wants_gpu and ray.cluster_resources().get("GPU", 0) >= 1
    if config.ray_trainer_actor is None and not gpu:
        return None
    # num_cpus=0: the worker actors claim the cluster's CPUs (ray_workers: 0 is one per CPU),
    # as they do with the trainer in the driver; the trainer's threads are not counted.
    return {"num_cpus": 0, "num_gpus": 1 if gpu else 0, "max_restarts": 0}


async def train_in_actor(config: Any) -> Any:
    """``parley train --ray`` with the trainer (and its pool) in a Ray actor of its own
    (``ray_trainer_actor``): on a GPU when ``device`` asks for one and the cluster has one.

    The pool's listener is then on the actor's node (the workers reach it there). This
    process shows the same progress bar (read from the actor twice a second) and returns
    the same :class:`~parley.arena.training.loop.TrainResult`. The actor writes ``out`` on
    its node; a driver on another node gets every file the actor wrote that it does not see
    with the same size (on shared storage nothing travels), in chunks of
    :data:`SHIP_CHUNK` bytes. ``summary.json`` says where the trainer ran (``trainer``).
    Returns None when the trainer should stay in this process (``ray_trainer_actor`` unset
    and no GPU). A trainer actor that dies is a :class:`RuntimeError` naming it."""
    init_ray(config.ray)  # up for the rest of the run, as for the stages' runners
    ray = import_ray()
    options = _trainer_options(ray, config)
    if options is None:
        return None
    shipped = _absolute(config)
    out = Path(shipped.out)
    name = f"parley-trainer-{uuid.uuid4().hex[:8]}"  # `ray list actors` shows it by name
    actor = ray.remote(**options)(TrainerActor).options(name=name).remote()
    try:
        try:
            where = await actor.where.remote()
            run = actor.train.remote(shipped)
            await _follow(ray, actor, run, config)
            result = await run
        except ray.exceptions.RayTaskError as exc:  # the run's own error (a ConfigError, ...)
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            raise cause from None
        except ray.exceptions.RayActorError as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise RuntimeError(f"the trainer's Ray actor {name} died: {first}") from exc
        here = ray.get_runtime_context().get_node_id()
        shipped_files = 0 if where["node"] == here else await fetch_outputs(actor, out, out)
        _note_trainer(out, {**where, "options": options, "files_shipped": shipped_files})
        return result
    finally:
        with contextlib.suppress(Exception):  # an actor that died already
            ray.kill(actor)


async def _follow(ray: Any, actor: Any, run: Any, config: Any) -> None:
    """Show the trainer actor's progress bar here until ``run`` (its training) is done."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TextColumn("{task.fields[metric]}"))  # fmt: skip
    total = sum(s.max_updates for s in config.stages)
    console = Console(stderr=True)
    with Progress(*columns, console=console, disable=not config.progress) as progress:
        bar = progress.add_task("train", total=total, metric="")
        while True:
            done, _ = ray.wait([run], timeout=0)
            state = await actor.state.remote()
            if state is not None:
                progress.update(bar, **state)
            if done:
                return
            await asyncio.sleep(0.5)


async def fetch_outputs(actor: Any, source: Path, dest: Path) -> int:
    """Copy the files under ``source`` on ``actor``'s node to ``dest`` here, except those
    ``dest`` already has with the same size (shared storage); returns how many were copied."""
    copied = 0
    for name, size in await actor.files.remote(str(source)):
        target = dest / name
        if target.is_file() and target.stat().st_size == size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as f:
            for offset in range(0, max(size, 1), SHIP_CHUNK):
                f.write(await actor.read.remote(str(source), name, offset, SHIP_CHUNK))
        copied += 1
    return copied


def _absolute(config: Any) -> Any:
    """``config`` with its output and local model directories absolute (an actor's working
    directory is not the driver's; on a cluster they name shared storage)."""
    model = config.model
    if model != "tiny" and Path(model).exists():  # a hub name is left as is
        model = str(Path(model).resolve())
    return dataclasses.replace(config, out=str(Path(config.out).resolve()), model=model)


def _listing(root: Path) -> list[tuple[str, int]]:
    return [(str(p.relative_to(root)), p.stat().st_size)
            for p in sorted(root.rglob("*")) if p.is_file()]  # fmt: skip


def _note_trainer(out: Path, where: dict[str, Any]) -> None:
    """Add where the trainer ran to ``summary.json`` (``trainer``)."""
    import json

    path = out / "summary.json"
    if path.is_file():
        summary = json.loads(path.read_text())
        summary["trainer"] = {"actor": True, **where}
        path.write_text(json.dumps(summary, indent=2, default=str))


def _node_ip(ray: Any) -> str:
    address: str = ray.util.get_node_ip_address()
    return address
