"""Population self-play (:mod:`parley.arena.training.population`): the sampling rules'
distributions, the learner's record per member, snapshots frozen in the pool, and a real
run whose population grows every K updates and is taken back by a run resumed in its out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from parley.arena.training.config import load_train_config
from parley.arena.training.population import Member, Population, PopulationConfig
from parley.protocols.errors import ConfigError

DRAWS = 8_000
SCENARIO = "openspiel:kuhn_poker"


def _population(tmp_path: Path, rule: str, members: list[Member], **extra: Any) -> Population:
    config = PopulationConfig(rule=rule, members=["scripted"], **extra)
    population = Population(config, tmp_path / "population", "default")
    population.members = members
    return population


def _members() -> list[Member]:
    return [
        Member("scripted", "agent"),
        Member("default@0", "snapshot", 0, games=8, score=8.0),  # learner always won
        Member("default@5", "snapshot", 5, games=8, score=0.0),  # ... always lost
        Member("default@10", "snapshot", 10),  # unplayed
    ]


def _counts(population: Population) -> np.ndarray:
    counts = np.zeros(len(population.members))
    names = [m.name for m in population.members]
    for seed in range(DRAWS):
        counts[names.index(population.draw("player_1", seed).name)] += 1
    return counts


@pytest.mark.parametrize(
    ("rule", "extra", "expected"),
    [
        ("uniform", {}, [0.25, 0.25, 0.25, 0.25]),
        # decay 0.5, newest last: 1/8, 1/4, 1/2, 1 over 15/8.
        ("latest", {"latest_decay": 0.5}, [1 / 15, 2 / 15, 4 / 15, 8 / 15]),
        # win rates (s+1)/(g+2): 0.5, 0.9, 0.1, 0.5 -> (1-p)^2: 0.25, 0.01, 0.81, 0.25.
        ("pfsp", {"pfsp_power": 2.0}, [0.25 / 1.32, 0.01 / 1.32, 0.81 / 1.32, 0.25 / 1.32]),
        # only the latest 2 snapshots are drawn (the fixed member stays).
        ("uniform", {"max_snapshots": 2}, [1 / 3, 0.0, 1 / 3, 1 / 3]),
    ],
)
def test_each_rule_draws_members_with_its_distribution(
    tmp_path: Path, rule: str, extra: dict[str, Any], expected: list[float]
) -> None:
    population = _population(tmp_path, rule, _members(), **extra)
    np.testing.assert_allclose(population.probabilities(), expected, rtol=1e-12)
    counts = _counts(population)
    p = np.asarray(expected)
    # Within 5 standard deviations of the binomial count of each member (seeded: exact).
    sigma = np.sqrt(DRAWS * p * (1 - p))
    assert np.all(np.abs(counts - DRAWS * p) <= 5 * sigma + 1e-9), (counts / DRAWS, p)
    # The draw is the episode's: the same agent seed draws the same member.
    assert population.draw("player_1", 7).name == population.draw("player_1", 7).name


def _record(seed: int, mine: float, theirs: float, failed: str = "") -> Any:
    trajectories = [
        SimpleNamespace(agent="player_0", reward=mine),
        SimpleNamespace(agent="player_1", reward=theirs),
    ]
    transcript = {"agent_seeds": {"player_0": seed + 1, "player_1": seed}}
    return SimpleNamespace(trajectories=trajectories, transcript=transcript, failed=failed)


def test_the_learner_is_scored_against_the_member_each_episode_drew(tmp_path: Path) -> None:
    population = _population(tmp_path, "pfsp", _members())
    drawn = [population.draw("player_1", seed) for seed in (10, 20, 30, 40)]
    records = [
        _record(10, 1.0, -1.0),  # a win
        _record(20, 0.0, 0.0),  # a tie
        _record(30, -2.0, 2.0),  # a loss
        _record(40, 5.0, -5.0, failed="agent_error: timeout"),  # not a game: no score
    ]
    before = {m.name: (m.games, m.score) for m in population.members}
    population.observe(records, {"player_0"})
    gained: dict[str, list[float]] = {}
    for member, outcome in zip(drawn[:3], (1.0, 0.5, 0.0), strict=True):
        gained.setdefault(member.name, []).append(outcome)
    for m in population.members:
        games, score = before[m.name]
        got = gained.get(m.name, [])
        assert (m.games, m.score) == (games + len(got), score + sum(got)), m.name
    saved = json.loads((tmp_path / "population" / "population.json").read_text())
    assert [m["games"] for m in saved["members"]] == [m.games for m in population.members]


def test_population_config_errors_name_the_fix(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="choose one of"):
        PopulationConfig(rule="elo")
    base = _config(tiny_model_dir, tmp_path, 1)
    base.pop("population")
    with pytest.raises(ConfigError, match="no population"):
        load_train_config(data=base)
    with pytest.raises(ConfigError, match=r"population\.policy"):
        load_train_config(data={**base, "population": {"policy": "nobody"}})


def _config(model: Path, out: Path, updates: int, **population: Any) -> dict[str, Any]:
    return {
        "scenario": SCENARIO,
        "model": str(model),
        "agent": {"max_tokens": 3, "system_prompt": False},
        "lora": {"r": 2, "alpha": 4},
        "threads": 2,
        "progress": False,
        "sampler": {"batch_size": 4, "staleness": 0, "concurrency": 4},
        "pg": {"lr": 5e-2},
        "population": {"every": 2, "members": ["scripted"], **population},
        "stages": [
            {
                "name": "fsp",
                "agents": {"player_0": "policy:default", "player_1": "population"},
                "train": ["default"],
                "max_updates": updates,
            }
        ],
        "out": str(out),
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lora", [True, False], ids=["adapter", "whole-model"])
def test_a_snapshot_stays_frozen_in_the_pool_as_the_learner_updates(
    tiny_model_dir: Path, tmp_path: Path, lora: bool
) -> None:
    pytest.importorskip("peft")
    import torch
    from peft import get_peft_model_state_dict

    from parley.arena.inference.pool import InferencePool
    from parley.arena.training.config import RunSeeds
    from parley.arena.training.models import load_policies
    from parley.arena.training.population import open_population
    from parley.arena.training.sync import InProcessSync

    data = _config(tiny_model_dir, tmp_path, 1)
    if not lora:
        data.pop("lora")
    config = load_train_config(data=data)
    policies = load_policies(
        config, RunSeeds.from_config(config), {"default": tiny_model_dir}, tmp_path
    )
    learner = policies.weights["default"]

    def served(pool: Any, name: str) -> dict[str, np.ndarray]:
        """The tensors the pool serves ``name`` with (its own copy, not the trainer's)."""
        backend = pool.backend(name)
        if lora:
            adapters = backend._lora
            state = get_peft_model_state_dict(adapters.peft, adapter_name=adapters.keys[name])
        else:
            state = backend.model.state_dict()
        return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}

    async def main() -> tuple[dict[str, np.ndarray], ...]:
        pool = await InferencePool(policies.served).start()
        try:
            await policies.attach(pool)
            population = await open_population(config, policies, pool, tmp_path)
            assert population is not None
            with torch.no_grad():  # a learned policy (an adapter's B is no longer zero)
                for p in learner.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            await InProcessSync(pool).push("default", 1, learner.state_tensors())
            member = await population.take_snapshot(learner)
            taken = served(pool, member.name)
            for version in (2, 3):  # later updates of the learner
                with torch.no_grad():
                    for p in learner.parameters():
                        p.add_(0.5)
                await InProcessSync(pool).push("default", version, learner.state_tensors())
            return taken, served(pool, member.name), served(pool, "default")
        finally:
            await pool.close()

    taken, later, learner_now = asyncio.run(main())
    assert (tmp_path / "population" / "default@0").is_dir()
    assert taken.keys() == later.keys()
    for key in taken:
        np.testing.assert_array_equal(later[key], taken[key])  # frozen in the pool
    now = learner.state_tensors()  # the trainer's learner, as the pool serves it
    moved = [k for k in now if k in taken and not np.allclose(now[k], taken[k])]
    assert moved  # ... while the learner moved on, in the trainer and in the pool
    assert any(not np.allclose(learner_now[k], taken[k]) for k in taken)


@pytest.mark.long
@pytest.mark.timeout(300)
def test_the_population_grows_every_k_updates_and_a_resumed_run_keeps_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from parley.arena.training.loop import train

    out = tmp_path / "run"
    train(load_train_config(data=_config(tiny_model_dir, out, 4)))
    saved = json.loads((out / "population" / "population.json").read_text())
    snaps = [m for m in saved["members"] if m["kind"] == "snapshot"]
    # At the stage's start and after updates 2 and 4: the population grew every K=2.
    assert [m["update"] for m in snaps] == [0, 2, 4]
    assert saved["updates"] == 4
    assert all((Path(m["path"]) / "adapter_model.safetensors").exists() for m in snaps)
    games = sum(m["games"] for m in saved["members"])
    assert games > 0  # the learner's record against the members it met

    # The same out again: the population comes back (snapshots served, records kept) and
    # grows on from update 4.
    train(load_train_config(data=_config(tiny_model_dir, out, 2)))
    resumed = json.loads((out / "population" / "population.json").read_text())
    assert [m["update"] for m in resumed["members"] if m["kind"] == "snapshot"] == [0, 2, 4, 6]
    assert resumed["updates"] == 6
    assert sum(m["games"] for m in resumed["members"]) > games
