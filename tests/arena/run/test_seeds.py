"""derive_rows gives derive_seed's numbers, and plan_episodes the seeds derive_seed gives."""

from __future__ import annotations

import numpy as np
import pytest

from parley.arena.run import episode
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import derive_seed, plan_episodes
from parley.arena.run.seeds import WORD, derive_rows


@pytest.mark.parametrize("width", range(1, 10))
def test_derive_rows_matches_seed_sequence_bit_for_bit(width: int) -> None:
    rng = np.random.default_rng(width)
    keys = rng.integers(0, WORD, size=(200, width), dtype=np.uint64)
    keys[:60] = rng.integers(0, 3, size=(60, width))  # zeros and small keys, as runs use
    keys[60] = WORD - 1
    got = derive_rows(keys).tolist()
    assert got == [derive_seed(*(int(k) for k in row)) for row in keys]
    assert all(0 <= seed < 1 << 31 for seed in got)


def test_derive_rows_refuses_what_it_does_not_cover() -> None:
    with pytest.raises(ValueError, match="below 2\\*\\*32"):
        derive_rows(np.array([[WORD, 1]], dtype=np.uint64))
    with pytest.raises(ValueError, match="shape"):
        derive_rows(np.zeros(3, dtype=np.uint64))


def _scalar_plan(seed: int, tasks: int, trials: int, seats: list[str]) -> list[tuple[object, ...]]:
    return [
        (task, trial, derive_seed(seed, 0, task), {
            seat: derive_seed(seed, 1, task, trial, i) for i, seat in enumerate(seats)
        })
        for task in range(tasks)
        for trial in range(trials)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("seed", "tasks", "trials", "seats"),
    [
        (0, 5, 1, ["a", "b"]),
        (7, 9, 3, ["a", "b", "c", "d", "e", "f", "g"]),  # across chunk boundaries (below)
        (WORD - 1, 4, 2, ["x"]),
        (WORD + 5, 4, 2, ["x", "y"]),  # two-word run seed: the one-by-one path
        (3, 1, 2, ["a"]),
    ],
)
def test_plan_episodes_seeds_are_derive_seeds(
    seed: int, tasks: int, trials: int, seats: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episode, "_CHUNK", 4)
    config = RunConfig(
        scenario="negotiation/simple-trade-v1", episodes=tasks, trials=trials, seed=seed
    )
    plans = plan_episodes(config, seats)
    assert [p.index for p in plans] == list(range(len(plans)))
    got = [(p.task, p.trial, p.seed, p.agent_seeds) for p in plans]
    assert got == _scalar_plan(seed, tasks, trials, seats)
    assert all(type(p.seed) is int for p in plans)
    assert all(type(s) is int for p in plans for s in p.agent_seeds.values())
