"""Inference pool replicas on Ray behind one balancing front (``parley serve --ray``).

:class:`RayPool` starts ``replicas`` :class:`PoolReplica` actors, each an ordinary
:class:`~parley.arena.inference.pool.InferencePool` over its own backend (a vLLM engine, a
transformers model, an HTTP client), placed by a Ray placement group: one bundle per replica,
``{"GPU": 1}`` each when the cluster has GPUs, else ``cpus_per_replica`` CPUs, spread over
nodes where it can. The front answers the same calls as a pool (:meth:`generate`,
:meth:`update_weights`, :meth:`serve` on a bus endpoint), so agents and the trainer do not
know the difference.

- Routing (:mod:`~parley.arena.inference.routing`, ``routing=``): among the live replicas
  serving a request's policy, ``cache_aware`` (the default) sends it to the replica that
  holds the longest prefix of its prompt (what the front sent each replica, as block hashes;
  so a session's later turns land where its KV cache is) or, over the bus, to the replica
  its session (the envelope's sender and episode, when the episode is set) went to before,
  unless that replica is overloaded next to the least busy; then, and with ``least_busy``,
  the replica with the fewest requests in flight. Each replica batches what it gets, as one
  pool does; :meth:`prefix_stats` sums the replicas' own prefix-cache counters.
- A replica that dies (``RayActorError``) is dropped; its requests in flight are sent again
  to another replica (generation has no side effects), and the request fails only when
  no replica serving its policy is left (``closed``). A new actor then takes the dead one's
  place (its placement bundle): it loads the model, gets every adapter and the latest
  weight update of every policy (the front keeps a reference to each in the object store:
  one copy per policy), and takes requests once it serves the versions the others serve;
  at most ``max_replacements`` times over the pool's life (default: ``replicas``), so a
  model that no longer loads is not retried forever.
- Weight updates reach every replica and bump the version everywhere together: the front
  stops handing out new requests, waits for those in flight, applies the update on every
  live replica at once (the tensors put in Ray's object store once, not once per replica),
  and opens again; a replica whose update failed is dropped, so every answer after
  :meth:`update_weights` returns carries the new version. A ``stale_weights`` update (not
  newer than what is served) is refused as by one pool.
- What a training run needs of its pool (``parley train --ray --pool-replicas N``,
  :mod:`parley.arena.training.ray_replicas`): a replica may build several policies' backends
  itself (``ReplicaSpec.models``), LoRA adapters are added on every replica
  (:meth:`add_adapter`), :attr:`stats` counts like a pool's, and :meth:`fingerprints` tells
  which weights each replica serves. Replica actors are named ``parley-pool-XXXXXXXX-I``.

Ray is an optional extra (``pip install 'parley[ray]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from parley.arena.inference.pool import (
    InferencePool,
    PoolConfig,
    PoolError,
    PoolService,
    PoolStats,
)
from parley.arena.inference.routing import Router, RoutingConfig
from parley.protocols.errors import ConfigError
from parley.protocols.messages import (
    Envelope,
    Error,
    GenerateRequest,
    GenerateResult,
    WeightUpdate,
)

__all__ = ["PoolReplica", "RayPool", "ReplicaSpec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaSpec:
    """What each replica loads: ``load_backend(backend, model, **options)`` for ``policy``,
    or, with ``models``, whatever that picklable callable builds (blocking, in a thread of
    the replica): policy name -> backend, several policies on one replica."""

    backend: str
    model: str
    policy: str = "default"
    options: tuple[tuple[str, Any], ...] = ()
    config: PoolConfig | None = None
    models: Callable[[], dict[str, Any]] | None = None


def weights_digest(tensors: Mapping[str, Any]) -> str:
    """SHA-256 of ``tensors`` (name -> array or torch tensor) as float32, names sorted: the
    same weights give the same digest in any process."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name]
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().float().cpu().numpy()
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(value, dtype=np.float32).tobytes())
    return digest.hexdigest()


class PoolReplica:
    """Body of one replica actor: an :class:`InferencePool` over one backend."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.pool: InferencePool | None = None

    async def start(self) -> dict[str, Any]:
        """Load the backend and start the pool; returns where it runs and what it serves."""
        if self.pool is None:
            from parley.arena.inference.backends import load_backend

            spec = self.spec
            if spec.models is not None:
                backends = await asyncio.to_thread(spec.models)
            else:
                backend = await load_backend(spec.backend, spec.model, **dict(spec.options))
                backends = {spec.policy: backend}
            self.pool = await InferencePool(backends, spec.config).start()
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "policies": self.policies()}

    async def generate(self, request: GenerateRequest) -> GenerateResult | Error:
        """The pool's answer, its errors as ``Error`` bodies (data, not exceptions)."""
        assert self.pool is not None, "start() first"
        try:
            return await self.pool.generate(request)
        except PoolError as exc:
            return exc.to_message()

    async def update_weights(self, update: WeightUpdate) -> int | Error:
        """The new version, or the pool's ``Error``."""
        assert self.pool is not None, "start() first"
        try:
            return await self.pool.update_weights(update)
        except PoolError as exc:
            return exc.to_message()

    async def add_adapter(self, policy: str, base_policy: str, path: str) -> str:
        """Serve ``policy`` as the adapter at ``path`` on ``base_policy``; "" or why not."""
        assert self.pool is not None, "start() first"
        try:
            await self.pool.add_adapter(policy, base_policy, path)
        except (PoolError, ConfigError) as exc:
            return str(exc) or type(exc).__name__
        return ""

    def policies(self) -> dict[str, int]:
        """Policy -> version served."""
        return self.pool.policies if self.pool is not None else {}

    def stats(self) -> dict[str, int]:
        """The replica's pool counters (:class:`PoolStats`)."""
        return dataclasses.asdict(self.pool.stats) if self.pool is not None else {}

    def fingerprint(self, policy: str, names: list[str]) -> str:
        """:func:`weights_digest` of the served weights ``names`` of ``policy`` (a backend
        holding a whole torch model, as the transformers one does); "" where this replica
        has no such model or not every name."""
        assert self.pool is not None, "start() first"
        model: Any = getattr(self.pool.backend(policy), "model", None)
        state = model.state_dict() if hasattr(model, "state_dict") else {}
        if not names or any(name not in state for name in names):
            return ""
        return weights_digest({name: state[name] for name in names})

    def requests(self) -> int:
        """Requests this replica's pool has received."""
        return self.pool.stats.requests if self.pool is not None else 0

    def prefix_stats(self) -> dict[str, int]:
        """Prompt tokens of the decoded rows and those prefilled (not taken from a prefix
        cache), summed over this replica's backends (one without such counters: 0, 0)."""
        totals = {"prompt_tokens": 0, "prefilled_tokens": 0}
        for backend in self.pool.backends if self.pool is not None else []:
            cache = getattr(backend, "prefix_cache", None)  # transformers
            stats = getattr(backend, "prefix_stats", None) or getattr(cache, "stats", None)
            for name in totals:
                totals[name] += int(getattr(stats, name, 0))
        return totals

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()


def _routed(request: GenerateRequest) -> list[int] | bytes:
    """What the router matches of a request: its token ids, else its text's bytes."""
    return list(request.prompt_token_ids) or request.prompt.encode()


def _served(request: GenerateRequest, result: GenerateResult) -> list[int] | bytes:
    """What a replica's cache holds once it answered ``request``: the prompt and the first
    completion, in the units :func:`_routed` used for the request."""
    first = result.completions[0]
    if request.prompt_token_ids:
        return [*request.prompt_token_ids, *first.token_ids]
    return (request.prompt + first.text).encode()


class RayPool(PoolService):
    """``replicas`` pool replicas as Ray actors behind one front (see the module docstring)."""

    def __init__(
        self,
        spec: ReplicaSpec,
        replicas: int,
        *,
        cpus_per_replica: float = 1.0,
        gpus_per_replica: float | None = None,
        max_replacements: int | None = None,
        routing: str | RoutingConfig = "cache_aware",
    ) -> None:
        if replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {replicas}")
        if max_replacements is not None and max_replacements < 0:
            raise ConfigError(f"max_replacements must be 0 or more, got {max_replacements}")
        self.spec = spec
        self.replicas = replicas
        self.router = Router(
            routing if isinstance(routing, RoutingConfig) else RoutingConfig(policy=routing)
        )
        """Picks the replica of each request (:mod:`~parley.arena.inference.routing`)."""
        self.cpus = cpus_per_replica
        self.gpus = gpus_per_replica
        self.actors: list[Any] = []
        self.versions: list[dict[str, int]] = []
        self.busy: list[int] = []
        self.dead: set[int] = set()
        self.resent = 0
        """Requests sent again because their replica died."""
        self.sent: list[int] = []
        """Requests handed to each replica (a resent one counts where it went each time)."""
        self.stats = PoolStats()
        """Counted as one pool counts: requests, completions and tokens at the front;
        batches as the replicas last reported them (after each weight update)."""
        self.name = f"parley-pool-{uuid.uuid4().hex[:8]}"
        """Replica ``i`` is the named actor ``{name}-{i}`` (``ray list actors``)."""
        self.max_replacements = replicas if max_replacements is None else max_replacements
        self.replaced = 0
        """Dead replicas replaced by a new actor that joined."""
        self.names: list[str] = []
        """Each replica's current actor name (a replacement's ends in ``.N``)."""
        self._replica_stats: list[dict[str, int]] = []
        self._retired_stats: list[dict[str, int]] = []  # of the replaced actors
        self._served: dict[str, int] = {}  # policy -> version every live replica serves
        self._latest: dict[str, Any] = {}  # policy -> ObjectRef of its last WeightUpdate
        self._adapters: list[tuple[str, str, str]] = []
        self._replacing: dict[int, asyncio.Task[None]] = {}
        self._launches = 0
        self._options: dict[str, Any] = {}
        self._placement: Any = None
        self._running = 0
        self._updating = False
        self._changed = asyncio.Condition()

    async def start(self) -> RayPool:
        """Place and start the replicas (Ray starts locally if this process is not on one)."""
        if self.actors:
            return self
        from parley.arena.run.ray_runner import import_ray, init_ray

        init_ray()
        ray = import_ray()
        from ray.util.placement_group import placement_group

        gpus = self.gpus
        if gpus is None:
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= self.replicas else 0.0
        bundle = {"GPU": gpus} if gpus else {"CPU": self.cpus}
        if any(bundle.values()):
            self._placement = placement_group([bundle] * self.replicas, strategy="SPREAD")
            await asyncio.wrap_future(self._placement.ready().future())
        self._options = {"num_cpus": bundle.get("CPU", 0), "num_gpus": gpus}
        self.names = [f"{self.name}-{i}" for i in range(self.replicas)]
        self.actors = [self._launch(i) for i in range(self.replicas)]
        started = await asyncio.gather(*(actor.start.remote() for actor in self.actors))
        self.versions = [dict(info["policies"]) for info in started]
        self._served = dict(self.versions[0])
        self.busy = [0] * self.replicas
        self.sent = [0] * self.replicas
        self._replica_stats = [{} for _ in range(self.replicas)]
        return self

    def _launch(self, index: int) -> Any:
        """A new replica actor named ``names[index]``, in bundle ``index`` when placed."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from parley.arena.run.ray_runner import import_ray

        options: dict[str, Any] = {**self._options, "name": self.names[index]}
        if self._placement is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self._placement, placement_group_bundle_index=index
            )
        else:  # nothing reserved: still one per node where there are several
            options["scheduling_strategy"] = "SPREAD"
        return import_ray().remote(PoolReplica).options(**options).remote(self.spec)

    def _drop(self, index: int, why: str) -> None:
        """Replica ``index`` serves no more; a new actor takes its place if the budget allows."""
        if index in self.dead:
            return
        self.dead.add(index)
        self.router.remove(index)  # (a replacement starts with cold caches)
        log.warning("pool replica %d dropped: %s", index, why)
        if self.replaced + len(self._replacing) < self.max_replacements and self.actors:
            self._replacing[index] = asyncio.ensure_future(self._replace(index))

    async def _replace(self, index: int) -> None:
        """Start a new actor in replica ``index``'s place and bring it to the weights every
        live replica serves (adapters, then each policy's latest update); it takes requests
        from then on. A failure leaves the replica dead, with a warning."""
        from parley.arena.run.ray_runner import import_ray

        self._launches += 1
        self.names[index] = f"{self.name}-{index}.{self._launches}"
        actor: Any = self._launch(index)
        try:
            info = await actor.start.remote()
            versions = dict(info["policies"])
            for policy, base, path in self._adapters:
                problem = await actor.add_adapter.remote(policy, base, path)
                if problem:
                    raise ConfigError(f"adapter {policy!r}: {problem}")
                versions[policy] = 0
            async with self._exclusive():  # no weight push and no request meanwhile
                for policy, update in self._latest.items():
                    answer = await actor.update_weights.remote(update)
                    if not isinstance(answer, int):
                        raise PoolError(answer.code, f"weights of {policy!r}: {answer.message}")
                    versions[policy] = answer
                if versions != self._served:
                    raise PoolError(
                        "backend_failed", f"it serves {versions}, the others {self._served}"
                    )
                self.actors[index], actor = actor, None
                self._retired_stats.append(self._replica_stats[index])  # (the dead one's)
                self._replica_stats[index] = {}
                self.versions[index] = versions
                self.busy[index] = 0
                self.dead.discard(index)
                self.replaced += 1
            log.warning("pool replica %d replaced by %s", index, self.names[index])
        except Exception as exc:  # (the pool goes on with the replicas it has)
            log.warning("pool replica %d could not be replaced: %r", index, exc)
        finally:
            self._replacing.pop(index, None)
            if actor is not None:
                import_ray().kill(actor)

    async def settled(self) -> None:
        """Wait until no replacement is under way (each has joined or given up)."""
        while self._replacing:
            await asyncio.wait(list(self._replacing.values()))

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """No new request starts in this block, and none is in flight."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating)
            self._updating = True
            await self._changed.wait_for(lambda: self._running == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._updating = False
                self._changed.notify_all()

    # --- the pool's calls ----------------------------------------------------------------

    @property
    def policies(self) -> dict[str, int]:
        """Policy -> version, as every live replica serves it."""
        live = [v for i, v in enumerate(self.versions) if i not in self.dead]
        return dict(live[0]) if live else {}

    @property
    def backends(self) -> list[Any]:
        """For ``parley serve``'s watch: a failed stand-in once every replica has died and no
        replacement is under way."""
        if self.actors and len(self.dead) == len(self.actors) and not self._replacing:
            return [SimpleNamespace(failure=f"all {self.replicas} pool replicas died")]
        return []

    @contextlib.asynccontextmanager
    async def _request_slot(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating)
            self._running += 1
        try:
            yield
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def _pick(self, policy: str, request: GenerateRequest | None = None, session: str = "") -> int:
        """The replica to send ``request`` (of ``policy``) to, by :attr:`router`."""
        live = [i for i in range(len(self.actors)) if i not in self.dead]
        serving = [i for i in live if policy in self.versions[i]]
        if not serving:
            if live:
                raise PoolError("unknown_policy", f"no replica serves policy {policy!r}")
            raise PoolError("closed", f"every one of the {self.replicas} pool replicas died")
        prompt = _routed(request) if request is not None else b""
        return self.router.pick(policy, prompt, serving, self.busy, session=session)

    async def _on_generate(self, env: Envelope) -> GenerateResult | Error:
        """As a pool answers over the bus, with the envelope's sender and episode (when
        set) as the request's session key."""
        assert isinstance(env.body, GenerateRequest)  # the bus dispatches by body type
        session = f"{env.sender}/{env.episode}" if env.episode else ""
        try:
            return await self.generate(env.body, session=session)
        except PoolError as exc:
            return exc.to_message()

    async def generate(
        self, request: GenerateRequest, *, session: str = "", **_: Any
    ) -> GenerateResult:
        """Answer ``request`` on the live replica serving its policy that :attr:`router`
        picks (``session``: a key naming the conversation, for affinity; may be "")."""
        from ray.exceptions import RayActorError

        await self.start()
        self.stats.requests += 1
        while True:
            if len(self.dead) == len(self.actors) and self._replacing:
                # Outside the request slot: a replacement joins when no request is in one.
                await self.settled()
            async with self._request_slot():
                index = self._pick(request.policy, request, session)
                self.busy[index] += 1
                self.sent[index] += 1
                try:
                    answer = await self.actors[index].generate.remote(request)
                except RayActorError as exc:
                    self._drop(index, f"its actor died ({type(exc).__name__})")
                    self.resent += 1
                    continue
                finally:
                    self.busy[index] -= 1
            if isinstance(answer, Error):
                self.stats.failed += 1
                raise PoolError(answer.code, answer.message, retryable=answer.retryable)
            result: GenerateResult = answer
            if result.completions and index not in self.dead:  # what its cache now holds
                self.router.record(index, request.policy, _served(request, result))
            self.stats.completed += 1
            self.stats.generated_tokens += sum(len(c.token_ids) for c in result.completions)
            return result

    async def update_weights(self, update: WeightUpdate) -> int:
        """Apply ``update`` on every live replica together; returns the new version."""
        await self.start()
        if len(self.dead) == len(self.actors) and self._replacing:
            await self.settled()  # (before _exclusive: a replacement needs it to join)
        async with self._exclusive():
            from parley.arena.run.ray_runner import import_ray

            shared = import_ray().put(update)  # once in the object store, read by every replica
            live = [i for i in range(len(self.actors)) if i not in self.dead]
            calls = [self.actors[i].update_weights.remote(shared) for i in live]
            answers = await asyncio.gather(*calls, return_exceptions=True)
            applied = [a for a in answers if isinstance(a, int)]
            errors = [a for a in answers if isinstance(a, Error)]
            if not applied:
                first = errors[0] if errors else None
                if first is None:
                    raise PoolError("closed", "no pool replica is left to update")
                raise PoolError(first.code, first.message, retryable=first.retryable)
            for index, answer in zip(live, answers, strict=True):
                if isinstance(answer, int):
                    self.versions[index][update.policy] = answer
                else:  # an Error, a dead actor, a lost object: it would serve other weights
                    self._drop(index, f"its weight update failed: {answer!r}")
            self._served[update.policy] = max(applied)
            self._latest[update.policy] = shared  # what a replacement will be given
            self.router.clear()  # every replica dropped the caches these weights change
            self.stats.weight_updates += 1
            await self._refresh_stats()
            return max(applied)

    async def _refresh_stats(self) -> None:
        """Batch counters summed over the replicas (a dead one's as it last reported)."""
        live = [i for i in range(len(self.actors)) if i not in self.dead]
        answers = await asyncio.gather(
            *(self.actors[i].stats.remote() for i in live), return_exceptions=True
        )
        for index, answer in zip(live, answers, strict=True):
            if isinstance(answer, dict):
                self._replica_stats[index] = answer
        reported = self._replica_stats + self._retired_stats
        for name in ("backend_calls", "batches", "batched_requests", "isolated_batches"):
            setattr(self.stats, name, sum(r.get(name, 0) for r in reported))
        self.stats.max_batch_size = max((r.get("max_batch_size", 0) for r in reported), default=0)

    async def add_adapter(self, policy: str, base_policy: str, path: str) -> None:
        """Serve ``policy`` as the PEFT adapter at ``path`` (readable on every replica's node)
        on ``base_policy``, on every live replica (version 0); :class:`ConfigError` naming
        the first replica that could not."""
        await self.start()
        live = [i for i in range(len(self.actors)) if i not in self.dead]
        calls = [self.actors[i].add_adapter.remote(policy, base_policy, path) for i in live]
        for index, problem in zip(live, await asyncio.gather(*calls), strict=True):
            if problem:
                raise ConfigError(f"pool replica {index} cannot add adapter {policy!r}: {problem}")
            self.versions[index][policy] = 0
        self._adapters.append((policy, base_policy, path))
        self._served[policy] = 0

    async def fingerprints(self, policy: str, names: list[str]) -> list[str | None]:
        """Per replica, :meth:`PoolReplica.fingerprint` of ``policy``'s weights ``names``
        (None for a dead replica)."""
        return await self._ask_each(lambda actor: actor.fingerprint.remote(policy, names))

    async def _ask_each(self, call: Callable[[Any], Any]) -> list[Any]:
        """``await call(actor)`` for each replica in turn; None for a dead one. A replica
        found dead here is dropped (and replaced) as a request would drop it: no
        ``RayActorError`` reaches the caller."""
        from ray.exceptions import RayActorError

        answers: list[Any] = []
        for i, actor in enumerate(self.actors):
            answer = None
            if i not in self.dead:
                try:
                    answer = await call(actor)
                except RayActorError as exc:
                    self._drop(i, f"its actor died ({type(exc).__name__})")
            answers.append(answer)
        return answers

    def figures(self) -> dict[str, Any]:
        """The front's view of its replicas, for a summary: versions, requests handed to
        each, which died, requests sent again."""
        started = len(self.versions)  # still known after close()
        return {
            "replicas": started,
            "live": started - len(self.dead),
            "dead": sorted(self.dead),
            "resent": self.resent,
            "replaced": self.replaced,
            "requests": list(self.sent),
            "versions": [dict(v) for v in self.versions],
            "actors": list(self.names),
            "routing": {"policy": self.router.config.policy, **self.router.counts.as_dict()},
        }

    async def prefix_stats(self) -> dict[str, Any]:
        """The live replicas' prefix-cache counters (:meth:`PoolReplica.prefix_stats`),
        summed, and ``hit_rate``: the share of prompt tokens taken from a cache."""
        answers = await self._ask_each(lambda actor: actor.prefix_stats.remote())
        totals = {"prompt_tokens": 0, "prefilled_tokens": 0}
        for answer in answers:
            for name in totals:
                totals[name] += answer[name] if answer else 0
        prompt = totals["prompt_tokens"]
        hit = 1 - totals["prefilled_tokens"] / prompt if prompt else 0.0
        return {**totals, "hit_rate": round(hit, 4)}

    async def requests_per_replica(self) -> list[int]:
        """Requests each live replica's actor has received (dead ones: -1); a replacement
        counts from its own start (:meth:`figures` has the front's count per slot)."""
        counts = await self._ask_each(lambda actor: actor.requests.remote())
        return [-1 if count is None else count for count in counts]

    async def close(self) -> None:
        """Close every replica's pool, then the actors and their placement group."""
        from parley.arena.run.ray_runner import import_ray

        ray = import_ray()
        for task in list(self._replacing.values()):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.settled()
        for i, actor in enumerate(self.actors):
            if i not in self.dead:
                with contextlib.suppress(Exception):  # a replica that died meanwhile
                    await actor.close.remote()
            ray.kill(actor)
        self.actors = []
        if self._placement is not None:
            ray.util.remove_placement_group(self._placement)
            self._placement = None
