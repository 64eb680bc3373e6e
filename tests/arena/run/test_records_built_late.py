"""Records whose steps are built after play (issue 33 §5): the same bytes, the same reads.

The event loop keeps each step as it came (references, copies only of an env's reused
dicts) and the transcript's steps and the trajectories' turns are built from them when the
record is first read: by the records' writer thread as it encodes, or by whoever reads
``record.transcript`` / ``record.trajectories`` first (the judge, ``keep_records``, the
sampler). The pinned digests were taken from the files and records of the runner as it was
before, when every step was built on the event loop: not one byte may change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.episode import FROZEN_AFTER, EpisodeLog, EpisodePlan
from parley.arena.run.records import EpisodeRecord, RecordsError, RecordWriter, encode_json
from parley.arena.run.runner import run
from parley.protocols.messages import Action, Observation, TokenRecord
from tests.arena.run import test_steps_kept
from tests.arena.run.broadcast_fixture import register_broadcast
from tests.arena.run.test_runner import SCENARIO as COUNT

BROADCAST = register_broadcast("test/broadcast-built-late-v0")

_COMMON: dict[str, Any] = {"episodes": 3, "trials": 2, "concurrency": 3, "seed": 7}
RUNS: dict[str, dict[str, Any]] = {
    name: {"scenario": name, **_COMMON}
    for name in (
        "collaboration/hidden-profile-v2",
        "collaboration/referential-v1",
        "negotiation/deal-or-no-deal-v0",
        "negotiation/deal-or-no-deal-v3",
        "negotiation/simple-trade-v1",
        "negotiation/split-the-pie-v1",
        "tool_use/calc-chain-v1",
        "tool_use/research-team-v0",
        "tool_use/retail-desk-v3",
    )
}
RUNS.update(
    {
        # 8 seats acting every step (the bench's broadcast), fresh dicts: nothing copied.
        "broadcast": {"scenario": BROADCAST, "scenario_kwargs": {"steps": 6}, **_COMMON},
        # Episodes past FROZEN_AFTER steps: with out, their steps are kept as their JSON.
        "broadcast-long": {"scenario": BROADCAST, "scenario_kwargs": {"steps": 20}, **_COMMON},
        # Another agent in a seat.
        "simple-trade-v1-v0-trader": {
            "scenario": "negotiation/simple-trade-v1",
            "agents": ["scripted", "parley.agents.scripted.negotiation:Trader"],
            **_COMMON,
        },
        # Not a Scenario (its dicts are copied), tokens in every action.
        "count": {"scenario": COUNT, **_COMMON},
        # Invalid moves.
        "count-noisy": {
            "scenario": COUNT,
            "agents": ["scripted", "tests.arena.run.test_runner:NoisyAgent"],
            **_COMMON,
        },
        # Failed episodes, steps up to the failure kept (a value the bus cannot carry).
        "count-failing": {"scenario": COUNT, "scenario_kwargs": {"weird_info_at": 3}, **_COMMON},
        # Envs that hand out the same dicts every step, changed in place.
        "reusing": {"scenario": test_steps_kept.REUSING, **_COMMON},
        "overriding": {"scenario": test_steps_kept.OVERRIDING, **_COMMON},
    }
)

# sha256[:16] of transcripts.jsonl + trajectories.jsonl, and of the records after a judge's
# credit, from the runner that built every step on the event loop (before this change).
PINNED: dict[str, tuple[str, str]] = {
    "broadcast": ("d5ced0c8869a3853", "c234532bc6fd68cf"),
    "broadcast-long": ("c64cc8b298e574c7", "a586ecbf0c0e30fe"),  # (pinned at 9013437)
    "collaboration/hidden-profile-v2": ("ce1751ddd8ecd6dc", "12d3ba67518f7f35"),
    "collaboration/referential-v1": ("b88b70c338ec23d7", "cfc7a053be6cf853"),
    "count": ("54d6c4a8def48917", "89225f3ff9e8dd6a"),
    "count-failing": ("53241f0e06e22bb7", "53241f0e06e22bb7"),
    "count-noisy": ("9487dc6a2eda249b", "d3d5c5abcf74a704"),
    "negotiation/deal-or-no-deal-v0": ("804a48c844fd388a", "e6a50e7f9af4a03e"),
    "negotiation/deal-or-no-deal-v3": ("8a809dbfcf2dfe7d", "eb10ce7e454dc471"),
    "negotiation/simple-trade-v1": ("9f0ea5b031a80851", "ef1fb89b3435111f"),
    "negotiation/split-the-pie-v1": ("a743ab5fabc47eee", "6d478c40fa68643e"),
    "overriding": ("189b26a2236efc5c", "fda45e727889af74"),
    "reusing": ("f5dbb7109e0e8680", "d6b3c482b8814674"),
    "simple-trade-v1-v0-trader": ("e2616b3ef398f900", "36e0b34ce8afcf7e"),
    "tool_use/calc-chain-v1": ("7e3d4802d2b9bbec", "fc32e44cce839e96"),
    "tool_use/research-team-v0": ("58f04a4168c917a1", "664de66d7ecac888"),
    "tool_use/retail-desk-v3": ("f1222296ad73266e", "f5a64e15cf9bb2fc"),
}


def _digest(transcripts: bytes, trajectories: bytes) -> str:
    return hashlib.sha256(transcripts + b"|" + trajectories).hexdigest()[:16]


def _records_digest(records: list[EpisodeRecord]) -> str:
    return _digest(
        b"".join(encode_json(r.transcript) + b"\n" for r in records),
        b"".join(encode_json(t) + b"\n" for r in records for t in r.trajectories),
    )


def _credited(records: list[EpisodeRecord]) -> str:
    """What a judge's credit makes of ``records`` (the first seat's component)."""
    for record in records:
        if not record.failed:
            first = record.trajectories[0].agent
            record.credit("judge", {first: 0.25})
    return _records_digest(records)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_files_and_kept_records_are_the_pinned_ones(tmp_path: Path, name: str) -> None:
    config = RunConfig(progress=False, **RUNS[name])
    result = run(config.replace(out=str(tmp_path)))
    files = _digest(
        (tmp_path / "transcripts.jsonl").read_bytes(),
        (tmp_path / "trajectories.jsonl").read_bytes(),
    )
    kept = run(config, keep_records=True).records
    assert result.summary["agent_steps"] > 0
    assert _records_digest(kept) == files
    assert (files, _credited(kept)) == PINNED[name]


def _played(steps: int = 4, *, frozen: bool = False, info_key: Any = "invalid") -> EpisodeRecord:
    """The record of an episode of two seats, "a" acting every step (with tokens), "b"
    every other step (rewarded on the steps it sits out too); its steps not built yet
    (with ``frozen``, kept as their JSON; ``info_key``: b's info key on step 1)."""
    plan = EpisodePlan(index=0, task=0, trial=0, seed=1, agent_seeds={"a": 1, "b": 2})
    log = EpisodeLog(plan, "x", ["a", "b"], {"a": "llm:p", "b": "scripted"})
    log.frozen_steps = frozen
    for turn in range(steps):
        token = TokenRecord(
            policy="p", policy_version=0, prompt_token_ids=[turn], token_ids=[2], logprobs=[-1]
        )
        acting = {"a": [token], "b": []} if turn % 2 else {"a": [token]}
        log.add_step(
            turn,
            {seat: Observation(agent=seat, text=f"{seat} sees {turn}") for seat in acting},
            {
                seat: Action(agent=seat, text=f"{seat}{turn}", tokens=t)
                for seat, t in acting.items()
            },
            {},
            {"a": 1.0, "b": 0.5},
            {"a": False, "b": False},
            {"a": False, "b": False},
            {
                "a": {"components": {"task": 1.0}},
                "b": {info_key: "no"} if turn == 1 else {"invalid": ""},
            },
        )
    return log.record()


def _built(record: EpisodeRecord) -> EpisodeRecord:
    record.transcript  # noqa: B018 -- the first read builds the steps
    return record


def test_a_record_reads_as_if_built_at_once() -> None:
    record = _played()
    assert (record.agent_steps, record.invalid_moves) == (6, 1)
    assert record.returns() == [("a", 4.0), ("b", 2.0)]  # (known before any step is built)
    a, b = record.trajectories
    assert [(t.turn, t.observation, t.action, t.reward, t.invalid) for t in b.turns] == [
        # step 0's reward went to no decision of b's, step 2's to its latest (step 1's)
        (1, "b sees 1", "b1", 1.0, "no"),
        (3, "b sees 3", "b3", 0.5, ""),
    ]
    assert [t.tokens[0].prompt_token_ids for t in a.turns] == [[0], [1], [2], [3]]
    assert a.components == {"task": 4.0}
    steps = record.transcript["steps"]
    assert [step["actions"] for step in steps[:2]] == [{"a": "a0"}, {"a": "a1", "b": "b1"}]
    assert steps[1]["observations"] == {"a": "a sees 1", "b": "b sees 1"}


def test_an_unbuilt_record_encodes_and_copies_as_a_built_one() -> None:
    """The ray worker ships records with msgspec (which reads a dataclass's ``__dict__``)
    and copies them with ``dataclasses.replace``: both must see the built steps."""
    built = msgspec.msgpack.encode(_built(_played()))
    assert msgspec.msgpack.encode(_played()) == built
    assert msgspec.json.encode(_played()) == msgspec.json.encode(_built(_played()))
    copy = dataclasses.replace(_played(), transcript={})
    assert [len(t.turns) for t in copy.trajectories] == [4, 2]
    assert _played() == _built(_played())


def test_a_record_read_from_threads_at_once_is_built_once() -> None:
    record = _played(steps=200)
    start = threading.Barrier(4)
    seen: list[tuple[int, int, int]] = []

    def read() -> None:
        start.wait()
        a, b = record.trajectories
        seen.append((len(record.transcript["steps"]), len(a.turns), len(b.turns)))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert seen == [(200, 200, 100)] * 4


@pytest.mark.timeout(60)
def test_a_run_with_out_builds_its_steps_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the loop's summary nor its hand-over reads a step: the writer thread builds
    every record as it encodes it."""
    threads: list[str] = []
    build = EpisodeLog._build

    def spy(log: EpisodeLog) -> None:
        threads.append(threading.current_thread().name)
        build(log)

    monkeypatch.setattr(EpisodeLog, "_build", spy)
    run(RunConfig(progress=False, out=str(tmp_path), **RUNS["negotiation/simple-trade-v1"]))
    assert threads == ["parley-records"] * 6


def test_steps_kept_as_their_json_write_the_same_bytes() -> None:
    """``EpisodeLog.frozen_steps`` (a run with ``out`` whose records only the writer reads):
    each step's env dicts are kept as their JSON once the episode is long, and the record
    writes as the objects do."""
    short = _played(FROZEN_AFTER, frozen=True).transcript["steps"]
    assert {type(v) for step in short for v in step.values()} == {int, dict}
    steps = FROZEN_AFTER + 3
    record = _played(steps, frozen=True)
    assert record.returns() == [("a", 1.0 * steps), ("b", 0.5 * steps)]
    assert record.invalid_moves == 1
    for step in record.transcript["steps"]:  # (the first steps too, once it is long)
        assert [type(v) for v in step.values()] == [int, dict, dict, *[msgspec.Raw] * 4]
    assert encode_json(record.transcript) == encode_json(_built(_played(steps)).transcript)
    assert [encode_json(t) for t in record.trajectories] == [
        encode_json(t) for t in _played(steps).trajectories
    ]


@pytest.mark.timeout(30)
def test_a_step_json_cannot_hold_still_fails_its_write(tmp_path: Path) -> None:
    """A step kept as its JSON that JSON cannot hold (a key that is no string) is kept as
    it came: its write fails naming the episode, as it did before."""
    record = _played(FROZEN_AFTER + 1, frozen=True, info_key=1)
    log = record.log
    assert log is not None
    assert log._played[1][-1] == {"a": {"components": {"task": 1.0}}, "b": {1: "no"}}
    assert type(log._played[0][-1]) is msgspec.Raw
    writer = RecordWriter(tmp_path)
    writer.add(record)
    with pytest.raises(RecordsError, match="t00000-r00"):
        writer.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("keep", "kept_as"), [(False, msgspec.Raw), (True, dict)])
def test_a_run_with_out_keeps_long_episodes_steps_as_json_unless_its_records_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: bool, kept_as: type
) -> None:
    seen: set[type] = set()
    frozen_after: dict[int, int] = {}
    build = EpisodeLog._build

    def spy(log: EpisodeLog) -> None:
        seen.update(type(value) for step in log._played for value in step[-4:])
        frozen_after[log.plan.index] = log.frozen_after
        build(log)

    monkeypatch.setattr(EpisodeLog, "_build", spy)
    config = RunConfig(progress=False, out=str(tmp_path), **RUNS["broadcast"])
    steps = {"steps": FROZEN_AFTER + 2}
    run(config.replace(scenario_kwargs=steps), keep_records=keep)
    assert seen == {kept_as}
    # The first episode starts before any has ended; once a long one has ended, those
    # that start keep their steps as JSON from the first.
    assert frozen_after[0] == FROZEN_AFTER
    assert frozen_after[5] == 0
    assert set(frozen_after.values()) == {FROZEN_AFTER, 0}
