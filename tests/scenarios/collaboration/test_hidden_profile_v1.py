"""hidden-profile-v1: the ``share`` move and the notebook, attacked as a learner would."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from parley.agents.scripted.collaboration import FactHoarder, FactSharer, FactTeller
from parley.protocols.errors import ConfigError
from parley.scenarios import make
from parley.scenarios.collaboration.hidden_profile import Fact
from parley.scenarios.conformance import play_episode

V0, V1 = "collaboration/hidden-profile-v0", "collaboration/hidden-profile-v1"
LEARNABLE = {
    "n_agents": 3,
    "facts_per_agent": 1,
    "discussion_rounds": 1,
    "talk": "share",
    "notebook": True,
}


def _digest(scenario_id: str) -> str:
    digest = hashlib.sha256()
    for seed in range(10):
        digest.update(json.dumps(play_episode(scenario_id, seed=seed), default=str).encode())
    return digest.hexdigest()


def test_v1_with_its_defaults_plays_exactly_as_v0() -> None:
    assert _digest(V0) == _digest(V1)


def test_v0_refuses_the_v1_arguments_and_v1_checks_them() -> None:
    with pytest.raises(TypeError):
        make(V0, talk="share")
    with pytest.raises(ConfigError, match="talk"):
        make(V1, talk="shout")
    with pytest.raises(ConfigError, match="notebook"):
        make(V1, notebook="yes")


def test_alone_every_notebook_is_a_tie_and_one_share_breaks_it_for_the_others() -> None:
    for seed in range(20):
        env = make(V1, **LEARNABLE)
        obs, infos = env.reset(seed=seed)
        best = env.profile.best
        for seat in env.possible_agents:
            letters = obs[seat].splitlines()[0].removeprefix("Known:").split(",")
            assert sorted(letters) == ["A", "B", "C"], obs[seat]
            assert infos[seat]["constraint"] == {"type": "choice", "choices": ["share", "pass"]}
        obs, rewards, _, _, infos = env.step(
            {"agent_0": "share", "agent_1": "pass", "agent_2": "pass"}
        )
        assert rewards == {"agent_0": -0.01, "agent_1": 0.0, "agent_2": 0.0}
        for seat in ("agent_1", "agent_2"):
            known = obs[seat].splitlines()[-2].removeprefix("Known:").split(",")
            assert sorted(known) == sorted(["A", "B", "C", best]), (obs[seat], best)
            assert infos[seat]["constraint"]["choices"] == ["A", "B", "C"]
        # the sharer learns nothing from its own message
        assert sorted(obs["agent_0"].splitlines()[-2].removeprefix("Known:").split(",")) == [
            "A",
            "B",
            "C",
        ]


def test_made_up_and_private_facts_reach_only_whom_they_should() -> None:
    env = make(V1, **{**LEARNABLE, "talk": "text"})
    env.reset(seed=4)
    held = env.profile.held
    real = next(f for f in held["agent_0"] if f not in held["agent_1"])
    fake = Fact(99 if real.id != 99 else 98, "A", 1)
    env.step(
        {
            "agent_0": f"@agent_1: {real.line()} and {fake.line()}",
            "agent_1": "[F01] option B: -1 (lies)",
            "agent_2": "pass",
        }
    )
    assert real in env.known["agent_1"]
    assert real not in env.known["agent_2"]  # private
    assert all(f in held["agent_0"] or f in held["agent_1"] for f in env.known["agent_1"])
    assert fake not in env.known["agent_1"]
    assert all(f.value == 1 for facts in env.known.values() for f in facts)


TALKY = {**LEARNABLE, "talk": "text", "discussion_rounds": 2}


def _lines_of(chunk: str) -> list[str]:
    return [f"[{part.strip()}" for part in chunk.split("[") if part.strip()]


def test_spraying_every_possible_fact_line_teaches_nothing() -> None:
    """Found by review: the notebook took any line matching a dealt fact, whoever sent it, so
    three seats that shared nothing they held, only all 297 possible fact lines, learned the
    whole deal from their notebooks and won every episode."""
    lines = [f"[F{i:02d}] option {o}: +1" for o in "ABC" for i in range(1, 100)]
    chunks = [" ".join(lines[k : k + 52]) for k in range(0, len(lines), 52)]
    for seed in range(20):
        env = make(V1, **TALKY)
        env.reset(seed=seed)
        held = {seat: set(facts) for seat, facts in env.profile.held.items()}
        for r in range(2):
            moves = {}
            for k, seat in enumerate(env.possible_agents):
                own = {f"[F{f.id:02d}] option {f.option}: +1" for f in held[seat]}
                moves[seat] = " ".join(  # a sprayer sends none of the facts it holds
                    line for line in _lines_of(chunks[3 * r + k]) if line not in own
                )
            env.step(moves)
        assert env.known == held, seed  # no guessed line entered a notebook
    # Relaying what one was told still teaches: agent_1 passes on agent_0's fact.
    env = make(V1, **TALKY)
    env.reset(seed=4)
    real = next(f for f in env.profile.held["agent_0"] if f not in env.profile.held["agent_2"])
    env.step({"agent_0": f"@agent_1: {real.line()}", "agent_1": "pass", "agent_2": "pass"})
    assert real not in env.known["agent_2"]
    env.step({"agent_0": "pass", "agent_1": real.line(), "agent_2": "pass"})
    assert real in env.known["agent_2"]


def test_hostile_talk_and_votes_never_crash_and_count_as_nothing() -> None:
    env = make(V1, **LEARNABLE)
    env.reset(seed=1)
    env.step({"agent_0": "SHARE", "agent_1": "@agent_0:", "agent_2": "\x00" * 5})
    _, rewards, terms, _, _infos = env.step(
        {"agent_0": "vote " * 300, "agent_1": "share", "agent_2": ""}
    )
    assert all(terms.values())
    assert env.episode_metrics()["invalid_moves"] >= 4
    assert set(rewards) == set(env.possible_agents)


def _success(agents: dict[str, object], episodes: int = 200) -> float:
    """Team success over ``episodes``; seats missing from ``agents`` play FactSharer."""
    agents = {f"agent_{i}": FactSharer() for i in range(3)} | agents
    wins = []
    for seed in range(episodes):
        env = make(V1, **LEARNABLE)
        play_episode(V1, seed=seed, env=env, agents=agents)  # type: ignore[arg-type]
        wins.append(env.episode_metrics()["success"])
    return float(np.mean(wins))


def test_scripted_references_sharers_win_hoarders_stay_near_chance() -> None:
    assert _success({}, 50) == 1.0  # FactSharer everywhere (the registered baseline)
    hoarders = {f"agent_{i}": FactHoarder() for i in range(3)}
    assert abs(_success(hoarders, 300) - 1 / 3) < 0.1


def test_a_voter_beside_two_tellers_decides_alone() -> None:
    """The recipe's first stages: two FactTellers share and abstain, so the team's choice is
    the learner's vote. A learner that reads its notebook wins every time; one that ignores
    it (FactHoarder: its own facts only) stays at chance."""
    tellers = {"agent_1": FactTeller(), "agent_2": FactTeller()}
    assert _success({"agent_0": FactSharer(), **tellers}, 50) == 1.0
    assert abs(_success({"agent_0": FactHoarder(), **tellers}, 300) - 1 / 3) < 0.1
