"""``parley train --ray --pool-replicas N`` (issue 15): the workers' LLM seats on N pool
replicas, every weight push reaching each of them.

One real local Ray for the module (``ray.init(num_cpus=2)``, no dashboard). After each
push the test asks every live replica actor itself (not the front) which version it serves
and a digest of the weights it serves, and compares them with what the trainer pushed.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from parley.arena.inference.ray_pool import RayPool, weights_digest  # noqa: E402
from parley.protocols.errors import ConfigError  # noqa: E402
from tests.arena.training.referential import (  # noqa: E402
    SCENARIO,
    two_stage_recipe,
)


def _watch_pushes(monkeypatch: Any, kill_after: int | None = None) -> list[dict[str, Any]]:
    """After each weight push through the front, what every live replica actor reports.

    With ``kill_after``: once that many pushes are done, replica 1 is killed (and gone)
    the moment the front picks it for a request, mid-stage, episodes in flight."""
    pushes: list[dict[str, Any]] = []
    update_weights, pick = RayPool.update_weights, RayPool._pick
    killed: list[int] = []

    async def checked(self: RayPool, update: Any) -> int:
        version: int = await update_weights(self, update)
        names = sorted(update.tensors)
        while True:
            # (the test waits for a dead replica's replacement; a run would not)
            await self.settled()
            # No request runs in here, so none can kill a replica while it is asked (at
            # load one did, between settled() and these calls: ActorDiedError escaped).
            async with self._exclusive():
                if self._replacing:  # killed meanwhile: wait for its replacement first
                    continue
                live = [i for i in range(len(self.actors)) if i not in self.dead]
                served = await asyncio.gather(*(self.actors[i].policies.remote() for i in live))
                prints = await asyncio.gather(
                    *(self.actors[i].fingerprint.remote(update.policy, names) for i in live)
                )
                break
        pushes.append({"policy": update.policy, "version": update.version, "returned": version,
                       "live": live, "served": [s[update.policy] for s in served],
                       "prints": prints, "pushed": weights_digest(update.tensors)})  # fmt: skip
        return version

    def pick_and_kill(self: RayPool, policy: str, *args: Any) -> int:
        index: int = pick(self, policy, *args)
        if kill_after is not None and len(pushes) >= kill_after and index == 1 and not killed:
            killed.append(index)
            ray.kill(self.actors[1], no_restart=True)
            for _ in range(200):  # until it is gone: the front's call to it then fails
                try:
                    ray.get(self.actors[1].policies.remote(), timeout=5)
                except ray.exceptions.RayActorError:
                    break
                time.sleep(0.05)
        return index

    monkeypatch.setattr(RayPool, "update_weights", checked)
    monkeypatch.setattr(RayPool, "_pick", pick_and_kill)
    return pushes


def _train(model_dir: Path, tmp_path: Path, name: str) -> tuple[Path, list[dict[str, Any]]]:
    import yaml

    from parley.arena.cli import main

    path = tmp_path / f"{name}.yaml"
    out = tmp_path / name
    path.write_text(yaml.safe_dump(two_stage_recipe(model_dir, out)))
    argv = ["train", "--config", str(path), "--ray", "--ray-workers", "2", "--pool-replicas", "2"]
    assert main(argv) == 0
    return out, [json.loads(line) for line in (out / "metrics.jsonl").open()]


def _assert_consistent(push: dict[str, Any]) -> None:
    """Every live replica serves the pushed version and the pushed weights."""
    assert push["returned"] == push["version"]
    assert push["served"] == [push["version"]] * len(push["live"])
    assert push["prints"] == [push["pushed"]] * len(push["live"])
    assert push["pushed"]  # a digest of real tensors, not of nothing


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_replica_serves_each_pushed_version_and_weights(
    tiny_model_dir: Path, tmp_path: Path, local_ray: None, monkeypatch: Any, capsys: Any
) -> None:
    pushes = _watch_pushes(monkeypatch)
    out, rows = _train(tiny_model_dir, tmp_path, "run")
    assert [r["stage"] for r in rows] == ["listener"] * 3 + ["joint"] * 2
    # 3 listener pushes, then speaker and listener at each of the 2 joint updates.
    assert [(p["policy"], p["version"]) for p in pushes] == [
        ("listener", 1), ("listener", 2), ("listener", 3),
        ("speaker", 4), ("listener", 4), ("speaker", 5), ("listener", 5),
    ]  # fmt: skip
    for push in pushes:
        assert push["live"] == [0, 1]
        _assert_consistent(push)
    assert all(row["pool_requests"] > 0 for row in rows)  # the front counts as a pool does
    assert rows[-1]["version_listener"] == rows[-1]["version_speaker"] == 5
    summary = json.loads((out / "summary.json").read_text())
    assert all(s["failed_episodes"] == 0 for s in summary["stages"])
    replicas = summary["stages"][-1]["ray"]["pool_replicas"]
    assert replicas["live"] == 2
    assert replicas["dead"] == []
    assert all(count > 0 for count in replicas["requests"])  # both replicas answered
    assert replicas["versions"] == [{"speaker": 5, "listener": 5}] * 2
    assert "joint pool: 2 of 2 replicas live" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_replica_killed_mid_run_costs_no_episode_and_its_replacement_gets_the_weights(
    tiny_model_dir: Path, tmp_path: Path, local_ray: None, monkeypatch: Any
) -> None:
    pushes = _watch_pushes(monkeypatch, kill_after=1)
    out, rows = _train(tiny_model_dir, tmp_path, "killed")
    assert len(rows) == 5  # the run finished every update
    assert pushes[0]["live"] == [0, 1]
    # From the push after the death on, the new replica 1 serves the pushed version and
    # the pushed tensors (it was given each policy's latest update when it started).
    assert all(p["live"] == [0, 1] for p in pushes[1:])
    for push in pushes:
        _assert_consistent(push)
    assert pushes[-1]["version"] == 5
    summary = json.loads((out / "summary.json").read_text())
    assert all(s["failed_episodes"] == 0 for s in summary["stages"])  # none lost
    replicas = summary["stages"][-1]["ray"]["pool_replicas"]
    assert replicas["dead"] == []
    assert replicas["replaced"] == 1
    assert replicas["actors"][1].endswith("-1.1")
    assert replicas["resent"] >= 1  # its request in flight went to the survivor
    assert replicas["versions"] == [{"speaker": 5, "listener": 5}] * 2


def test_pool_replicas_need_ray_and_a_count() -> None:
    from parley.arena.training.config import load_train_config

    stage = {"name": "s", "agents": {"speaker": "scripted", "listener": "policy:listener"},
             "train": ["listener"]}  # fmt: skip
    data = {"scenario": SCENARIO, "policies": ["listener"], "stages": [stage]}
    with pytest.raises(ConfigError, match="needs ray"):
        load_train_config(data=data, overrides=["ray_pool_replicas=2"])
    with pytest.raises(ConfigError, match="0 or more"):
        load_train_config(data=data, overrides=["ray=local", "ray_pool_replicas=-1"])
    config = load_train_config(data=data, overrides=["ray=local", "ray_pool_replicas=3"])
    assert config.ray_pool_replicas == 3
    assert config.ray_pool_routing == "cache_aware"
    with pytest.raises(ConfigError, match="cache_aware, least_busy"):
        load_train_config(data=data, overrides=["ray_pool_routing=round_robin"])
    plain = ["ray=local", "ray_pool_replicas=2", "ray_pool_routing=least_busy"]
    assert load_train_config(data=data, overrides=plain).ray_pool_routing == "least_busy"
