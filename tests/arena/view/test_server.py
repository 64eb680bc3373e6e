"""The viewer over HTTP (a real server on port 0): escaping, paths, filters, compare, export."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from parley.arena.cli import main as cli_main
from parley.arena.view.data import compare_metrics, discover, filter_episodes, t975
from parley.arena.view.index import episode_row
from parley.arena.view.server import start
from tests.arena.view.conftest import episode, write_run
from tests.arena.view.hostile import PAYLOAD

EVIL = '<script>alert("x")</script>'


async def _get(url: str) -> tuple[int, str, dict[str, str]]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text(), dict(r.headers)


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} is not JSON: browsers reject it")


async def _raw_get(url: str, path: str, host_header: str = "127.0.0.1") -> tuple[int, str]:
    """GET ``path`` byte for byte (an HTTP client would normalise the dots away)."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n"
    writer.write(head.encode())
    await writer.drain()
    response = (await reader.read()).decode(errors="replace")
    writer.close()
    return int(response.split(" ", 2)[1]), response


@pytest.fixture
async def viewer(runs_dir: Path) -> AsyncIterator[str]:
    runner, url = await start([runs_dir])
    yield url
    await runner.cleanup()


def _no_live_markup(text: str) -> None:
    """No tag from run data survives: only the page's own script tags, with src."""
    assert "<script>" not in text
    assert "<img" not in text
    assert not re.search(r"<script(?![^>]*\bsrc=\"/static/)(?![^>]*type=application/json)", text)


async def test_every_page_escapes_the_agents_markup(viewer: str) -> None:
    pages = ["", "run/hostile", "run/hostile/episodes", "compare?a=hostile&b=scripted"]
    pages += [f"run/hostile/episode/t0000{i}-r00" for i in range(3)]
    seen_payload = 0
    for path in pages:
        status, text, headers = await _get(viewer + path)
        assert status == 200, path
        _no_live_markup(text)
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        seen_payload += "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in text
    assert seen_payload == 3  # the payload is shown, as text, in each episode
    assert PAYLOAD not in text


async def test_hostile_run_fields_stay_text(tmp_path: Path) -> None:
    hostile = episode(
        "t2",
        "failed",
        scenario=EVIL,
        agents={EVIL: EVIL, "b": "scripted"},
        failed=f"{EVIL}: agent_error: {EVIL}",
        steps=[
            {
                "turn": 0,
                "observations": {EVIL: EVIL},
                "actions": {EVIL: json.dumps({"tool_calls": [{"name": EVIL}], "message": EVIL})},
                "rewards": {EVIL: 1.0},
                "infos": {
                    EVIL: {
                        "invalid": EVIL,
                        "components": {EVIL: 1.0},
                        "view": {EVIL: 1, "tool_results": [{"name": EVIL, "content": EVIL}]},
                    }
                },
            }
        ],
    )
    ok = episode("t1", metrics={EVIL: 1.0}, returns={EVIL: 2.0})
    bad_id = episode(EVIL, "failed", failed=EVIL)
    write_run(tmp_path / "r", [hostile, ok, bad_id], {"scenario": EVIL, "agents": {EVIL: EVIL}})
    runner, url = await start([tmp_path])
    try:
        for path in ["", "run/r", "run/r/episodes", "run/r/episode/t1", "run/r/episode/t2"]:
            status, text, _ = await _get(url + path)
            assert status == 200, path
            _no_live_markup(text)
        _, text, _ = await _get(url + "run/r/episode/t2")
        assert text.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 5
        assert "tool call" in text
        assert "tool result" in text
        status, text, _ = await _get(url + "run/r/episodes?reason=" + EVIL)
        _no_live_markup(text)
        # The hostile episode id is not a valid id: it gets no page (and no file on export).
        status, _, _ = await _get(url + "run/r/episode/" + "%3Cscript%3E")
        assert status == 404
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "path",
    [
        "run/..",
        "run/../../etc/passwd",
        "run/%2e%2e",
        "run/%2e%2e%2f%2e%2e%2fetc",
        "run/..%2fscripted",
        "run/%2Fetc%2Fpasswd",
        "run//etc/passwd",
        "run/scripted/episode/..%2f..%2fsummary.json",
        "run/scripted/episode/%2e%2e",
        "static/..%2fdata.py",
        "static/%2e%2e/server.py",
        "static/../../../etc/passwd",
        "train/..%2f..%2fscripted",
        "compare?a=../scripted&b=/etc",
    ],
)
async def test_urls_cannot_leave_the_run_folders(viewer: str, path: str) -> None:
    status, text = await _raw_get(viewer, "/" + path)
    assert status in (400, 404), (path, status)
    assert "root:" not in text
    assert "import" not in text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example"])
async def test_a_rebound_domain_cannot_read_the_runs(viewer: str, host: str) -> None:
    status, text = await _raw_get(viewer, "/run/hostile", host_header=host)
    assert status == 421
    assert "hostile" not in text.partition("\r\n\r\n")[2]
    for ok in ("127.0.0.1", "localhost:8000", "[::1]:8000"):
        assert (await _raw_get(viewer, "/run/hostile", host_header=ok))[0] == 200


async def test_symlinks_out_of_the_folders_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "outside"
    write_run(secret / "private-run", [episode("t-secret")])
    (secret / "notes.txt").write_text("SECRET " * 10)
    root = tmp_path / "runs"
    write_run(root / "real", [episode("t0")])
    os.symlink(secret / "private-run", root / "linked-run")  # a whole run folder
    bad = root / "sneaky"
    bad.mkdir()
    os.symlink(secret / "private-run" / "transcripts.jsonl", bad / "transcripts.jsonl")
    os.symlink(secret / "notes.txt", root / "real" / "summary.json")
    sources = discover([root])
    assert "linked-run" not in sources
    runner, url = await start([root])
    try:
        for path in ["", "run/sneaky", "run/sneaky/episodes", "run/real", "run/linked-run"]:
            _, text, _ = await _get(url + path)
            assert "t-secret" not in text, path
            assert "SECRET" not in text, path
        assert (await _get(url + "run/sneaky/episode/t-secret"))[0] == 404
    finally:
        await runner.cleanup()


def test_filters_select_what_they_say() -> None:
    steps = [{"actions": {"a": "x"}, "infos": {"a": {"invalid": "bad"}}}]
    eps = [
        episode("t0", metrics={"score": 2.0}, returns={"a": 5.0, "b": 0.0}),
        episode("t1", metrics={"score": 8.0}, returns={"a": -1.0, "b": 3.0}, steps=steps),
        episode("t2", "failed", failed="b: timeout: no action within 60 s"),
        episode("t3", "failed", failed="scenario_error: boom"),
    ]
    rows = [episode_row(ep) for ep in eps]
    ids = lambda q: [e["episode"] for e in filter_episodes(rows, q)]  # noqa: E731
    assert ids({"status": "failed"}) == ["t2", "t3"]
    assert ids({"reason": "timeout"}) == ["t2"]
    assert ids({"reason": "boom"}) == ["t3"]
    assert ids({"metric": "score", "min": "5"}) == ["t1"]
    assert ids({"metric": "score", "max": "5"}) == ["t0"]
    assert ids({"return_seat": "a", "return_max": "0"}) == ["t1"]
    assert ids({"seat": "a", "invalid": "1"}) == ["t1"]
    assert ids({"seat": "b", "invalid": "1"}) == []
    # Malformed values filter nothing rather than fail.
    assert ids({"metric": "score", "min": "nan"}) == ids({}) == ["t0", "t1", "t2", "t3"]
    assert ids({"status": "<x>", "min": "abc"}) == ["t0", "t1", "t2", "t3"]


async def test_filters_over_http(viewer: str) -> None:
    _, text, _ = await _get(viewer + "run/scripted/episodes?metric=score&min=9.5")
    rows = re.findall(r"class=episode-link href=\"[^\"]+\">([^<]+)<", text)
    assert rows
    assert "0 of" not in text
    _, full, _ = await _get(viewer + "run/scripted/episodes")
    assert len(re.findall("class=episode-link", full)) == 6 > len(rows)


def test_compare_gives_the_difference_and_its_welch_interval() -> None:
    a = [episode(f"a{i}", metrics={"m": v}) for i, v in enumerate([1.0, 2.0, 3.0, 4.0])]
    b = [episode(f"b{i}", metrics={"m": v}) for i, v in enumerate([2.0, 4.0, 6.0, 8.0, 10.0])]
    row = next(r for r in compare_metrics(a, b) if r.name == "m")
    assert row.diff == pytest.approx(6.0 - 2.5)
    va, vb = 5 / 3 / 4, 10.0 / 5  # variance / n of each sample
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 4)
    assert row.ci95 == pytest.approx(t975(df) * math.sqrt(va + vb))
    # t quantiles against published tables (table to 30, Cornish-Fisher above).
    table = [(1, 12.706), (5, 2.571), (10, 2.228), (30, 2.042), (40, 2.021), (60, 2.000)]
    for df_, t in [*table, (120, 1.980), (1e9, 1.960)]:
        assert t975(df_) == pytest.approx(t, abs=1e-3)
    assert t975(30) > t975(30.5) > t975(31) > t975(1e3)


async def test_compare_page_shows_both_runs_and_the_difference(viewer: str) -> None:
    status, text, _ = await _get(viewer + "compare?a=hostile&b=scripted")
    assert status == 200
    # scripted agrees every time (success 1), the markup agent never does (success 0).
    row = re.search(r"<td>success</td>(.*?)</tr>", text)
    assert row is not None
    cells = re.findall(r"<td class=num>([^<]*)</td>", row.group(1))
    assert cells == ["0.000 ± 0.000", "1.000 ± 0.000", "1.000 ± 0.000"]
    assert (await _get(viewer + "compare?a=hostile&b=nope"))[0] == 404


def test_export_writes_static_pages_that_link_to_each_other(runs_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "site"
    assert cli_main(["view", str(runs_dir), "--export", str(out)]) == 0
    pages = {p.name for p in out.glob("*.html")}
    assert {"index.html", "run-hostile.html", "episodes-scripted.html"} <= pages
    assert "episode-hostile=t00000-r00.html" in pages
    assert "compare-hostile=scripted.html" in pages
    assert (out / "static" / "view.css").is_file()
    for page in out.glob("*.html"):
        text = page.read_text()
        _no_live_markup(text)
        for href in re.findall(r'href="([^"]+)"', text):
            assert (out / href).is_file(), f"{page.name} links to missing {href}"
    text = (out / "episode-hostile=t00000-r00.html").read_text()
    assert "&lt;script&gt;window.__xss" in text


def test_export_embeds_training_rows_as_data(tmp_path: Path) -> None:
    train = tmp_path / "runs" / "train"
    train.mkdir(parents=True)
    rows = [{"update": 1, "stage": "s", "success": 0.5, "note": "</script><script>x()"}]
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "site"
    assert cli_main(["view", str(tmp_path / "runs"), "--export", str(out)]) == 0
    text = (out / "train-train.html").read_text()
    assert "</script><script>x()" not in text
    data = re.search(r"<script type=application/json id=train-data>(.*?)</script>", text)
    assert data is not None
    assert json.loads(data.group(1))["rows"] == rows


async def test_training_events_stream_rows_as_they_are_written(tmp_path: Path) -> None:
    train = tmp_path / "t"
    train.mkdir()
    metrics = train / "metrics.jsonl"
    # What the trainer writes: Python's json, NaN included (not JSON to a browser).
    metrics.write_text(json.dumps({"update": 1, "stage": "a", "success": 0.1, "x": math.nan}))
    metrics.write_text(metrics.read_text() + "\n")
    runner, url = await start([tmp_path])
    got: list[dict] = []
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "train/t/events") as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            event = ""
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:], parse_constant=_no_constants)
                    if event == "summary":
                        assert data["stages"][0]["stage"] == "a"
                        r.close()  # an endless stream: hang up rather than read to its end
                        break
                    got.append(data)
                    if len(got) == 1:  # the run goes on: a half-written line, then the rest
                        with metrics.open("a") as f:
                            f.write('{"update": 2, "stage": "a", "succ')
                            f.flush()
                            f.write('ess": 0.2}\n')
                    if len(got) == 2:
                        summary = {"stages": [{"stage": "a", "curve": [0.1, 0.2]}]}
                        (train / "summary.json").write_text(json.dumps(summary))
                elif not line:  # the end of an event
                    event = ""
        assert [g["update"] for g in got] == [1, 2]
        status, text, _ = await _get(url + "train/t")
        assert status == 200
        assert 'src="/static/train.js"' in text
    finally:
        await runner.cleanup()


def test_parley_view_serves_on_loopback_and_prints_its_url(runs_dir: Path) -> None:
    cmd = [sys.executable, "-m", "parley.arena.cli", "view", str(runs_dir), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        with urllib.request.urlopen(match.group(0), timeout=10) as r:
            assert r.status == 200
            assert "hostile" in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)
    assert cli_main(["view", str(runs_dir / "nope")]) == 2


def test_the_parsed_file_cache_is_bounded(tmp_path: Path) -> None:
    from parley.arena.view import data

    for i in range(3 * data._CACHE_FILES):
        path = tmp_path / f"t{i}.jsonl"
        path.write_text(json.dumps({"episode": i}) + "\n")
        assert data.load_jsonl(path) == [{"episode": i}]
    assert len(data._cache) <= data._CACHE_FILES
