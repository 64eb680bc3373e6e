"""Where ``parley train --ray``'s trainer actor goes on a multi-node Ray (issue 15).

A real ``ray.cluster_utils.Cluster`` on this machine: a head with the CPUs and one node that
declares a GPU (Ray accounts for it; no CUDA is needed to place an actor there). The trainer
actor must land on that node when ``device`` asks for a GPU, and stay in the driver by
default when it does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from parley.arena.training.config import load_train_config  # noqa: E402
from parley.arena.training.ray_train import TrainerActor, _trainer_options  # noqa: E402


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[Any]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    gpu_node = c.add_node(num_cpus=1, num_gpus=1)
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield gpu_node
    finally:
        ray.shutdown()
        c.shutdown()


def _config(tmp_path: Path, **changes: Any) -> Any:
    data = {
        "scenario": "collaboration/referential-v0",
        "policies": ["listener"],
        "stages": [
            {
                "name": "s",
                "agents": {"speaker": "scripted", "listener": "policy:listener"},
                "train": ["listener"],
                "max_updates": 1,
            }
        ],
        "out": str(tmp_path / "run"),
        "ray": "auto",
    }
    return dataclasses.replace(load_train_config(data=data), **changes)


@pytest.mark.timeout(300)
async def test_the_trainer_actor_goes_to_the_gpu_node_when_the_device_asks_for_one(
    gpu_cluster: Any, tmp_path: Path
) -> None:
    # The default: an actor exactly when the device asks for a GPU and the cluster has one.
    assert _trainer_options(ray, _config(tmp_path, device="cpu")) is None
    wanted = _trainer_options(ray, _config(tmp_path, device="auto"))
    assert wanted == {"num_cpus": 0, "num_gpus": 1, "max_restarts": 0}
    assert _trainer_options(ray, _config(tmp_path, device="cuda:1"))["num_gpus"] == 1
    # Asked for explicitly with device: cpu, it is a CPU actor (no GPU held for nothing).
    forced = _trainer_options(ray, _config(tmp_path, device="cpu", ray_trainer_actor=True))
    assert forced == {"num_cpus": 0, "num_gpus": 0, "max_restarts": 0}
    actor = ray.remote(**wanted)(TrainerActor).remote()
    try:
        where = await actor.where.remote()
        assert where["node"] == gpu_cluster.node_id  # the one node with a GPU
        assert where["gpus"] == ["0"]  # Ray gave it the GPU: cuda:0 inside the actor
        assert await actor.state.remote() is None  # no bar before the run starts
    finally:
        ray.kill(actor)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_recipe_trains_with_the_trainer_actor_on_a_cluster_pool_on_its_node_address(
    gpu_cluster: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import json
    import os

    pytest.importorskip("torch")
    from parley.arena.training.loop import train
    from tests.arena.training.referential import two_stage_recipe

    data = {**two_stage_recipe(tiny_model_dir, tmp_path / "run"), "ray": "auto"}  # joined already
    data.update(ray_workers=2, ray_trainer_actor=True)  # device: cpu, so a CPU actor
    result = train(load_train_config(data=data))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    trainer = summary["trainer"]
    assert trainer["pid"] != os.getpid()
    assert trainer["options"]["num_gpus"] == 0
    for stage in summary["stages"]:
        # A cluster address: the listener is on the actor's node address, not loopback.
        pool = stage["ray"]["pool"]
        assert pool.startswith(f"tcp://{trainer['ip']}:")
        assert not pool.startswith("tcp://127.")
        assert stage["failed_episodes"] == 0
    assert [s["updates"] for s in result.stage_summaries] == [3, 2]
    assert (tmp_path / "run" / "checkpoints" / "listener" / "config.json").exists()
