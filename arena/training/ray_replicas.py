"""The workers' LLM seats on N pool replicas: ``parley train --ray --pool-replicas N``.

Without it, a training run on Ray has one inference pool, the trainer's, which every
worker's ``policy:`` seat asks over the bus. With ``ray_pool_replicas: N`` the trainer's
process holds a :class:`~parley.arena.inference.ray_pool.RayPool` instead: N
:class:`~parley.arena.inference.ray_pool.PoolReplica` actors, each serving every policy the
trainer's pool would (built by :class:`ServedModels` from the run's initial checkpoints, in
the run's ``precision``; LoRA adapters added on every replica), behind one front. The
front is served on the same authenticated ``tcp://`` listener as the trainer's pool, so
workers do not know the difference, and it routes their requests by policy and, among the
replicas serving it, cache-aware (:mod:`~parley.arena.inference.routing`): an episode's
later turns go to the replica holding its earlier ones, unless that one is overloaded next
to the least busy (``ray_pool_routing: least_busy``: always the least busy).

Weights: every push after an update (:class:`~parley.arena.training.sync.InProcessSync`
calls the front's ``update_weights``) drains the front, reaches every live replica, and
bumps the version on all of them together; a replica that misses an update (dead, or its
update failed) is dropped before anything is served again, so no replica ever answers with
old weights under the new version. A dead replica's requests in flight go to the others,
and a new actor takes its place with the latest weights (:class:`RayPool`). Each stage's
``summary.json`` entry has the front's view (``ray.pool_replicas``: versions, requests per
replica, dead ones, requests sent again, replacements).

Placement: one GPU per replica when ``device`` asks for a GPU and the cluster has one per
replica; otherwise CPU actors that claim no CPU (the worker actors claim the CPUs, as with
the trainer's actor), spread over nodes. The trainer's own served copies stay loaded in
its process (the run's summary reads their dtype) but answer nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.arena.inference.pool import PoolConfig
from parley.arena.inference.ray_pool import RayPool, ReplicaSpec
from parley.arena.run.ray_runner import import_ray, init_ray
from parley.protocols.errors import ConfigError

__all__ = ["start_replica_pool"]


@dataclass(frozen=True)
class ServedModels:
    """Builds, inside a replica, the backends the trainer's pool serves at the run's start
    (pickled to each replica; called there in a thread): one transformers backend per
    served name, loaded from its checkpoint directory (readable on the replica's node)."""

    paths: tuple[tuple[str, str], ...]
    """(served policy name, checkpoint directory), in the trainer pool's order."""
    precision: str
    max_batch_rows: int
    seed: int
    threads: int = 0
    """torch CPU threads in the replica (0: torch's default)."""

    def __call__(self) -> dict[str, Any]:
        import torch

        from parley.arena.inference.backends.tokenizer import load_causal_lm, load_tokenizer
        from parley.arena.inference.backends.transformers import TransformersBackend
        from parley.arena.training.precision import torch_dtype

        ray = import_ray()
        device = "cuda" if ray.get_gpu_ids() else "cpu"  # the GPU Ray gave this replica
        if self.threads:
            torch.set_num_threads(self.threads)
        tokenizer = load_tokenizer(self.paths[0][1])
        backends: dict[str, Any] = {}
        for name, path in self.paths:
            model = load_causal_lm(path, dtype=torch_dtype(self.precision)).to(device)
            backends[name] = TransformersBackend(
                model.eval(), tokenizer, max_batch_rows=self.max_batch_rows, seed=self.seed
            )
        return backends


def served_paths(policies: Any, dirs: Mapping[str, Path]) -> dict[str, str]:
    """Served name -> checkpoint directory: a whole-model policy's own initial checkpoint,
    a LoRA base's that of the policies whose adapters it carries."""
    paths: dict[str, str] = {}
    for name in policies.served:
        if name in dirs:
            paths[name] = str(Path(dirs[name]).resolve())
    for policy, base, _ in policies.adapters:
        paths.setdefault(base, str(Path(dirs[policy]).resolve()))
    missing = sorted(set(policies.served) - set(paths))
    if missing:
        raise ConfigError(f"pool replicas: no checkpoint known for served models {missing}")
    return paths


async def start_replica_pool(
    config: Any, dirs: Mapping[str, Path], policies: Any, pool_config: PoolConfig
) -> RayPool:
    """Start ``config.ray_pool_replicas`` replicas of the run's pool (see the module
    docstring); returns the front, which the loop uses as its pool (its ``policies``,
    ``stats``, ``update_weights``, ``add_adapter``, ``close``)."""
    init_ray(config.ray)
    ray = import_ray()
    models = ServedModels(
        paths=tuple(served_paths(policies, dirs).items()),
        precision=config.precision,
        max_batch_rows=config.max_batch_size,
        seed=config.seed,
        threads=config.threads,
    )
    spec = ReplicaSpec(backend="transformers", model="", config=pool_config, models=models)
    replicas = config.ray_pool_replicas
    wants_gpu = config.device != "cpu"
    gpus = 1.0 if wants_gpu and ray.cluster_resources().get("GPU", 0) >= replicas else 0.0
    pool = RayPool(
        spec,
        replicas,
        cpus_per_replica=0.0,
        gpus_per_replica=gpus,
        routing=config.ray_pool_routing,
    )
    try:
        return await pool.start()
    except BaseException:
        await pool.close()
        raise
