"""Rate mode of ``parley view`` over HTTP (real servers on port 0): the rate API attacked, the
exact row a rating appends, one writer under concurrent raters and servers, pair sampling.
(The page itself is driven in a browser in test_rate_browser.py.)"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from parley.arena.view.data import discover
from parley.arena.view.rate import MAX_REASON_CHARS, PREFERENCES, Rating
from parley.arena.view.server import start
from tests.arena.view.conftest import episode, write_run

pytestmark = pytest.mark.timeout(60)


def played(eid: str, seed: int, offer: str, reply: str = "ok", **fields: Any) -> dict:
    """An episode of seat ``a`` (sees a fixed opening, offers ``offer``) and ``b`` (replies)."""
    steps = [
        {"observations": {"a": "you hold 3 books"}, "actions": {"a": offer}},
        {"observations": {"b": f"a says {offer}"}, "actions": {"b": reply}},
    ]
    return episode(eid, seed=seed, steps=steps, **fields)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Seed 1: three episodes (two offers, one repeated: same text as e1); seed 2: one."""
    eps = [
        played("e1", 1, "2 books for me"),
        played("e2", 1, "all books for me, please"),
        played("e3", 1, "2 books for me"),
        played("e4", 2, "1 book for me"),
        played("e5", 1, "3 books", status="failed"),
    ]
    return write_run(tmp_path / "run", eps)


@pytest.fixture
async def served(run_dir: Path) -> AsyncIterator[tuple[str, Rating]]:
    rating = Rating(run_dir, raters=["ann"], seat="a", rng=random.Random(0))
    runner, url = await start([run_dir], rating=rating)
    yield url, rating
    await runner.cleanup()


def _token(rating: Rating, name: str = "ann") -> str:
    return next(t for t, n in rating.tokens.items() if n == name)


async def _post(url: str, body: bytes, token: str | None, ctype: str = "application/json") -> int:
    query = "" if token is None else f"?token={token}"
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}api/rate{query}", data=body, headers={"Content-Type": ctype}) as r,
    ):
        await r.read()
        return r.status


async def _next(url: str, token: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}api/rate/next?token={token}") as r:
        assert r.status == 200
        body: dict[str, Any] = await r.json()
        return body


def _rows(folder: Path) -> list[dict[str, Any]]:
    path = folder / PREFERENCES
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_rating_appends_one_exact_row(served: tuple[str, Rating], run_dir: Path) -> None:
    url, rating = served
    pair = (await _next(url, _token(rating)))["pair"]
    # The only pair: e1 and e2 (e3 shows e1's text, e4 has another seed, e5 failed).
    assert {pair["a"]["episode"], pair["b"]["episode"]} == {"e1", "e2"}
    assert pair["shared"] == 1
    assert pair["a"]["items"][0] == {"who": "scenario", "text": "you hold 3 books"}
    polite = "a" if pair["a"]["episode"] == "e2" else "b"
    choice = polite.upper()
    refs = {s: {k: pair[s][k] for k in ("run", "episode", "digest")} for s in ("a", "b")}
    body = {**refs, "choice": choice, "reason": "asks nicely"}
    assert await _post(url, json.dumps(body).encode(), _token(rating)) == 200
    (row,) = _rows(run_dir)
    assert row.pop("time").endswith("+00:00")
    assert row == {
        "rater": "ann",
        "choice": choice,
        "reason": "asks nicely",
        "scenario": "demo/x-v0",
        "seed": 1,
        "seat": "a",
        "a": refs["a"],
        "b": refs["b"],
        "prompt": "scenario: you hold 3 books\n",
        "chosen": "a: all books for me, please\n",
        "rejected": "a: 2 books for me\n",
        "tie": False,
    }
    # Rated: nothing left to offer; the same rating again is refused, and not written.
    assert (await _next(url, _token(rating))) == {"pair": None, "rated": 1}
    assert await _post(url, json.dumps(body).encode(), _token(rating)) == 409
    assert len(_rows(run_dir)) == 1


async def test_bad_posts_get_a_4xx_and_write_nothing(
    served: tuple[str, Rating], run_dir: Path
) -> None:
    url, rating = served
    token = _token(rating)
    pair = (await _next(url, token))["pair"]
    a, b = ({k: pair[s][k] for k in ("run", "episode", "digest")} for s in ("a", "b"))
    good = {"a": a, "b": b, "choice": "A", "reason": ""}
    other_seed = {"run": "run", "episode": "e4", "digest": "0" * 64}
    cases: dict[str, tuple[bytes, str | None, int]] = {
        "no token": (json.dumps(good).encode(), None, 403),
        "wrong token": (json.dumps(good).encode(), token[:-1] + "x", 403),
        "no token, huge body": (b"x" * (4 << 20), None, 403),  # refused before it is read
        "malformed JSON": (b'{"a": ', token, 400),
        "not an object": (b"[1, 2]", token, 400),
        "unknown field": (json.dumps({**good, "rater": "bob"}).encode(), token, 400),
        "no choice": (json.dumps({**good, "choice": "C"}).encode(), token, 400),
        "huge reason": (
            json.dumps({**good, "reason": "x" * (MAX_REASON_CHARS + 1)}).encode(),
            token,
            400,
        ),
        "huge body": (json.dumps({**good, "reason": "x" * (4 << 20)}).encode(), token, 413),
        "lone surrogate": (json.dumps({**good, "reason": "\ud800"}).encode(), token, 400),
        "other seat": (json.dumps({**good, "seat": "b"}).encode(), token, 400),
        "a not a ref": (json.dumps({**good, "a": "e1"}).encode(), token, 400),
        "unknown episode": (json.dumps({**good, "a": {**a, "episode": "e9"}}).encode(), token, 404),
        "failed episode": (json.dumps({**good, "a": {**a, "episode": "e5"}}).encode(), token, 404),
        "bad episode id": (
            json.dumps({**good, "a": {**a, "episode": "../x"}}).encode(),
            token,
            404,
        ),
        "unknown run": (json.dumps({**good, "a": {**a, "run": "elsewhere"}}).encode(), token, 404),
        "stale digest": (json.dumps({**good, "a": {**a, "digest": "0" * 64}}).encode(), token, 409),
        "other seed": (json.dumps({**good, "b": other_seed}).encode(), token, 409),
        "same episode": (json.dumps({**good, "b": a}).encode(), token, 400),
        "not JSON typed": (json.dumps(good).encode(), token, 415),
    }
    got = {}
    for name, (body, tok, _) in cases.items():
        ctype = "text/plain" if name == "not JSON typed" else "application/json"
        got[name] = await _post(url, body, tok, ctype)
    assert got == {name: status for name, (_, _, status) in cases.items()}
    assert not (run_dir / PREFERENCES).exists()
    # Same text on both sides (e1, e3), and two seeds once the digest is right: 400 each.
    e3 = {
        "run": "run",
        "episode": "e3",
        "digest": a["digest"] if a["episode"] == "e1" else b["digest"],
    }
    e1 = a if a["episode"] == "e1" else b
    assert await _post(url, json.dumps({**good, "a": e1, "b": e3}).encode(), token) == 400
    seed2 = (await asyncio.to_thread(rating._side, discover([run_dir])["run"], "e4")).ref()
    assert await _post(url, json.dumps({**good, "b": seed2}).encode(), token) == 400
    assert not (run_dir / PREFERENCES).exists()
    assert await _post(url, json.dumps(good).encode(), token) == 200  # still serving
    assert len(_rows(run_dir)) == 1


async def test_concurrent_raters_on_two_servers_write_whole_unique_rows(tmp_path: Path) -> None:
    # One scenario and seed, 8 different offers: 28 pairs. Two servers on the same folder
    # (their own locks: only the file lock is shared), ann on both, bob on one.
    folder = write_run(tmp_path / "run", [played(f"e{i}", 1, "x" * i) for i in range(8)])
    one = Rating(folder, raters=["ann", "bob"], seat="a")
    two = Rating(folder, raters=["ann"], seat="a")
    (r1, u1), (r2, u2) = await start([folder], rating=one), await start([folder], rating=two)
    try:
        sides = [one._side(discover([folder])["run"], f"e{i}") for i in range(8)]
        pairs = [(a, b) for i, a in enumerate(sides) for b in sides[i + 1 :]]
        posts = []
        for a, b in pairs:
            body = json.dumps({"a": a.ref(), "b": b.ref(), "choice": "A", "reason": "é" * 500})
            for url, rating, name in [(u1, one, "ann"), (u2, two, "ann"), (u1, one, "bob")]:
                posts.append(_post(url, body.encode(), _token(rating, name)))
        statuses = await asyncio.gather(*posts)
    finally:
        await r1.cleanup()
        await r2.cleanup()
    # ann posted each pair twice at once (on both servers): one 200, one 409.
    assert sorted(statuses).count(200) == 2 * len(pairs)
    assert sorted(statuses).count(409) == len(pairs)
    rows = _rows(folder)  # (every line parses: none interleaved)
    keys = [(r["rater"], frozenset((r["a"]["episode"], r["b"]["episode"]))) for r in rows]
    assert len(rows) == len(set(keys)) == 2 * len(pairs)


def test_pairs_skip_same_text_rated_and_open_ones(run_dir: Path) -> None:
    # seed 1: e1, e2, e3 (e3 shows e1's text) and e6 (another offer): three pairs of texts
    # (e1|e3 vs e2, e1|e3 vs e6, e2 vs e6); e1-e3 is none (nothing to prefer).
    with (run_dir / "transcripts.jsonl").open("a") as f:
        f.write(json.dumps(played("e6", 1, "half each")) + "\n")
    sources = discover([run_dir])
    rating = Rating(run_dir, raters=["ann", "bob"], seat="a", rng=random.Random(1))

    def episodes(pair: dict[str, Any]) -> frozenset[str]:
        return frozenset((pair["a"]["episode"], pair["b"]["episode"]))

    first = rating.next_pair("ann", sources)
    assert first is not None
    assert rating.next_pair("ann", sources) == first  # a reload shows the same pair
    bob = rating.next_pair("bob", sources)
    assert bob is not None
    assert episodes(bob) != episodes(first)  # open on ann's page: not offered to bob
    seen = []
    for _ in range(10):
        pair = rating.next_pair("ann", sources)
        if pair is None:
            break
        seen.append(episodes(pair))
        refs = {s: {k: pair[s][k] for k in ("run", "episode", "digest")} for s in "ab"}
        a, b, _, _ = rating.check({**refs, "choice": "tie"}, sources)
        row = {"rater": "ann", "a": a.ref(), "b": b.ref(), "seat": "a"}
        assert rating.prefs.append(row, (*sorted((a.digest, b.digest)), "a"))  # type: ignore[arg-type]
    # Each pair of texts once (e2-e3 is e1-e2 again), e1-e3 never, bob's open one left to him.
    texts = {"e1": 1, "e3": 1, "e2": 2, "e6": 6}
    shown = [frozenset(texts[e] for e in pair) for pair in [*seen, episodes(bob)]]
    assert len(shown) == len(set(shown)) == 3
    assert rating.rated_by("ann") == 2


def test_a_torn_last_line_is_ended_not_joined(run_dir: Path) -> None:
    (run_dir / PREFERENCES).write_text('{"rater": "x", "a": {"dig')  # a crash mid-write
    sources = discover([run_dir])
    rating = Rating(run_dir, raters=["ann"], seat="a")
    pair = rating.next_pair("ann", sources)
    assert pair is not None
    refs = {s: {k: pair[s][k] for k in ("run", "episode", "digest")} for s in "ab"}
    a, b, _, _ = rating.check({**refs, "choice": "B"}, sources)
    assert rating.prefs.append({"rater": "ann", "a": a.ref(), "b": b.ref()}, ("1", "2", "a"))
    lines = (run_dir / PREFERENCES).read_text().splitlines()
    assert lines[0] == '{"rater": "x", "a": {"dig'
    assert json.loads(lines[1])["rater"] == "ann"


@pytest.mark.parametrize(
    "argv", [["--seat", "a"], ["--rater", "ann"], ["--rate", "--export", "site"]]
)
def test_rate_flags_without_rate_mode_are_usage_errors(run_dir: Path, argv: list[str]) -> None:
    from parley.arena.cli import main

    assert main(["view", str(run_dir), *argv]) == 2


async def test_rate_pages_need_the_token(served: tuple[str, Rating]) -> None:
    url, rating = served
    async with aiohttp.ClientSession() as s:
        for path in ["rate", "api/rate/next", "rate?token=x", "api/rate/next?token="]:
            async with s.get(url + path) as r:
                assert r.status == 403, path
        async with s.get(f"{url}rate?token={_token(rating)}") as r:
            assert r.status == 200
            assert '<script src="/static/rate.js" defer>' in await r.text()


def test_announce_prints_each_raters_page_and_what_there_is_to_pair(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rating = Rating(run_dir, raters=["ann", "bob", "ann"], seat="a")
    rating.announce("http://127.0.0.1:1/", discover([run_dir]))
    err = capsys.readouterr().err
    for token, name in rating.tokens.items():
        assert f"rate as {name}: open http://127.0.0.1:1/rate?token={token}" in err
    assert len(rating.tokens) == 2
    assert "3 episodes in 1 groups" in err  # (seed 1's ok ones; e4 alone, e5 failed)
    Rating(run_dir, seat="nobody").announce("http://127.0.0.1:1/", discover([run_dir]))
    assert "nothing to rate" in capsys.readouterr().err
