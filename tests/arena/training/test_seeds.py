"""One ``seed`` drives every seed of a training run, and the run records them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.runner import Runner
from parley.arena.training.config import RunSeeds, load_train_config
from parley.arena.training.sampler import AsyncSampler, SamplerConfig
from tests.arena.training.referential import REFERENTIAL_K2


def _config(seed: int, out: Path, **extra: Any) -> Any:
    data: dict[str, Any] = {
        "scenario": "collaboration/referential-v0",
        "scenario_kwargs": REFERENTIAL_K2,
        "model": "tiny",
        "policies": ["speaker", "listener"],
        "agent": {"max_tokens": 4, "system_prompt": False},
        "sampler": {"batch_size": 8, "staleness": 0, "concurrency": 8},
        "pg": {"lr": 1e-3},
        "seed": seed,
        "threads": 1,
        "progress": False,
        "stages": [
            {
                "name": "listener",
                "agents": {"speaker": "scripted", "listener": "policy:listener"},
                "train": ["listener"],
                "max_updates": 1,
            },
            {
                "name": "speaker",
                "agents": {"speaker": "policy:speaker", "listener": "policy:listener"},
                "train": ["speaker"],
                "max_updates": 1,
            },
        ],
        "out": str(out),
    }
    data.update(extra)
    return load_train_config(data=data)


def test_the_run_seed_drives_every_seed(tmp_path: Path) -> None:
    one, again, two = (RunSeeds.from_config(_config(s, tmp_path)) for s in (1, 1, 2))
    assert one == again
    assert one.init == {"speaker": 1, "listener": 1}  # one starting point, as a checkpoint
    assert two.init == {"speaker": 2, "listener": 2}
    assert len(set(one.episodes)) == 2  # each stage its own episodes
    assert set(one.episodes).isdisjoint(two.episodes)
    assert (one.torch, one.backend, one.trainer) == (1, 1, 1)
    assert (two.torch, two.backend, two.trainer) == (2, 2, 2)
    # Seeds set explicitly win, and are what is recorded.
    explicit = _config(
        1,
        tmp_path,
        policy_seeds={"speaker": 7},
        sampler={"batch_size": 8, "seed": 5},
        pg={"seed": 9},
    )
    seeds = RunSeeds.from_config(explicit)
    assert seeds.init == {"speaker": 7, "listener": 1}
    assert seeds.trainer == 9
    assert seeds.episodes != one.episodes
    assert RunSeeds.from_config(_config(5, tmp_path)).episodes == seeds.episodes
    # A checkpoint is its own initialisation: no init seed to record.
    assert RunSeeds.from_config(_config(1, tmp_path, model=str(tmp_path))).init == {}


def test_the_sampler_seed_changes_the_episodes() -> None:
    config = RunConfig(scenario="collaboration/referential-v0", agents=["scripted", "scripted"])
    runner = Runner(config)

    def plans(seed: int) -> list[tuple[int, dict[str, int]]]:
        sampler = AsyncSampler(runner, SamplerConfig(seed=seed, group_size=2))
        return [(p.seed, p.agent_seeds) for p in (sampler._plan() for _ in range(6))]

    assert plans(3) == plans(3)
    assert {s for s, _ in plans(3)}.isdisjoint({s for s, _ in plans(4)})
    assert plans(3)[0][0] == plans(3)[1][0]  # a group shares its scenario seed
    assert plans(3)[0][1] != plans(3)[1][1]  # but not its agents' seeds


@pytest.mark.timeout(300)
def test_same_seed_reproduces_a_run_and_another_seed_changes_it(tmp_path: Path) -> None:
    """Initial weights, episodes (hence rewards) and trained weights: equal for the same
    seed (up to float summation order), different for another; summary.json names them."""
    pytest.importorskip("torch")
    import torch

    from parley.arena.training.loop import train

    runs = {}
    for name, seed in (("a", 11), ("b", 11), ("c", 12)):
        result = train(_config(seed, tmp_path / name))
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        init = _weights(tmp_path / name / "base" / f"seed{seed}")
        runs[name] = (result, summary, init, _weights(result.checkpoints["listener"]))
    (ra, sa, ia, wa), (rb, sb, ib, wb), (rc, sc, ic, wc) = runs["a"], runs["b"], runs["c"]
    assert sa["seeds"] == sb["seeds"] == RunSeeds.from_config(_config(11, tmp_path)).as_dict()
    assert sc["seeds"]["run"] == 12
    assert all(torch.equal(ia[k], ib[k]) for k in ia)
    assert any(not torch.equal(ia[k], ic[k]) for k in ia)
    curves = [[s["curve"] for s in r.stage_summaries] for r in (ra, rb, rc)]
    assert curves[0] == curves[1]  # the same episodes, the same sampled actions
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)
    assert any(not torch.allclose(wa[k], wc[k], atol=1e-3) for k in wa)


def _weights(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


@pytest.mark.timeout(300)
def test_a_reading_stage_draws_its_exercises_from_the_run_seed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from parley.arena.training.loop import train

    reading = {
        "name": "reading",
        "kind": "reading",
        "train": ["listener"],
        "max_updates": 3,
        "target": None,
        "reading": {"batch_size": 8},
    }
    curves = {}
    for name in ("a", "b"):
        config = _config(3, tmp_path / name, stages=[reading])
        result = train(config)
        curves[name] = result.stage_summaries[0]["curve"]
        assert result.seeds["episodes"] == RunSeeds.from_config(config).episodes
    assert len(curves["a"]) == 3
    assert curves["a"] == curves["b"]
