"""What a run writes: one record per episode, encoded as deterministic JSON lines.

Files (in ``RunConfig.out``; the schema is documented in ``arena/run/SCHEMA.md``):

- ``transcripts.jsonl`` — one line per episode, in plan order (task, then trial), whatever
  order the concurrent episodes finished in; keys sorted; no wall-clock values, so the same
  run seed and agents give byte-identical files.
- ``trajectories.jsonl`` — one :class:`~parley.protocols.messages.Trajectory` per seat per
  episode, same order.
- ``timings.jsonl`` — wall-clock durations per episode (kept apart because they vary).
- ``summary.json`` — aggregate metrics (see :mod:`parley.arena.run.summary`).

:class:`RunResult` is what a run returns: the summary and, when asked for, the records.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import msgspec
import numpy as np

from parley.protocols.errors import ConfigError, ParleyError
from parley.protocols.messages import Trajectory

__all__ = ["EpisodeRecord", "RecordWriter", "RecordsError", "RunResult", "encode_json"]


def _enc_hook(obj: Any) -> Any:
    # Scenarios may put numpy scalars or arrays in infos; JSON gets the Python values.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    # A transcript is a log: a value it cannot hold is named, not allowed to end the run
    # (no repr: it may carry a memory address and break byte-identical transcripts).
    return f"<unserializable {type(obj).__name__}>"


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook, order="sorted")


def encode_json(value: Any) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace, NaN/inf written as ``null`` (msgspec's
    JSON encoder writes non-finite floats so, numpy's included: no pass over the value in
    Python, which had cost more than the encoding itself)."""
    return _encoder.encode(value)


# The event loop's own (the writer thread encodes with _encoder): one encoder per thread.
_loop_encoder = msgspec.json.Encoder(enc_hook=_enc_hook, order="sorted")


def frozen_json(values: Sequence[Any]) -> list[msgspec.Raw | None]:
    """Each of ``values`` as :func:`encode_json` writes it, encoded now: a
    :class:`msgspec.Raw`, which msgspec encodes as those very bytes wherever it sits in a
    record (and which holds one buffer where a value may hold many objects); ``None`` for
    a value JSON cannot hold (a dict key that is no string): the caller keeps that value,
    for its write to fail naming it."""
    encode = _loop_encoder.encode
    try:
        return [msgspec.Raw(encode(value)) for value in values]
    except _ENCODE_ERRORS:
        pass  # which ones: one at a time
    frozen: list[msgspec.Raw | None] = []
    for value in values:
        try:
            frozen.append(msgspec.Raw(encode(value)))
        except _ENCODE_ERRORS:
            frozen.append(None)
    return frozen


_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)  # what msgspec raises


@dataclass
class EpisodeRecord:
    """The outcome of one episode, as the runner hands it to writers and the summary."""

    index: int
    """Position in the run's plan (task-major, then trial)."""
    episode: str
    """Episode id (also the bus ``Envelope.episode``)."""
    task: int
    """Task number: episodes of one task share the scenario seed."""
    trial: int
    """Trial number within the task (0..trials-1)."""
    seed: int
    """Seed the scenario was reset with."""
    transcript: dict[str, Any]
    """The ``transcripts.jsonl`` line of this episode."""
    trajectories: list[Trajectory] = field(default_factory=list)
    """One per seat."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``env.episode_metrics()``; empty for failed episodes."""
    failed: str = ""
    """Why the episode failed ("" if it finished)."""
    agent_steps: int = 0
    """Actions requested from agents."""
    invalid_moves: int = 0
    """Actions the scenario marked invalid (``infos[agent]["invalid"]``)."""
    wall_s: float = 0.0
    """Wall-clock seconds the episode took (written only to ``timings.jsonl``)."""
    agents_s: float = 0.0
    """Wall-clock seconds spent waiting for agents' actions (the rest is the scenario and
    the runner's own bookkeeping); ``timings.jsonl`` only."""

    def returns(self) -> list[tuple[str, float]]:
        """``(seat, reward)`` of each trajectory, in order: what a summary reads of them
        (a record whose turns are yet to build is not built for it)."""
        return [(t.agent, t.reward) for t in self.trajectories]

    def credit(self, component: str, values: Mapping[str, float]) -> None:
        """Add ``values[seat]`` as reward ``component`` at the episode's last step, as a
        scenario's final reward is: the step's ``rewards`` and ``infos[seat]["components"]``,
        the seat's trajectory reward, components and last turn, and the ``returns``. For
        rewards computed after play (a judge, a reward model); seats not in ``values`` get
        nothing. Needs the transcript's steps (a run that keeps them)."""
        transcript = self.transcript
        last = transcript["steps"][-1]
        rewards = dict(last.get("rewards") or {})
        infos = dict(last.get("infos") or {})
        for trajectory in self.trajectories:
            seat = trajectory.agent
            if seat not in values:
                continue
            value = float(values[seat])
            rewards[seat] = float(rewards.get(seat, 0.0)) + value
            info = dict(infos.get(seat) or {})
            components = dict(info.get("components") or {})
            components[component] = components.get(component, 0.0) + value
            infos[seat] = {**info, "components": components}
            trajectory.components[component] = trajectory.components.get(component, 0.0) + value
            trajectory.reward += value
            if trajectory.turns:
                trajectory.turns[-1].reward += value
        last["rewards"], last["infos"] = rewards, infos
        transcript["returns"] = {t.agent: t.reward for t in self.trajectories}


@dataclass
class RunResult:
    """What :meth:`Runner.run` returns: the summary mapping and, when kept, the records."""

    summary: dict[str, Any]
    endpoint: str
    wall_s: float
    out: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    kept_records: list[EpisodeRecord] | None = field(default=None, repr=False)
    """Every episode record in plan order, with ``Runner(..., keep_records=True)``."""

    @property
    def records(self) -> list[EpisodeRecord]:
        """Every episode record in plan order; only when the runner was asked to keep them
        (they grow with the run: read ``transcripts.jsonl`` or use the summary instead)."""
        if self.kept_records is None:
            raise ConfigError(
                "this run kept no records (memory stays flat without them): pass "
                "keep_records=True to Runner or run(), or read the summary or --out files"
            )
        return self.kept_records

    @property
    def failed_fraction(self) -> float:
        """Failed episodes over all episodes (0.0 for an empty run)."""
        episodes = self.summary["episodes"]
        return episodes["failed"] / episodes["total"] if episodes["total"] else 0.0


def _lines(record: EpisodeRecord) -> tuple[bytes, bytes, bytes]:
    """The transcript line, trajectory lines and timing line of ``record``."""
    timing = {
        "episode": record.episode,
        "wall_s": round(record.wall_s, 6),
        "agents_s": round(record.agents_s, 6),
    }
    return (
        encode_json(record.transcript) + b"\n",
        b"".join(encode_json(trajectory) + b"\n" for trajectory in record.trajectories),
        encode_json(timing) + b"\n",
    )


class RecordsError(ParleyError):
    """The run's records could not be written (a failing disk, a value JSON cannot hold);
    the message names the file and what to do."""


DEFAULT_QUEUE_RECORDS = 64
"""Records a :class:`RecordWriter` holds for its thread before :meth:`~RecordWriter.add`
waits: back-pressure from a slow disk, with memory bounded by this many records."""

_FILES = ("transcripts", "trajectories", "timings")
_POLL_S, _POLL_MAX_S = 0.001, 0.05
"""How often :meth:`RecordWriter.put` looks for room in a full queue (first, at most)."""
_CLOSE = object()
"""Queue sentinel: the writer thread ends once everything before it is written."""


def _open_file(path: Path) -> IO[bytes]:
    return path.open("wb")


class RecordWriter:
    """Appends episode records to the JSONL files in plan order, off the caller's thread.

    :meth:`add` (from a coroutine, :meth:`put`) hands a record to a writer thread through
    a queue of at most ``queue_records``; the thread encodes and writes it (building the
    steps of a record played by :class:`~parley.arena.run.episode.EpisodeLog`, which are
    built when first read), so the event loop playing the episodes spends no time on the
    transcript, JSON or the disk. A full queue makes
    :meth:`add` block and :meth:`put` wait (the event loop goes on) until the thread has
    caught up: memory stays bounded however slow the disk (the queue, plus the encoded
    lines of records waiting for an earlier episode still in play). Concurrent episodes
    finish out of order; a record's encoded lines (not the record) wait in the thread until
    every earlier index has been written, so the files do not depend on scheduling.

    The first failure (a write the OS refused, a record JSON cannot hold) is raised as
    :class:`RecordsError`, naming the file, by the next :meth:`add`, :meth:`put` or by
    :meth:`close`; nothing after it is written (records are still taken off the queue: no
    caller waits for ever). :meth:`close` writes everything handed over before it, then
    closes the files. A record handed over is read later by the thread: the caller no longer
    changes it. Without ``out`` nothing is encoded, kept or started. ``opener`` opens each
    file (tests hand in slow or failing ones).
    """

    def __init__(
        self,
        out: str | Path | None,
        *,
        queue_records: int = DEFAULT_QUEUE_RECORDS,
        opener: Callable[[Path], IO[bytes]] = _open_file,
    ) -> None:
        if queue_records < 1:
            raise ConfigError(f"queue_records must be at least 1, got {queue_records}")
        self._next = 0
        self._waiting: dict[int, tuple[bytes, bytes, bytes]] = {}
        self._files: dict[str, IO[bytes]] = {}
        self._paths: dict[str, Path] = {}
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_records)
        self._thread: threading.Thread | None = None
        self._error: RecordsError | None = None
        self._reported = False
        self.out = Path(out) if out is not None else None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            for name in _FILES:
                self._paths[name] = self.out / f"{name}.jsonl"
                self._files[name] = opener(self._paths[name])
            # A daemon: a process that dies without close() is not kept alive by it.
            self._thread = threading.Thread(target=self._drain, name="parley-records", daemon=True)
            self._thread.start()

    def add(self, record: EpisodeRecord) -> None:
        """Hand ``record`` to the writer thread (blocks while its queue is full)."""
        if self._thread is not None:
            self._raise_failure()
            self._queue.put(record)

    async def put(self, record: EpisodeRecord) -> None:
        """:meth:`add` for a coroutine: while the queue is full the event loop goes on
        (polled, from 1 ms to 50 ms apart). Cancelled while waiting (SIGINT), it still hands
        ``record`` over before the cancellation goes on: a finished episode is never lost."""
        if self._thread is None:
            return
        self._raise_failure()
        wait = _POLL_S
        while True:
            try:
                self._queue.put_nowait(record)
                return
            except queue.Full:
                pass
            try:
                await asyncio.sleep(wait)
            except asyncio.CancelledError:
                self._queue.put(record)  # (returns: the thread takes every record off)
                raise
            wait = min(2 * wait, _POLL_MAX_S)

    async def drain(self) -> None:
        """Wait until every record handed over so far is written (or the writer failed:
        then raise its failure); the event loop goes on meanwhile."""
        if self._thread is not None:
            await asyncio.to_thread(self._queue.join)
            self._raise_failure()

    def _raise_failure(self) -> None:
        """Raise the writer's first failure, once."""
        if self._error is not None and not self._reported:
            self._reported = True
            raise self._error

    def _drain(self) -> None:
        """The writer thread: encode and write each record until the close sentinel."""
        while (record := self._queue.get()) is not _CLOSE:
            if self._error is None:
                self._error = self._take(record)
            self._queue.task_done()

    def _take(self, record: EpisodeRecord) -> RecordsError | None:
        """Encode ``record`` and write every record its arrival puts in turn."""
        try:
            self._waiting[record.index] = _lines(record)
        except Exception as exc:  # (msgspec: TypeError, e.g. a dict key that is no string)
            return RecordsError(
                f"episode {record.episode} (index {record.index}) cannot be written to "
                f"{self._paths['transcripts']}: {exc}; its scenario or agents put a value "
                f"JSON cannot hold in the episode (arena/run/SCHEMA.md says what a record holds)"
            )
        while self._next in self._waiting:
            failure = self._write(self._waiting.pop(self._next))
            if failure is not None:
                return failure
            self._next += 1
        return None

    def _write(self, encoded: tuple[bytes, bytes, bytes]) -> RecordsError | None:
        for name, data in zip(_FILES, encoded, strict=True):
            try:
                self._files[name].write(data)
            except (OSError, ValueError) as exc:  # (ValueError: the file was closed)
                return self._failed(name, exc)
        return None

    def _closed(self, name: str, f: IO[bytes]) -> RecordsError | None:
        """Close ``f``; a buffered write the OS refuses surfaces here at the latest."""
        try:
            f.close()
        except OSError as exc:
            return self._failed(name, exc)
        return None

    def _failed(self, name: str, exc: Exception) -> RecordsError:
        return RecordsError(
            f"writing {self._paths[name]} failed: {exc}; it holds whole records up to episode "
            f"index {self._next - 1} at most: free some space (or pick another --out) and "
            f"run again"
        )

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` (indented for people; keys sorted)."""
        if self.out is not None:
            data = msgspec.json.format(encode_json(summary), indent=2)
            (self.out / "summary.json").write_bytes(data + b"\n")

    def close(self) -> None:
        """Write everything handed over (records still waiting for a gap as they are), close
        the files, and raise the writer's failure if no call has raised it yet."""
        if self._thread is None:
            return
        thread, self._thread = self._thread, None
        try:
            self._queue.put(_CLOSE)  # (the thread takes every record off: this cannot hang)
            thread.join()
            for index in sorted(self._waiting):
                encoded = self._waiting.pop(index)
                if self._error is None:
                    self._error = self._write(encoded)
        finally:
            for name, f in self._files.items():
                failure = self._closed(name, f)
                self._error = self._error or failure
            self._files.clear()
        self._raise_failure()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
