"""The viewer's transcript index: rows in memory, whole transcripts read one line at a time,
a growing file read on from where it stopped, a replaced one read again."""

from __future__ import annotations

import gc
import json
import os
import random
import tracemalloc
from pathlib import Path

import pytest

from parley.arena.view import index
from parley.arena.view.data import filter_episodes, invalid_rates
from parley.arena.view.index import episode_row, episode_rows, iter_episodes, read_episode
from tests.arena.view.conftest import episode


def _steps(n: int, size: int = 0, invalid: str = "") -> list[dict]:
    steps = []
    for turn in range(n):
        seat = "ab"[turn % 2]
        infos = {s: {"to_act": s != seat, "view": {"x": [1, 2, 3]}} for s in "ab"}
        if invalid and turn == 1:
            infos[seat]["invalid"] = invalid
        steps.append(
            {
                "turn": turn,
                "actions": {seat: f"move {turn}"},
                "observations": {seat: "o" * size},
                "infos": infos,
            }
        )
    return steps


def _write(path: Path, episodes: list[dict], mode: str = "w") -> None:
    with path.open(mode) as f:
        f.writelines(json.dumps(ep) + "\n" for ep in episodes)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The whole lines (newline-ended) the index parses, in order."""
    seen: list[bytes] = []
    real = index._parse

    def counting(line: bytes) -> object:
        if line.endswith(b"\n"):  # (an unended last line is tried again each read)
            seen.append(line)
        return real(line)

    monkeypatch.setattr(index, "_parse", counting)
    return seen


def test_rows_hold_what_the_pages_read_and_the_page_reads_the_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "transcripts.jsonl"
    eps = [episode(f"t{i}", steps=_steps(4, invalid="bad" if i == 1 else "")) for i in range(3)]
    _write(path, eps)
    rows = episode_rows(path)
    assert [r["episode"] for r in rows] == ["t0", "t1", "t2"]
    assert all("steps" not in r for r in rows)
    assert rows[1]["_steps"] == 4
    assert rows[1]["_acted"] == {"a": 2, "b": 2}
    assert rows[1]["_invalid"] == {"b": 1}
    assert rows[0]["_invalid"] == {}
    assert rows[1]["metrics"] == eps[1]["metrics"]
    assert rows[1]["returns"] == eps[1]["returns"]
    assert invalid_rates(rows) == {"a": (6, 0), "b": (6, 1)}
    assert [r["episode"] for r in filter_episodes(rows, {"invalid": "1"})] == ["t1"]
    assert read_episode(path, "t2") == eps[2]
    assert read_episode(path, "t9") is None
    assert list(iter_episodes(path)) == eps
    assert episode_row(eps[1]) == rows[1]  # (one derivation for parsed and read lines)


def test_a_growing_file_is_read_on_from_where_the_index_stopped(
    tmp_path: Path, parses: list[bytes]
) -> None:
    path = tmp_path / "transcripts.jsonl"
    _write(path, [episode(f"t{i}", steps=_steps(3)) for i in range(50)])
    assert len(episode_rows(path)) == 50
    assert len(parses) == 50
    assert len(episode_rows(path)) == 50
    assert len(parses) == 50  # unchanged: nothing read
    # A run appends an episode and is half-way through writing the next one.
    line = json.dumps(episode("t51", steps=_steps(3)))
    with path.open("a") as f:
        f.write(json.dumps(episode("t50")) + "\n" + line[:40])
    assert [r["episode"] for r in episode_rows(path)[-1:]] == ["t50"]
    assert len(parses) == 51  # only the new whole line
    with path.open("a") as f:
        f.write(line[40:] + "\n")
    assert [r["episode"] for r in episode_rows(path)[-2:]] == ["t50", "t51"]
    assert len(parses) == 52
    assert read_episode(path, "t51") == json.loads(line)


def test_a_replaced_truncated_or_rewritten_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "transcripts.jsonl"
    _write(path, [episode(f"old{i}") for i in range(5)])
    assert len(episode_rows(path)) == 5
    # Replaced (a new run written to a temporary file and moved over the old one).
    other = tmp_path / "new.jsonl"
    _write(other, [episode(f"new{i}") for i in range(7)])
    os.replace(other, path)
    assert [r["episode"] for r in episode_rows(path)][:1] == ["new0"]
    assert len(episode_rows(path)) == 7
    # Truncated and rewritten shorter, in place.
    _write(path, [episode("short")])
    assert [r["episode"] for r in episode_rows(path)] == ["short"]
    # Rewritten in place, same inode, at least as long: the first bytes differ.
    _write(path, [episode("again"), episode("more")])
    assert [r["episode"] for r in episode_rows(path)] == ["again", "more"]
    assert read_episode(path, "short") is None
    assert read_episode(path, "more") == episode("more")


def test_an_episode_read_after_its_file_changed_under_the_index(tmp_path: Path) -> None:
    """The index says where t1 was; the file now holds something else there."""
    path = tmp_path / "transcripts.jsonl"
    _write(path, [episode("t0"), episode("t1")])
    assert len(episode_rows(path)) == 2
    with path.open("r+b") as f:  # same inode, same size, first bytes kept
        first = f.readline()
        f.seek(len(first))
        f.write(b"x" * (len(json.dumps(episode("t1"))) - 1) + b"\n")
    # The head still matches and the size did not change: the index still names t1, but
    # its line is no longer a transcript. The read says so and the index is rebuilt.
    assert read_episode(path, "t1") is None
    assert [r["episode"] for r in episode_rows(path)] == ["t0"]


def test_lines_across_chunks_are_read_whole_and_overlong_ones_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 64 bytes, lines of 100 bytes to 2 KB, at most 1 KB kept: every line that
    fits is indexed at its place, every longer one skipped, in one read or appended."""
    monkeypatch.setattr(index, "_CHUNK", 64)
    monkeypatch.setattr(index, "MAX_LINE_BYTES", 1024)
    rng = random.Random(7)
    path = tmp_path / "transcripts.jsonl"
    path.write_bytes(b"")
    kept = []
    for i in range(120):
        line = json.dumps(episode(f"t{i}", failed="x" * rng.randrange(0, 1800))) + "\n"
        if len(line) <= 1024:
            kept.append(f"t{i}")
        with path.open("a") as f:
            f.write(line)
        if i % 7 == 0:
            episode_rows(path)  # read on as the file grows
    assert [r["episode"] for r in episode_rows(path)] == kept
    assert 30 < len(kept) < 110
    for eid in kept[::9]:
        assert read_episode(path, eid)["episode"] == eid
    index._indexes.clear()  # and read at once from the start
    assert [r["episode"] for r in episode_rows(path)] == kept


def test_lines_that_are_not_transcripts_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "transcripts.jsonl"
    lines = [
        json.dumps(episode("ok0")),
        "[" * 100_000,  # nesting deeper than any parser's stack
        json.dumps(episode("bad-trial", trial=-1)),
        json.dumps(episode("bad-steps", steps=["x"])),
        json.dumps(episode("bad-info", steps=[{"actions": {}, "infos": {"a": "text"}}])),
        json.dumps(episode("nan", metrics={"score": float("nan")})),  # Python's json: NaN
        "not json",
        json.dumps(episode("ok1")),
    ]
    path.write_text("\n".join(lines) + "\n")
    assert [r["episode"] for r in episode_rows(path)] == ["ok0", "nan", "ok1"]
    assert read_episode(path, "nan")["metrics"]["score"] != 0  # (NaN: never equal)


def _traced(fn: object) -> tuple[object, int, int]:
    gc.collect()
    tracemalloc.start()
    try:
        value = fn()  # type: ignore[operator]
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return value, kept, peak


def test_the_index_holds_a_small_part_of_what_the_transcripts_hold(tmp_path: Path) -> None:
    """2,000 episodes of 20 steps with 1 KB observations (~48 MB). Parsed whole, a tenth of
    them holds more memory than the whole file's size; the index of all of them holds under
    a tenth of that, and never more than a few chunks of the file while reading."""
    path = tmp_path / "transcripts.jsonl"
    with path.open("w") as f:
        for i in range(2000):
            f.write(json.dumps(episode(f"t{i:05d}", steps=_steps(20, size=1024))) + "\n")
    size = path.stat().st_size
    lines = path.read_bytes().splitlines()[:200]
    whole, whole_kept, _ = _traced(lambda: [json.loads(line) for line in lines])
    rows, kept, peak = _traced(lambda: episode_rows(path))
    assert len(rows) == 2000  # type: ignore[arg-type]
    assert 10 * whole_kept > size  # (the old way: every transcript parsed and kept)
    assert kept < whole_kept, (kept, whole_kept)  # all 2,000 rows < 200 parsed transcripts
    assert peak < 3 * index._CHUNK + kept, (peak, kept)
    assert read_episode(path, "t00199") == whole[199]  # type: ignore[index]


def test_the_indexes_kept_are_bounded(tmp_path: Path) -> None:
    for i in range(3 * index._CACHE_FILES):
        path = tmp_path / f"t{i}.jsonl"
        _write(path, [episode(f"t{i}")])
        assert [r["episode"] for r in episode_rows(path)] == [f"t{i}"]
    assert len(index._indexes) <= index._CACHE_FILES


def test_a_rerun_into_the_same_file_with_the_same_start_is_read_again(tmp_path: Path) -> None:
    """Found by review: a rerun into the same --out rewrites transcripts.jsonl in place (same
    inode); when its first 4 KB matched and the viewer missed the short moment, the old rows
    stayed and reading went on from the middle of a line."""
    path = tmp_path / "transcripts.jsonl"
    same = [episode(f"t{i}", failed="x" * 1000) for i in range(5)]  # > 4 KB in common
    _write(path, [*same, episode("old-5"), episode("old-6")])
    assert [r["episode"] for r in episode_rows(path)][-2:] == ["old-5", "old-6"]
    with path.open("r+") as f:  # same inode, longer, the same first 5 lines
        f.writelines(json.dumps(ep) + "\n" for ep in [*same, episode("new-5", failed="y" * 300)])
        f.writelines(json.dumps(episode(f"new-{i}")) + "\n" for i in range(6, 9))
    assert [r["episode"] for r in episode_rows(path)][5:] == ["new-5", "new-6", "new-7", "new-8"]


def test_a_last_line_without_its_newline_is_listed_when_whole(tmp_path: Path) -> None:
    """A file written by another tool may lack the final newline (the old reader listed such
    a line); a half-written line is still left out, and nothing is listed twice."""
    path = tmp_path / "transcripts.jsonl"
    path.write_text(json.dumps(episode("t0")) + "\n" + json.dumps(episode("t1")))
    assert [r["episode"] for r in episode_rows(path)] == ["t0", "t1"]
    assert read_episode(path, "t1") == episode("t1")
    assert [e["episode"] for e in iter_episodes(path)] == ["t0", "t1"]
    with path.open("a") as f:
        f.write("\n" + json.dumps(episode("t2"))[:30])  # t1 ended; t2 half written
    assert [r["episode"] for r in episode_rows(path)] == ["t0", "t1"]


def test_an_overlong_unended_line_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Second review: a file ending in a line over MAX_LINE_BYTES with no newline was read
    from that line's start on every request (a 16 GB one: 42 s a page)."""
    monkeypatch.setattr(index, "MAX_LINE_BYTES", 1 << 16)
    monkeypatch.setattr(index, "_CHUNK", 1 << 12)
    path = tmp_path / "transcripts.jsonl"
    path.write_text(json.dumps(episode("t1")) + "\n" + "x" * (1 << 17))
    assert [r["episode"] for r in episode_rows(path)] == ["t1"]
    skipped = index._indexes[path].skipping
    assert skipped > 1 << 16
    read: list[int] = []
    real_read_on = index._Index.read_on

    def counting(self: index._Index, p: Path) -> None:
        read.append(self.end + self.skipping)  # where this read starts
        real_read_on(self, p)

    monkeypatch.setattr(index._Index, "read_on", counting)
    with path.open("a") as f:
        f.write("y" * 1000 + "\n" + json.dumps(episode("t2")) + "\n")
    assert [r["episode"] for r in episode_rows(path)] == ["t1", "t2"]
    assert read == [len(json.dumps(episode("t1"))) + 1 + skipped]  # on from where it stopped
    assert read_episode(path, "t2") is not None


def test_indexing_one_file_does_not_hold_the_pages_of_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Second review: one global lock was held while a large file was indexed, and every
    other run's page waited for it (42 s)."""
    import threading

    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    big.write_text(json.dumps(episode("b1")) + "\n")
    small.write_text(json.dumps(episode("s1")) + "\n")
    entered, release = threading.Event(), threading.Event()
    real_read_on = index._Index.read_on

    def slow(self: index._Index, p: Path) -> None:
        if p == big:
            entered.set()
            release.wait(30)
        real_read_on(self, p)

    monkeypatch.setattr(index._Index, "read_on", slow)
    reader = threading.Thread(target=episode_rows, args=(big,))
    reader.start()
    try:
        assert entered.wait(10)
        done = threading.Event()
        rows: list = []
        other = threading.Thread(target=lambda: (rows.extend(episode_rows(small)), done.set()))
        other.start()
        assert done.wait(10), "the small run's page waited for the big file"
        assert [r["episode"] for r in rows] == ["s1"]
    finally:
        release.set()
        reader.join(10)
