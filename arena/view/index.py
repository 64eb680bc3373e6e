"""A run's transcripts as the viewer reads them: an index, not the whole file in memory.

A run of 20,000 deal-or-no-deal episodes writes ~210 MB of ``transcripts.jsonl``; parsed
whole into Python objects it took ~8 s and ~900 MB of memory (measured), and a live run
made every page parse it again after each episode it appended. :func:`episode_rows` keeps,
per episode, what the list pages read (a *row*: the transcript without its ``steps``, plus
``_steps``, ``_acted`` and ``_invalid``, see :func:`episode_row`) and where its line lies
in the file; :func:`read_episode` reads and parses that one line for the episode's page. A
file that grew is read on from where the index stopped; one replaced or truncated is read
again from the start. Lines are decoded by msgspec into the fields the rows keep (the rest
of a step is skipped without being built); a line that is not a transcript, damaged or
half written, is left out, as before.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec

__all__ = ["episode_row", "episode_rows", "iter_episodes", "read_episode"]

_Count = Annotated[int, msgspec.Meta(ge=0, le=10**9)]


class _Info(msgspec.Struct):
    invalid: Any = None


class _Step(msgspec.Struct):
    actions: dict[str, Any] = msgspec.field(default_factory=dict)
    infos: dict[str, _Info | None] = msgspec.field(default_factory=dict)


class _Transcript(msgspec.Struct):
    """The fields of a transcript line the pages read, with the types they expect (a line
    that does not fit is skipped, so that one bad line cannot break every page)."""

    episode: Any = ""
    index: _Count = 0
    task: _Count = 0
    trial: _Count = 0
    seed: Any = None
    scenario: Any = ""
    agents: dict[str, Any] = msgspec.field(default_factory=dict)
    metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    returns: dict[str, Any] = msgspec.field(default_factory=dict)
    status: Any = ""
    failed: Any = ""
    steps: list[_Step] = msgspec.field(default_factory=list)


_KEPT = tuple(name for name in _Transcript.__struct_fields__ if name != "steps")
_decode = msgspec.json.Decoder(_Transcript).decode
_DECODE_ERRORS = (msgspec.DecodeError, ValueError, TypeError, RecursionError)
_CHUNK = 8 << 20
MAX_LINE_BYTES = 128 << 20
"""Longest transcript line indexed (an episode of 128 MB); a longer one is skipped."""


def _row(t: _Transcript) -> dict[str, Any]:
    row = {name: getattr(t, name) for name in _KEPT}
    acted: dict[str, int] = {}
    invalid: dict[str, int] = {}
    for step in t.steps:
        for seat in step.actions:
            acted[seat] = acted.get(seat, 0) + 1
        for seat, info in step.infos.items():
            if info is not None and info.invalid:
                invalid[seat] = invalid.get(seat, 0) + 1
    row["_steps"] = len(t.steps)
    row["_acted"] = acted  # seat -> steps it acted in
    row["_invalid"] = invalid  # seat -> steps whose info says its move was invalid
    return row


def episode_row(transcript: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row of one parsed transcript (``None`` when it is not one): what
    :func:`episode_rows` keeps of each line."""
    try:
        return _row(msgspec.convert(transcript, _Transcript))
    except _DECODE_ERRORS:
        return None


def _parse(line: bytes) -> _Transcript | None:
    try:
        return _decode(line)
    except _DECODE_ERRORS:
        pass
    # Not msgspec's JSON: Python's json writes NaN and Infinity, which msgspec refuses.
    try:
        value = json.loads(line)
        return msgspec.convert(value, _Transcript) if isinstance(value, dict) else None
    except _DECODE_ERRORS:
        return None


@dataclass
class _Index:
    """What one transcripts file held when last read, and where each row's line is."""

    ident: tuple[int, int]  # (device, inode): another file at the same path reads again
    head: bytes = b""  # its first bytes: a file rewritten in place reads again
    end: int = 0  # bytes read: the end of the last whole line
    tail: bytes = b""  # the bytes just before ``end``: so does one whose start is the same
    last: tuple[dict[str, Any], tuple[int, int]] | None = None
    """A whole transcript after the last newline (a file another tool wrote without a final
    newline): listed, and read again next time (a run may still be writing it)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) per row
    by_id: dict[str, int] = field(default_factory=dict)  # episode id -> its first row
    skipping: int = 0
    """Bytes after ``end`` of an unended line already over MAX_LINE_BYTES: not read again
    (a 16 GB file without a newline had been read whole on every request)."""

    def read_on(self, path: Path) -> None:
        with path.open("rb") as f:
            if not self.head:
                self.head = f.read(4096)
            f.seek(self.end + self.skipping)
            parts: list[bytes] = []  # the line not yet ended (a run may be writing it)
            held = self.skipping  # its length: over MAX_LINE_BYTES, it is not kept but skipped
            while chunk := f.read(_CHUNK):
                cut = chunk.rfind(b"\n") + 1
                if not cut:
                    held += len(chunk)
                    if held > MAX_LINE_BYTES:
                        parts = []
                    else:
                        parts.append(chunk)
                    continue
                start = chunk.index(b"\n") + 1  # the held line ends here
                if held + start > MAX_LINE_BYTES:
                    self.end += held + start
                else:
                    self._add(b"".join([*parts, chunk[:start]]) if parts else chunk[:start])
                while start < cut:  # (whole lines, each shorter than a chunk)
                    stop = chunk.index(b"\n", start) + 1
                    self._add(chunk[start:stop])
                    start = stop
                parts, held = [chunk[cut:]], len(chunk) - cut
            self.skipping = held if held > MAX_LINE_BYTES else 0
            self.tail = _tail(f, self.end)
            self.last = None
            if parts and 0 < held <= MAX_LINE_BYTES:
                transcript = _parse(b"".join(parts))
                if transcript is not None:
                    self.last = (_row(transcript), (self.end, held))

    @property
    def all_rows(self) -> list[dict[str, Any]]:
        return self.rows if self.last is None else [*self.rows, self.last[0]]

    def span_of(self, episode: str) -> tuple[int, int] | None:
        at = self.by_id.get(episode)
        if at is not None:
            return self.spans[at]
        if self.last is not None and str(self.last[0]["episode"]) == episode:
            return self.last[1]
        return None

    def _add(self, line: bytes) -> None:
        """Index ``line``, which starts at ``self.end``, and move past it."""
        transcript = _parse(line)
        if transcript is not None:
            row = _row(transcript)
            self.by_id.setdefault(str(row["episode"]), len(self.rows))
            self.rows.append(row)
            self.spans.append((self.end, len(line)))
        self.end += len(line)


_CACHE_FILES = 8
"""Indexes kept (least recently used out)."""
_indexes: OrderedDict[Path, _Index] = OrderedDict()
_lock = threading.Lock()  # pages are built in worker threads: guards the two dicts
_file_locks: dict[Path, threading.Lock] = {}


def _index(path: Path) -> _Index:
    with _lock:
        file_lock = _file_locks.setdefault(path, threading.Lock())
    # One reader per file; the pages of other runs go on meanwhile (a 16 GB file being
    # indexed had held every other run's page for 42 s under one global lock).
    with file_lock:
        st = path.stat()
        ident = (st.st_dev, st.st_ino)
        with _lock:
            index = _indexes.get(path)
        if index is not None and (index.ident != ident or st.st_size < index.end + index.skipping):
            index = None  # replaced or truncated
        if index is not None and not _starts_with(path, index.head, index.tail, index.end):
            index = None  # rewritten in place
        if index is None:
            index = _Index(ident)
        if index.end + index.skipping < st.st_size or not index.head:
            index.read_on(path)
        with _lock:
            _indexes[path] = index
            _indexes.move_to_end(path)
            while len(_indexes) > _CACHE_FILES:
                _indexes.popitem(last=False)
        return index


def _starts_with(path: Path, head: bytes, tail: bytes, end: int) -> bool:
    """Whether ``path`` still holds ``head`` at its start and ``tail`` just before ``end``."""
    with path.open("rb") as f:
        return f.read(len(head)) == head and _tail(f, end) == tail


def _tail(f: Any, end: int) -> bytes:
    start = max(0, end - 256)
    f.seek(start)
    return bytes(f.read(end - start))


def episode_rows(path: Path | None) -> list[dict[str, Any]]:
    """One row per transcript line of ``path`` (see the module docstring), in file order.

    Callers only read the rows (they are shared between calls)."""
    if path is None:
        return []
    try:
        return _index(path).all_rows
    except OSError:
        return []


def read_episode(path: Path | None, episode: str) -> dict[str, Any] | None:
    """The whole transcript of ``episode`` (its first line in ``path``), or ``None``."""
    if path is None:
        return None
    for _ in range(2):  # a file replaced since it was indexed: index it again, once
        try:
            index = _index(path)
        except OSError:
            return None
        span = index.span_of(episode)
        if span is None:
            return None
        value = _read(path, span)
        if value is not None and str(value.get("episode", "")) == episode:
            return value
        with _lock:
            _indexes.pop(path, None)
    return None


def iter_episodes(path: Path | None) -> Iterator[dict[str, Any]]:
    """Every whole transcript of ``path``, in file order, one at a time."""
    if path is None:
        return
    try:
        index = _index(path)
    except OSError:
        return
    spans = [*index.spans, *([index.last[1]] if index.last is not None else [])]
    for span in spans:
        value = _read(path, span)
        if value is not None:
            yield value


def _read(path: Path, span: tuple[int, int]) -> dict[str, Any] | None:
    """The transcript whose line is at ``span``, or ``None`` if it is no longer one."""
    offset, length = span
    try:
        with path.open("rb") as f:
            f.seek(offset)
            line = f.read(length)
    except OSError:
        return None
    if _parse(line) is None:
        return None
    try:
        value = json.loads(line)
    except _DECODE_ERRORS:
        return None
    return value if isinstance(value, dict) else None
