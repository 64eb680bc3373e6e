"""tool_use/research-team-v0: the scripted team solves it, rewards resist the known hacks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from parley.agents.scripted.research import FrequentGuesser, Researcher
from parley.protocols.messages import Observation
from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.tool_use.research_team import (
    MAX_MESSAGE_CHARS,
    SEATS,
    SHARDS,
    ResearchTeamV0,
    answer_f1,
)

ID = "tool_use/research-team-v0"


def _metrics(record: list[tuple[Any, ...]]) -> dict[str, float]:
    return json.loads(record[-1][1])


def test_the_scripted_researchers_answer_every_question_through_the_tools() -> None:
    for seed in range(10):
        metrics = _metrics(play_episode(ID, seed=seed))
        assert metrics["success"] == 1.0, (seed, metrics)
        assert metrics["f1"] == 1.0, (seed, metrics)
        assert metrics["tool_calls"] >= 4
        assert metrics["messages"] >= 2


def _answer_both(seed: int, answers: dict[str, str]) -> dict[str, dict[str, float]]:
    env = make(ID)
    env.reset(seed=seed)
    *_, infos = env.step({seat: json.dumps({"answer": answers[seat]}) for seat in SEATS})
    assert not env.agents
    return {seat: infos[seat]["components"] for seat in SEATS}


def _places(env: ResearchTeamV0) -> list[str]:
    return [e.name for e in env.research.world.of_kind("place")]


@pytest.mark.parametrize(
    "spray",
    [
        lambda names, years: ", ".join(names),
        lambda names, years: " or ".join(names),
        lambda names, years: " ".join(names),
        lambda names, years: "\n".join(names),
        lambda names, years: " ".join(years),
        lambda names, years: f"{names[0]} {years[0]}",
    ],
    ids=["commas", "or", "spaces", "lines", "years", "name-and-year"],
)
def test_answer_spraying_pays_nothing(spray: Any) -> None:
    """Many candidates in one answer score 0 even when the reference is among them."""
    for seed in range(8):
        env = make(ID)
        env.reset(seed=seed)
        reference = env.reference()
        if reference.isdigit():
            years = [str(int(reference) + d) for d in range(-3, 4)]
            names = [reference, *_places(env)[:3]]
        else:
            years = ["1800", "1801"]
            names = _places(env)
        assert reference in names or reference in years
        got = _answer_both(seed, dict.fromkeys(SEATS, spray(names, years)))
        assert all(c["task"] == 0.0 for c in got.values()), (seed, got)
        exact = _answer_both(seed, dict.fromkeys(SEATS, f"The answer is {reference}."))
        assert all(c["task"] > 0.0 for c in exact.values())  # a sentence around it still pays


def test_padding_the_right_answer_with_words_pays_less_then_nothing() -> None:
    env = make(ID)
    env.reset(seed=1)
    reference = env.reference()
    short = _answer_both(1, dict.fromkeys(SEATS, reference))["biographer"]["task"]
    padded = _answer_both(1, dict.fromkeys(SEATS, f"{reference} maybe perhaps"))
    long = _answer_both(1, dict.fromkeys(SEATS, f"{reference} " + "word " * 12))
    assert short == 1.0 > padded["biographer"]["task"] > 0.0
    assert long["biographer"]["task"] == 0.0


def test_guessing_frequent_names_stays_near_chance() -> None:
    """The most frequent place of the whole world (the attacker reads the world here, more
    than any seat can) and the scripted frequency guesser both stay far below the team."""
    frequent, guesser = [], []
    for seed in range(30):
        env = make(ID)
        env.reset(seed=seed)
        mentions = json.dumps([e.facts for e in env.research.world.entities.values()])
        top = max(_places(env), key=mentions.count)
        frequent.append(_answer_both(seed, dict.fromkeys(SEATS, top))["biographer"]["task"])
        record = play_episode(ID, seed=seed, agents={s: FrequentGuesser() for s in SEATS})
        guesser.append(_metrics(record)["f1"])
    assert sum(frequent) / len(frequent) < 0.3, frequent
    assert sum(guesser) / len(guesser) < 0.3, guesser


def test_no_observation_or_info_holds_the_answer_before_it_is_looked_up() -> None:
    for seed in range(12):
        env = make(ID)
        observations, infos = env.reset(seed=seed)
        reference = env.reference()
        seen = [observations, infos]
        *rest, infos = env.step(dict.fromkeys(SEATS, "{}"))  # both wait a turn
        seen += [rest[0], infos]
        text = json.dumps(seen)
        assert f'"{reference}"' not in text, seed
        assert f" {reference}" not in text, seed
        assert "oracle" not in text


def test_a_pasted_corpus_does_not_cross_the_message_channel_in_one_move() -> None:
    """Asking the other seat to paste its half: a message is at most 300 characters; a paste
    of the half is an invalid move that delivers nothing and uses the turn."""
    env = make(ID)
    env.reset(seed=0)
    half = "\n".join(env._indexes["geographer"].open(f"place-{i}") for i in range(6))
    assert len(half) > MAX_MESSAGE_CHARS
    ask = '{"message": "paste your corpus please"}'
    observations, _, _, _, infos = env.step(
        {"biographer": ask, "geographer": json.dumps({"message": half})}
    )
    assert "at most 300" in infos["geographer"]["invalid"]
    assert half.splitlines()[1] not in observations["biographer"]
    assert infos["biographer"]["view"]["messages"] == []
    assert infos["geographer"]["view"]["messages"] == ["paste your corpus please"]
    assert infos["geographer"]["view"]["turns_left"] == 9


@pytest.mark.parametrize(
    ("action", "outcome"),
    [
        ('{"tool_calls": [{"name": "search", "arguments": {"query": "NEAR(\\" OR *"}}]}', "ok"),
        ('{"tool_calls": [{"name": "search", "arguments": {"query": "\\u0000"}}]}', "error"),
        ('{"tool_calls": [{"name": "search", "arguments": {"query": "a", "k": 99}}]}', "error"),
        ('{"tool_calls": [{"name": "open", "arguments": {"doc_id": "../etc/passwd"}}]}', "error"),
        ('{"answer": 5}', "invalid"),
        ('{"message": ["x"]}', "invalid"),
        ('{"submit": "x"}', "invalid"),
        ("not json", "invalid"),
    ],
)
def test_hostile_actions_are_tool_errors_or_invalid_moves(action: str, outcome: str) -> None:
    env = make(ID)
    env.reset(seed=2)
    observations, _, _, _, infos = env.step(dict.fromkeys(SEATS, action))
    for seat in SEATS:
        results = infos[seat]["view"]["tool_results"]
        got = "invalid" if "invalid" in infos[seat] else "error" if "error" in results[0] else "ok"
        assert got == outcome, infos[seat]
        assert env.observation_space(seat).contains(observations[seat])


def _observe(env: ResearchTeamV0, seat: str, obs: dict[str, str], infos: dict[str, Any]) -> Any:
    return Observation(agent=seat, text=obs[seat], scenario=ID, info=infos[seat])


def test_concurrent_episodes_do_not_cross_talk() -> None:
    """Two instances stepped in lockstep (different seeds) play as each does alone."""
    alone = [play_episode(ID, seed=seed) for seed in (4, 5)]
    envs = [make(ID), make(ID)]
    teams = [{s: Researcher() for s in SEATS} for _ in envs]
    state = [env.reset(seed=seed) for env, seed in zip(envs, (4, 5), strict=True)]
    while any(env.agents for env in envs):
        for i, env in enumerate(envs):
            if not env.agents:
                continue
            obs, infos = state[i]
            actions = {
                s: teams[i][s].decide(_observe(env, s, obs, infos)) if infos[s]["to_act"] else ""
                for s in env.agents
            }
            obs, _, _, _, infos = env.step(actions)
            state[i] = (obs, infos)
    for env, record in zip(envs, alone, strict=True):
        assert env.episode_metrics() == _metrics(record)


def test_f1_is_squad_style() -> None:
    assert answer_f1("The Tessamar.", "tessamar") == 1.0
    assert answer_f1("Rena Volk", "Rena Volkov") == 0.5
    assert answer_f1("", "x") == 0.0


def test_each_seat_searches_only_its_half() -> None:
    env = make(ID)
    env.reset(seed=3)
    for seat in SEATS:
        index = env._indexes[seat]
        for entity in env.research.world.entities.values():
            titles = [hit["title"] for hit in index.search(entity.name, k=10)]
            assert (entity.name in titles) == (entity.kind in SHARDS[seat]), (seat, entity)


def test_a_user_corpus_is_searchable_by_both_seats(tmp_path: Path) -> None:
    (tmp_path / "atlas.txt").write_text("Quillmoor atlas\nMaps of the Quillmoor marshes.\n")
    env = make(ID, corpus_dir=str(tmp_path))
    env.reset(seed=0)
    for seat in SEATS:
        assert env._indexes[seat].search("quillmoor marshes")[0]["doc_id"] == "user:0"


def test_building_an_episode_costs_milliseconds_of_cpu() -> None:
    """World, two FTS5 indexes and the briefing per reset: well under 20 ms of CPU each
    (measured 2.5 ms); a work budget, not wall time."""
    env = make(ID)
    env.reset(seed=0)
    start = time.process_time()
    for seed in range(20):
        env.reset(seed=seed)
    assert (time.process_time() - start) / 20 < 0.02
