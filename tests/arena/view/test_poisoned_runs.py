"""A run folder written by something else: one bad line or field must not take down the
pages of every run (found by review: a move nested 1,200 deep, ``"mean": "x"`` in a
summary, a ``trial`` of 10**9 each made the index or a run page fail, or ran out of
memory)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import pytest

from parley.arena.view.html import Links
from parley.arena.view.server import export_static, start
from tests.arena.view.conftest import episode, write_run

DEEP_MOVE = '{"tool_calls": ' + "[" * 1_200 + "]" * 1_200 + "}"
STEP = {"turn": 0, "observations": {"a": "hi"}, "actions": {"a": DEEP_MOVE}, "infos": {}}
MAPS_ARE_LISTS = {
    "turn": 0,
    "observations": ["x"],
    "actions": {"a": "x"},
    "rewards": [1],
    "terminations": [1],
    "truncations": "no",
    "infos": {"a": {"view": [1]}},
}

POISONS: dict[str, tuple[list[dict], dict | None, str]] = {
    # name: (transcripts, summary.json, a raw line appended to transcripts.jsonl)
    "deep-line": ([episode("t1")], None, "[" * 100_000),
    "mean-is-text": ([episode("t1")], {"scenario": "x", "metrics": {"m": {"mean": "x"}}}, ""),
    "episodes-is-a-list": ([episode("t1")], {"scenario": "x", "episodes": [1]}, ""),
    "metric-is-a-number": ([episode("t1")], {"metrics": {"m": 3}}, ""),
    "trial-is-text": ([episode("t1"), episode("t2", trial="x")], None, ""),
    "steps-of-text": ([episode("t1"), episode("t2", steps=["x"])], None, ""),
    "trial-of-a-billion": ([episode("t1"), episode("t2", trial=10**9)], None, ""),
    "deep-move": ([episode("t1", steps=[STEP])], None, ""),
    # (second review) a lone surrogate, which json.loads reads and UTF-8 cannot encode
    "lone-surrogate": (
        [episode("t1", failed="x\ud800", scenario="y\ud800")],
        {"scenario": "x\ud800"},
        "",
    ),
    # (second review) lists where a step has maps
    "maps-are-lists": ([episode("t1", steps=[MAPS_ARE_LISTS])], None, ""),
}


def _poisoned(root: Path) -> Path:
    write_run(root / "good", [episode("t1"), episode("t2", trial=1)])
    for name, (episodes, summary, raw) in POISONS.items():
        folder = write_run(root / name, episodes, summary)
        if raw:
            with (folder / "transcripts.jsonl").open("a") as f:
                f.write(raw + "\n")
    return root


async def _feed_updates(root: Path, *, last: int) -> list[int]:
    """The ``update`` of each row the live feed of training run ``t`` sends, up to ``last``."""
    runner, url = await start([root])
    got: list[int] = []
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "train/t/events") as r:
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("data: "):
                    got.append(json.loads(line[6:])["update"])
                    if got[-1] == last:
                        r.close()
                        break
    finally:
        await runner.cleanup()
    return got


async def _get(s: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with s.get(url) as r:
        return r.status, await r.text()


@pytest.mark.timeout(120)
async def test_every_page_of_every_run_answers_despite_poisoned_folders(tmp_path: Path) -> None:
    runner, url = await start([_poisoned(tmp_path)])
    try:
        async with aiohttp.ClientSession() as s:
            status, index = await _get(s, url)
            assert status == 200
            assert all(f"/run/{name}" in index for name in [*POISONS, "good"])
            for name in [*POISONS, "good"]:
                started = time.monotonic()
                for page in ("", "/episodes", "/episode/t1"):
                    status, text = await _get(s, f"{url}run/{name}{page}")
                    assert status == 200, (name, page, text[:300])
                assert time.monotonic() - started < 20, name  # (a billion trials: minutes)
            status, text = await _get(s, f"{url}run/deep-move/episode/t1")
            assert "tool_calls" in text  # the move, shown as text
    finally:
        await runner.cleanup()
    export_static([tmp_path], tmp_path / "site")
    site = tmp_path / "site"
    assert (site / "index.html").exists()
    links = Links(static=True)
    for name in [*POISONS, "good"]:  # every run's pages, whatever came before it
        assert (site / links.run(name)).exists(), name
        assert (site / links.episodes(name)).exists(), name
    for name in ("good", "lone-surrogate", "maps-are-lists"):
        assert (site / links.episode(name, "t1")).exists(), name
    assert "x?" in (site / links.episode("lone-surrogate", "t1")).read_text()


@pytest.mark.timeout(60)
async def test_a_metrics_row_nested_too_deep_is_cut_not_the_feed(tmp_path: Path) -> None:
    """600 nested lists in one metrics row raised RecursionError in the live feed, which
    then sent no row at all (and the export stopped)."""
    train = tmp_path / "t"
    train.mkdir()
    deep = "[" * 600 + "]" * 600
    (train / "metrics.jsonl").write_text(
        '{"update": 1, "x": 0.5}\n{"update": 2, "deep": ' + deep + '}\n{"update": 3}\n'
    )
    got = await _feed_updates(tmp_path, last=3)
    assert got == [1, 2, 3]
    export_static([tmp_path], tmp_path / "site")
    assert (tmp_path / "site" / Links(static=True).train("t")).exists()


def test_exported_page_names_never_collide_nor_grow_too_long(tmp_path: Path) -> None:
    """A run called ``victim-t00000`` with an episode ``r00`` had overwritten run
    ``victim``'s episode ``t00000-r00``; two 120-character run names made a compare page
    name of 257 characters and stopped the export."""
    write_run(tmp_path / "victim", [episode("t00000-r00", status="ok")])
    write_run(tmp_path / "victim-t00000", [episode("r00", failed="FORGED RESULT")])
    write_run(tmp_path / ("a" * 120), [episode("t1")])
    write_run(tmp_path / ("b" * 120), [episode("t1")])
    written = export_static([tmp_path], tmp_path / "site")
    links = Links(static=True)
    real = (tmp_path / "site" / links.episode("victim", "t00000-r00")).read_text()
    assert "FORGED RESULT" not in real
    assert (
        "FORGED RESULT" in (tmp_path / "site" / links.episode("victim-t00000", "r00")).read_text()
    )
    assert len({p.name for p in written}) == len(written)
    assert max(len(p.name) for p in written) <= 200
    assert (tmp_path / "site" / links.compare("a" * 120, "b" * 120)).exists()


@pytest.mark.timeout(60)
async def test_the_live_training_feed_skips_an_overlong_line(tmp_path: Path) -> None:
    """A metrics.jsonl line of 6 MB is skipped whole; the rows after it still arrive."""
    train = tmp_path / "t"
    train.mkdir()
    rows = [{"update": 1, "x": 0.5}, {"update": 2, "big": "y" * (6 << 20)}, {"update": 3}]
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = await _feed_updates(tmp_path, last=3)
    assert got == [1, 3]


def test_unknown_ids_rescan_the_folders_at_most_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiohttp import web

    from parley.arena.view import server

    write_run(tmp_path / "good", [episode("t1")])
    state = server.ViewerState([tmp_path])
    scans = 0
    real = server.discover

    def counting(roots: list[Path]) -> dict:
        nonlocal scans
        scans += 1
        return real(roots)

    monkeypatch.setattr(server, "discover", counting)
    state._scanned -= server.RESCAN_S  # (as if the start were a second ago)
    for i in range(200):
        with pytest.raises(web.HTTPNotFound):
            state.get(f"made-up-{i}", "run")
    assert scans == 1
    assert state.get("good", "run").id == "good"  # known ids need no scan
