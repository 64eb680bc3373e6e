"""Inference pool replicas on Ray behind one balancing front (``parley serve --ray``).

:class:`RayPool` starts ``replicas`` :class:`PoolReplica` actors, each an ordinary
:class:`~parley.arena.inference.pool.InferencePool` over its own backend (a vLLM engine, a
transformers model, an HTTP client), placed by a Ray placement group: one bundle per replica,
``{"GPU": 1}`` each when the cluster has GPUs, else ``cpus_per_replica`` CPUs, spread over
nodes where it can. The front answers the same calls as a pool (:meth:`generate`,
:meth:`update_weights`, :meth:`serve` on a bus endpoint), so agents and the trainer do not
know the difference.

- Balancing and routing: a request goes to the live replica serving its policy with the
  fewest requests in flight (each replica batches what it gets, as one pool does).
- A replica that dies (``RayActorError``) is dropped; its requests in flight are sent again
  to another replica (generation has no side effects), and the request fails only when
  no replica serving its policy is left (``closed``).
- Weight updates reach every replica and bump the version everywhere together: the front
  stops handing out new requests, waits for those in flight, applies the update on every
  live replica at once, and opens again; a replica whose update failed is dropped, so every
  answer after :meth:`update_weights` returns carries the new version. A ``stale_weights``
  update (not newer than what is served) is refused as by one pool.

Ray is an optional extra (``pip install 'parley[ray]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError
from parley.protocols.bus import Endpoint
from parley.protocols.errors import ConfigError
from parley.protocols.messages import (
    Envelope,
    Error,
    GenerateRequest,
    GenerateResult,
    Ok,
    WeightUpdate,
)

__all__ = ["PoolReplica", "RayPool", "ReplicaSpec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaSpec:
    """What each replica loads: ``load_backend(backend, model, **options)`` for ``policy``."""

    backend: str
    model: str
    policy: str = "default"
    options: tuple[tuple[str, Any], ...] = ()
    config: PoolConfig | None = None


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
            backend = await load_backend(spec.backend, spec.model, **dict(spec.options))
            self.pool = await InferencePool({spec.policy: backend}, spec.config).start()
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

    def policies(self) -> dict[str, int]:
        """Policy -> version served."""
        return self.pool.policies if self.pool is not None else {}

    def requests(self) -> int:
        """Requests this replica's pool has received."""
        return self.pool.stats.requests if self.pool is not None else 0

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()


class RayPool:
    """``replicas`` pool replicas as Ray actors behind one front (see the module docstring)."""

    def __init__(
        self,
        spec: ReplicaSpec,
        replicas: int,
        *,
        cpus_per_replica: float = 1.0,
        gpus_per_replica: float | None = None,
    ) -> None:
        if replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {replicas}")
        self.spec = spec
        self.replicas = replicas
        self.cpus = cpus_per_replica
        self.gpus = gpus_per_replica
        self.actors: list[Any] = []
        self.versions: list[dict[str, int]] = []
        self.busy: list[int] = []
        self.dead: set[int] = set()
        self.resent = 0
        """Requests sent again because their replica died."""
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
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = self.gpus
        if gpus is None:
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= self.replicas else 0.0
        bundle = {"GPU": gpus} if gpus else {"CPU": self.cpus}
        cls = ray.remote(PoolReplica)
        if any(bundle.values()):
            self._placement = placement_group([bundle] * self.replicas, strategy="SPREAD")
            await asyncio.wrap_future(self._placement.ready().future())
        for i in range(self.replicas):
            options: dict[str, Any] = {"num_cpus": bundle.get("CPU", 0), "num_gpus": gpus}
            if self._placement is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._placement, placement_group_bundle_index=i
                )
            self.actors.append(cls.options(**options).remote(self.spec))
        started = await asyncio.gather(*(actor.start.remote() for actor in self.actors))
        self.versions = [dict(info["policies"]) for info in started]
        self.busy = [0] * self.replicas
        return self

    # --- the pool's calls ----------------------------------------------------------------

    @property
    def policies(self) -> dict[str, int]:
        """Policy -> version, as every live replica serves it."""
        live = [v for i, v in enumerate(self.versions) if i not in self.dead]
        return dict(live[0]) if live else {}

    @property
    def backends(self) -> list[Any]:
        """For ``parley serve``'s watch: a failed stand-in once every replica has died."""
        if self.actors and len(self.dead) == len(self.actors):
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

    def _pick(self, policy: str) -> int:
        live = [i for i in range(len(self.actors)) if i not in self.dead]
        serving = [i for i in live if policy in self.versions[i]]
        if not serving:
            if live:
                raise PoolError("unknown_policy", f"no replica serves policy {policy!r}")
            raise PoolError("closed", f"every one of the {self.replicas} pool replicas died")
        return min(serving, key=lambda i: self.busy[i])

    async def generate(self, request: GenerateRequest, **_: Any) -> GenerateResult:
        """Answer ``request`` on the least-busy live replica serving its policy."""
        from ray.exceptions import RayActorError

        await self.start()
        async with self._request_slot():
            while True:
                index = self._pick(request.policy)
                self.busy[index] += 1
                try:
                    answer = await self.actors[index].generate.remote(request)
                except RayActorError:
                    self.dead.add(index)
                    self.resent += 1
                    continue
                finally:
                    self.busy[index] -= 1
                if isinstance(answer, Error):
                    raise PoolError(answer.code, answer.message, retryable=answer.retryable)
                result: GenerateResult = answer
                return result

    async def update_weights(self, update: WeightUpdate) -> int:
        """Apply ``update`` on every live replica together; returns the new version."""
        await self.start()
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating)
            self._updating = True
            await self._changed.wait_for(lambda: self._running == 0)
        try:
            live = [i for i in range(len(self.actors)) if i not in self.dead]
            calls = [self.actors[i].update_weights.remote(update) for i in live]
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
                    self.dead.add(index)
                    log.warning("pool replica %d dropped: its weight update failed: %r",
                                index, answer)  # fmt: skip
            return max(applied)
        finally:
            async with self._changed:
                self._updating = False
                self._changed.notify_all()

    def serve(self, endpoint: Endpoint) -> None:
        """Answer ``GenerateRequest`` and ``WeightUpdate`` on ``endpoint``, as a pool does."""
        endpoint.on(GenerateRequest, self._on_generate)
        endpoint.on(WeightUpdate, self._on_weights)

    async def _on_generate(self, env: Envelope) -> GenerateResult | Error:
        assert isinstance(env.body, GenerateRequest)  # the bus dispatches by body type
        try:
            return await self.generate(env.body)
        except PoolError as exc:
            return exc.to_message()

    async def _on_weights(self, env: Envelope) -> Ok | Error:
        assert isinstance(env.body, WeightUpdate)
        try:
            await self.update_weights(env.body)
        except PoolError as exc:
            return exc.to_message()
        return Ok()

    async def requests_per_replica(self) -> list[int]:
        """Requests each live replica has received (dead ones: -1)."""
        counts = []
        for i, actor in enumerate(self.actors):
            counts.append(-1 if i in self.dead else await actor.requests.remote())
        return counts

    async def close(self) -> None:
        """Close every replica's pool, then the actors and their placement group."""
        from parley.arena.run.ray_runner import import_ray

        ray = import_ray()
        for i, actor in enumerate(self.actors):
            if i not in self.dead:
                with contextlib.suppress(Exception):  # a replica that died meanwhile
                    await actor.close.remote()
            ray.kill(actor)
        self.actors = []
        if self._placement is not None:
            ray.util.remove_placement_group(self._placement)
            self._placement = None
