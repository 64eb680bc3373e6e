"""Records whose steps are built after play (issue 33 §5): the same bytes, the same reads.

The event loop keeps each step as it came (references, copies only of an env's reused
dicts) and the transcript's steps and the trajectories' turns are built from them when the
record is first read: by the records' writer thread as it encodes, or by whoever reads
``record.transcript`` / ``record.trajectories`` first (the judge, ``keep_records``, the
sampler). The pinned digests were taken from the files and records of the runner as it was
before, when every step was built on the event loop: not one byte may change.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.records import EpisodeRecord, encode_json
from parley.arena.run.runner import run
from parley.scenarios import register
from tests.arena.run import test_steps_kept
from tests.arena.run.test_runner import SCENARIO as COUNT

BROADCAST = "test/broadcast-built-late-v0"
register(
    BROADCAST,
    "parley.arena.bench.env:Broadcast",
    baselines={"*": "parley.arena.bench.env:Chatter"},
    override=True,
)

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
