"""An env reset with seeds it has seen before plays them as fresh envs do (LazyRng)."""

from __future__ import annotations

import numpy as np
import pytest

from parley.scenarios import make


def test_episodes_on_one_env_equal_episodes_on_fresh_ones() -> None:
    def transcript(env: object, seed: int) -> list[object]:
        observations, infos = env.reset(seed=seed)  # type: ignore[attr-defined]
        out: list[object] = [observations]
        rng = np.random.default_rng(seed)
        while env.agents:  # type: ignore[attr-defined]
            seat = next(s for s in env.agents if infos[s]["to_act"])  # type: ignore[attr-defined]
            legal = infos[seat]["view"]["legal"]
            step = env.step({seat: legal[int(rng.integers(len(legal)))]})  # type: ignore[attr-defined]
            infos = step[4]
            out.append(step[:4])
        return out

    pytest.importorskip("pyspiel")
    reused = make("openspiel:kuhn_poker")
    seeds = [3, 4, 3, 3, 4, 9]
    assert [transcript(reused, s) for s in seeds] == [
        transcript(make("openspiel:kuhn_poker"), s) for s in seeds
    ]
