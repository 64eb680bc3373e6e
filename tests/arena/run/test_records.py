"""The records a run writes: byte-identical files, and a writer thread that never lets the
event loop wait on JSON or the disk, never grows without bound, never loses a record.

The pinned digests were taken from the files the runner wrote before the writer had a thread
(encoding and writing on the event loop): moving the work must not change one byte.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np
import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.records import EpisodeRecord, RecordsError, RecordWriter, encode_json
from parley.arena.run.runner import run
from parley.protocols.messages import Trajectory, TurnRecord

# sha256[:16] of the files, from the runner as it was before the writer thread.
PINNED = {
    ("negotiation/simple-trade-v1", "transcripts.jsonl"): "bf7c3cd1f921bc8c",
    ("negotiation/simple-trade-v1", "trajectories.jsonl"): "d9ca10206c11be48",
    ("negotiation/deal-or-no-deal-v0", "transcripts.jsonl"): "17515eb9b5e4ff2d",
    ("negotiation/deal-or-no-deal-v0", "trajectories.jsonl"): "1187bddff8219de2",
}
RUNS = {
    "negotiation/simple-trade-v1": {"episodes": 6, "trials": 2, "concurrency": 3, "seed": 3},
    "negotiation/deal-or-no-deal-v0": {"episodes": 4, "concurrency": 2, "seed": 5},
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", sorted(RUNS))
def test_run_files_are_byte_identical_to_the_pinned_ones(tmp_path: Path, scenario: str) -> None:
    config = RunConfig(scenario=scenario, progress=False, out=str(tmp_path), **RUNS[scenario])
    timing = run(config).summary["timing"]
    # The event loop's own CPU is reported apart from the process's (writer thread included).
    assert timing["play_loop_cpu_s"] > 0
    for name in ("transcripts.jsonl", "trajectories.jsonl"):
        digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()[:16]
        assert digest == PINNED[scenario, name], name


def test_encode_json_writes_non_finite_and_numpy_values_as_before() -> None:
    value = {
        "b": [float("nan"), float("inf"), -float("inf"), 1.5],
        "a": (np.float64("nan"), np.float32(0.5), np.int64(3), np.array([1.0, np.nan])),
        "c": {"z": {2, 1}, "y": object()},
    }
    assert encode_json(value) == (
        b'{"a":[null,0.5,3,[1.0,null]],"b":[null,null,null,1.5],'
        b'"c":{"y":"<unserializable object>","z":[1,2]}}'
    )


def _record(index: int) -> EpisodeRecord:
    episode = f"t{index:05d}-r00"
    turn = TurnRecord(turn=0, observation="o", action=f"say {index}")
    trajectory = Trajectory(episode=episode, scenario="s", agent="a", seed=index, turns=[turn])
    transcript = {"episode": episode, "index": index, "steps": [{"actions": {"a": "x"}}]}
    return EpisodeRecord(
        index=index,
        episode=episode,
        task=index,
        trial=0,
        seed=index,
        transcript=transcript,
        trajectories=[trajectory],
    )


def _expected(records: list[EpisodeRecord]) -> tuple[bytes, bytes]:
    ordered = sorted(records, key=lambda r: r.index)
    return (
        b"".join(encode_json(r.transcript) + b"\n" for r in ordered),
        b"".join(encode_json(t) + b"\n" for r in ordered for t in r.trajectories),
    )


class _File:
    """A real file whose every write first calls ``before(n)`` (``n``: writes so far): a
    hook that stalls or fails the way a disk does."""

    def __init__(self, path: Path, before: Callable[[int], None]) -> None:
        self.file = path.open("wb")
        self.before = before
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.before(self.writes)
        self.writes += 1
        return self.file.write(data)

    def close(self) -> None:
        self.file.close()


def _opener(before: Callable[[int], None], name: str = "") -> Callable[[Path], IO[bytes]]:
    """Opens ``name`` (every file without one) as a :class:`_File` calling ``before``."""

    def opener(path: Path) -> IO[bytes]:
        if name and path.name != name:
            return path.open("wb")
        return _File(path, before)  # type: ignore[return-value]

    return opener


def _full_disk(writes: int) -> None:
    """The second write fails as a full disk does."""
    if writes >= 1:
        raise OSError(errno.ENOSPC, "No space left on device")


def _stalled(gate: threading.Event) -> Callable[[int], None]:
    """A write hook that waits for ``gate`` (a disk that has stalled until it is set)."""

    def stalled(_: int) -> None:
        if not gate.wait(timeout=30):
            raise OSError(errno.EIO, "the test's gate never opened")

    return stalled


@pytest.mark.timeout(30)
async def test_a_stalled_disk_bounds_the_queue_and_the_loop_goes_on(tmp_path: Path) -> None:
    gate = threading.Event()
    records = [_record(i) for i in range(12)]
    writer = RecordWriter(tmp_path, queue_records=3, opener=_opener(_stalled(gate)))
    handed = 0

    async def produce() -> None:
        nonlocal handed
        for record in records:
            await writer.put(record)
            handed += 1

    producer = asyncio.ensure_future(produce())
    ticks = 0
    # The thread takes one record and stalls in its write; 3 more fill the queue; the 5th
    # put waits for room (and the event loop keeps running meanwhile: ticks go on).
    while handed < 4 or ticks < 50:
        await asyncio.sleep(0.001)
        ticks += 1
    assert handed == 4
    assert not producer.done()
    gate.set()
    await asyncio.wait_for(producer, timeout=20)
    writer.close()
    transcripts, trajectories = _expected(records)
    assert (tmp_path / "transcripts.jsonl").read_bytes() == transcripts
    assert (tmp_path / "trajectories.jsonl").read_bytes() == trajectories


@pytest.mark.timeout(30)
async def test_a_put_cancelled_on_a_full_queue_still_hands_its_record_over(
    tmp_path: Path,
) -> None:
    """SIGINT cancels the episodes' tasks; one waiting for room in the queue must not drop
    the record of the episode it has just finished."""
    gate = threading.Event()
    writer = RecordWriter(tmp_path, queue_records=1, opener=_opener(_stalled(gate)))
    records = [_record(i) for i in range(3)]
    await writer.put(records[0])  # taken by the thread, which stalls in its write
    await writer.put(records[1])  # (waits, if need be, until the thread took record 0)
    waiting = asyncio.ensure_future(writer.put(records[2]))
    for _ in range(20):
        await asyncio.sleep(0.005)
    assert not waiting.done()  # the queue is full: the put waits
    opener = threading.Timer(0.2, gate.set)  # the disk comes back after the cancellation
    opener.start()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    opener.join()
    writer.close()
    transcripts, _ = _expected(records)
    assert (tmp_path / "transcripts.jsonl").read_bytes() == transcripts


@pytest.mark.timeout(30)
def test_a_failing_write_raises_once_naming_the_file_and_what_to_do(tmp_path: Path) -> None:
    opener = _opener(_full_disk, "trajectories.jsonl")
    writer = RecordWriter(tmp_path, queue_records=2, opener=opener)
    raised: list[RecordsError] = []
    for index in range(40):  # more than the queue holds: no add() may hang after the error
        try:
            writer.add(_record(index))
        except RecordsError as exc:
            raised.append(exc)
            break
    try:
        writer.close()  # raises it if no add() did; closes the files either way
    except RecordsError as exc:
        raised.append(exc)
    assert len(raised) == 1
    message = str(raised[0])
    assert str(tmp_path / "trajectories.jsonl") in message
    assert "No space left on device" in message
    assert "free some space" in message


@pytest.mark.timeout(30)
def test_a_failing_write_is_raised_by_close_when_no_add_came_after(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, opener=_opener(_full_disk, "timings.jsonl"))
    writer.add(_record(0))
    writer.add(_record(1))
    with pytest.raises(RecordsError, match=r"timings\.jsonl"):
        writer.close()
    # The first record went through whole.
    assert (tmp_path / "transcripts.jsonl").read_bytes().count(b"\n") >= 1


@pytest.mark.timeout(30)
def test_a_record_json_cannot_hold_is_a_records_error_naming_the_episode(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path)
    bad = _record(0)
    bad.transcript["steps"][0]["infos"] = {1: "a key that is no string"}
    writer.add(bad)
    with pytest.raises(RecordsError, match="t00000-r00"):
        writer.close()


@pytest.mark.timeout(30)
def test_close_writes_everything_handed_over_gaps_included(tmp_path: Path) -> None:
    stall = threading.Event()  # never set: each write waits 2 ms (the writer lags behind)
    writer = RecordWriter(tmp_path, queue_records=4, opener=_opener(lambda _: stall.wait(0.002)))
    # Index 5 never comes (an interrupted run): the records after it still reach the files.
    records = [_record(i) for i in range(30) if i != 5]
    for record in records:
        writer.add(record)
    writer.close()
    transcripts, trajectories = _expected(records)
    assert (tmp_path / "transcripts.jsonl").read_bytes() == transcripts
    assert (tmp_path / "trajectories.jsonl").read_bytes() == trajectories
    assert (tmp_path / "timings.jsonl").read_bytes().count(b"\n") == len(records)


def test_a_writer_without_out_starts_nothing(tmp_path: Path) -> None:
    before = threading.active_count()
    writer = RecordWriter(None)
    writer.add(_record(0))
    assert threading.active_count() == before
    writer.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_run_whose_disk_fills_fails_with_the_records_error(tmp_path: Path) -> None:
    """Through the runner, with a real file: every write to /dev/full fails with ENOSPC (here
    when the file's buffer is flushed, on close at the latest)."""
    (tmp_path / "trajectories.jsonl").symlink_to("/dev/full")
    config = RunConfig(
        scenario="negotiation/simple-trade-v1", episodes=3, out=str(tmp_path), progress=False
    )
    with pytest.raises(RecordsError, match=r"trajectories\.jsonl.*free some space"):
        run(config)
    # What was written before the failure is whole lines (nothing after it is written).
    written = (tmp_path / "transcripts.jsonl").read_bytes()
    assert written.endswith(b"\n")
    assert [json.loads(line)["index"] for line in written.splitlines()] == [0, 1, 2][
        : written.count(b"\n")
    ]
