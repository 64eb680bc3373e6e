"""``parley view RUN --rate [--seat S]``: a person compares two episodes and says which is better.

The rate page (``/rate?token=...``, one secret token per rater, printed by ``parley view``)
shows two episodes of the same scenario and seed side by side (with ``--seat S``: what that
seat saw and did in each; without: every seat's moves), the part both share once above them,
and takes A, B or tie with an optional reason. Each rating is one line of
``preferences.jsonl`` in the first folder given to ``parley view``:

=====================  ==================================================================
``time``, ``rater``     when (UTC, ISO 8601) and who (the name the token was printed for)
``choice``, ``reason``  ``"A"``, ``"B"`` or ``"tie"``; the reason typed (may be empty)
``scenario``, ``seed``  what both episodes played; ``seat``: the seat compared (or null)
``a``, ``b``            what was shown: ``{run, episode, digest}``, ``digest`` the SHA-256
                        of the text shown (:func:`shown_text`)
``prompt``              the text both sides share (whole lines), then
``chosen``/``rejected`` the rest of the preferred / other side: TRL's preference format
                        (``prompt + chosen`` is the whole text shown); on a tie, A / B
``tie``                 true for a tie (``parley train-rm`` skips those rows)
=====================  ==================================================================

Pairs offered: two ok episodes of one scenario and seed (both with the seat) whose shown
texts differ, in random order and random sides, none a rater already rated or another rater
has open. A post is checked against the transcripts (the episodes exist, make a pair, still
show the digests the page was given) before anything is written; one rater rating one pair
twice is refused. One writer: rows are appended under a lock and an exclusive ``flock``, so
raters of one server or of several servers on the same folder never interleave lines.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import fcntl
import hashlib
import itertools
import json
import os
import random
import secrets
import sys
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from parley.arena.run.model_rewards import shown_items, shown_text
from parley.arena.view.data import EPISODE_ID, Source
from parley.arena.view.html import Links, page
from parley.arena.view.index import episode_rows, read_episode

__all__ = [
    "Rating",
    "token_owner",
]

PREFERENCES = "preferences.jsonl"
"""The file ratings are appended to, in the first folder given to ``parley view``."""
CHOICES = ("A", "B", "tie")
MAX_REASON_CHARS = 2000
"""Longest reason accepted (a longer one is refused whole, never cut)."""
MAX_GROUP = 200
"""Episodes of one scenario and seed paired at most (the first ones in file order)."""
MAX_CACHED = 4096
"""Episodes kept as shown (their text and digest) between requests, least recently used out."""
_FIELDS = frozenset({"a", "b", "choice", "reason", "seat"})
_HEADERS = {"Cache-Control": "no-store"}

Key = tuple[str, str, str | None]
"""A pair as rated: its two digests (sorted) and the seat."""


def _digest(items: Sequence[Mapping[str, str]]) -> str:
    return hashlib.sha256(shown_text(items).encode("utf-8", "replace")).hexdigest()


def _shared(a: Sequence[Mapping[str, str]], b: Sequence[Mapping[str, str]]) -> int:
    """How many leading items ``a`` and ``b`` have in common."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass(frozen=True)
class Side:
    """One episode as the page shows it."""

    run: str
    episode: str
    scenario: str
    seed: Any
    items: list[dict[str, str]]
    digest: str

    def ref(self) -> dict[str, str]:
        return {"run": self.run, "episode": self.episode, "digest": self.digest}


def _group(row: Mapping[str, Any]) -> str:
    """Episodes with the same group may be paired: same scenario and seed."""
    return json.dumps([str(row.get("scenario", "")), row.get("seed")], sort_keys=True)


def trl_fields(a: Side, b: Side, choice: str) -> dict[str, Any]:
    """``prompt``/``chosen``/``rejected`` (TRL's preference format) and ``tie`` for
    ``choice``: on a tie, ``chosen`` is A's and ``rejected`` B's (readers skip ties)."""
    n = _shared(a.items, b.items)
    win, lose = (b, a) if choice == "B" else (a, b)
    return {
        "prompt": shown_text(a.items[:n]),
        "chosen": shown_text(win.items[n:]),
        "rejected": shown_text(lose.items[n:]),
        "tie": choice == "tie",
    }


class Preferences:
    """``preferences.jsonl``, appended to by one writer at a time (a thread lock and an
    exclusive ``flock``), and which rater rated which pair (re-read from where it stopped
    before each check, so rows other servers wrote count too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.raters: dict[Key, set[str]] = defaultdict(set)
        self.rows = 0
        self._offset = 0

    def _read_on(self, f: Any) -> None:
        size = os.fstat(f.fileno()).st_size
        if size < self._offset:  # truncated or replaced: start over
            self.raters.clear()
            self._offset, self.rows = 0, 0
        f.seek(self._offset)
        data = f.read(size - self._offset)
        end = data.rfind(b"\n") + 1  # (a line being written elsewhere: read it next time)
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
                key = _key(row["a"]["digest"], row["b"]["digest"], row.get("seat"))
                self.raters[key].add(str(row["rater"]))
                self.rows += 1
            except (ValueError, KeyError, TypeError, RecursionError):
                continue  # a damaged or foreign line: not a rating
        self._offset += end

    def refresh(self) -> None:
        """Read the rows written since the last look."""
        with self.lock:
            if not self.path.exists():
                return
            with self.path.open("rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH)
                self._read_on(f)

    def append(self, row: Mapping[str, Any], key: Key) -> bool:
        """Append ``row`` unless its rater already rated ``key``; whether it was written."""
        line = json.dumps(row, ensure_ascii=True).encode() + b"\n"
        with self.lock, self.path.open("a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            self._read_on(f)
            if str(row["rater"]) in self.raters[key]:
                return False
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:  # a torn last line (a crash mid-write) is ended, not joined
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = b"\n" + line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
            self._read_on(f)
            return True


def _key(a: str, b: str, seat: str | None) -> Key:
    first, second = sorted((str(a), str(b)))
    return (first, second, seat)


class Rating:
    """Rate mode: the raters' tokens, the pairs and the preferences file."""

    def __init__(
        self,
        out: Path,
        raters: Sequence[str] = ("rater",),
        seat: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.prefs = Preferences(Path(out) / PREFERENCES)
        self.seat = seat
        self.tokens = {secrets.token_urlsafe(18): name for name in dict.fromkeys(raters)}
        self.rng = rng or random.Random(secrets.randbits(64))
        # rater -> the pair their page shows: (key, a's ref, b's ref)
        self.open: dict[str, tuple[Key, dict[str, str], dict[str, str]]] = {}
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()  # (posts check sides in worker threads)
        # (transcripts, episode) -> (the file's stamp, the side): least recently used out
        self._sides: OrderedDict[tuple[Path, str], tuple[tuple[int, int], Side | None]] = (
            OrderedDict()
        )

    def urls(self, base: str) -> dict[str, str]:
        """Each rater's page under the viewer at ``base``."""
        return {name: f"{base.rstrip('/')}/rate?token={t}" for t, name in self.tokens.items()}

    def rater(self, request: web.Request) -> str:
        """The rater whose token the URL presents (``?token=``); 403 without a valid one."""
        found = token_owner(self.tokens, request)
        if found is None:
            raise web.HTTPForbidden(text="rating needs the URL parley view printed (token)")
        return found

    # -- pairs ------------------------------------------------------------------------------

    def _side(self, src: Source, eid: str) -> Side | None:
        """The episode ``eid`` of ``src`` as shown (None: not there, not ok, no such seat)."""
        path = src.file("transcripts.jsonl")
        if path is None or not EPISODE_ID.match(eid):
            return None
        st = path.stat()
        stamp, key = (st.st_mtime_ns, st.st_size), (path, eid)
        with self._cache_lock:
            hit = self._sides.get(key)
            if hit is not None and hit[0] == stamp:
                self._sides.move_to_end(key)
                return hit[1]
        ep = read_episode(path, eid)
        side = None
        agents = ep.get("agents") if ep is not None else None
        seated = isinstance(agents, dict) and (self.seat is None or self.seat in agents)
        if ep is not None and ep.get("status") == "ok" and seated:
            items = shown_items(ep, self.seat)
            scenario, seed = str(ep.get("scenario", "")), ep.get("seed")
            side = Side(src.id, eid, scenario, seed, items, _digest(items))
        with self._cache_lock:
            self._sides[key] = (stamp, side)
            while len(self._sides) > MAX_CACHED:
                self._sides.popitem(last=False)
        return side

    def groups(self, sources: Mapping[str, Source]) -> list[list[tuple[Source, str]]]:
        """Episodes that may be paired (ok, with the seat), grouped by scenario and seed."""
        found: dict[str, list[tuple[Source, str]]] = defaultdict(list)
        for src in sources.values():
            if src.kind != "run":
                continue
            for row in episode_rows(src.file("transcripts.jsonl")):
                eid, agents = str(row.get("episode", "")), row.get("agents") or {}
                if row.get("status") != "ok" or row.get("seed") is None:
                    continue
                if EPISODE_ID.match(eid) and (self.seat is None or self.seat in agents):
                    group = found[_group(row)]
                    if len(group) < MAX_GROUP:
                        group.append((src, eid))
        return [g for g in found.values() if len(g) > 1]

    def candidates(self, sources: Mapping[str, Source]) -> Iterator[tuple[Side, Side]]:
        """Every pair that may be shown (rated or not), in random order and sides."""
        groups = self.groups(sources)
        self.rng.shuffle(groups)
        for group in groups:
            pairs = list(itertools.combinations(group, 2))
            self.rng.shuffle(pairs)
            for (sa, ea), (sb, eb) in pairs:
                a, b = self._side(sa, ea), self._side(sb, eb)
                if a is not None and b is not None and a.digest != b.digest:
                    yield (a, b) if self.rng.random() < 0.5 else (b, a)

    def next_pair(self, rater: str, sources: Mapping[str, Source]) -> dict[str, Any] | None:
        """The pair to show ``rater``: the one their page shows while it is unrated and
        unchanged, else a new one; None when every pair is rated or open on another
        rater's page."""
        self.prefs.refresh()
        with self._lock:  # (pages ask from worker threads)
            return self._next_pair(rater, sources)

    def _next_pair(self, rater: str, sources: Mapping[str, Source]) -> dict[str, Any] | None:
        held = self.open.get(rater)
        if held is not None and not self.prefs.raters.get(held[0]):
            a, b = (self._ref_side(ref, sources) for ref in held[1:])
            if a is not None and b is not None and _key(a.digest, b.digest, self.seat) == held[0]:
                return self._shown(a, b)
        taken = {k for r, (k, _, _) in self.open.items() if r != rater}
        for a, b in self.candidates(sources):
            key = _key(a.digest, b.digest, self.seat)
            if not self.prefs.raters.get(key) and key not in taken:
                self.open[rater] = (key, a.ref(), b.ref())
                return self._shown(a, b)
        return None

    def _ref_side(self, ref: Mapping[str, str], sources: Mapping[str, Source]) -> Side | None:
        src = sources.get(ref["run"])
        return None if src is None or src.kind != "run" else self._side(src, ref["episode"])

    def _shown(self, a: Side, b: Side) -> dict[str, Any]:
        return {
            "seat": self.seat,
            "scenario": a.scenario,
            "seed": a.seed,
            "shared": _shared(a.items, b.items),
            "a": {**a.ref(), "items": a.items},
            "b": {**b.ref(), "items": b.items},
        }

    def rated_by(self, rater: str) -> int:
        """How many pairs ``rater`` has rated (as of the last look at the file)."""
        with self.prefs.lock:
            return sum(rater in names for names in self.prefs.raters.values())

    # -- ratings ----------------------------------------------------------------------------

    def check(self, body: Any, sources: Mapping[str, Source]) -> tuple[Side, Side, str, str]:
        """The two sides, choice and reason of a posted rating; an HTTP error saying what is
        wrong otherwise (400 malformed, 404 unknown run or episode, 409 changed since shown)."""
        if not isinstance(body, dict):
            raise _bad("send a JSON object: {a, b, choice, reason}")
        unknown = sorted(str(k) for k in set(body) - _FIELDS)
        if unknown:
            raise _bad(f"unknown field(s) {unknown}: send only a, b, choice, reason")
        choice, reason = body.get("choice"), body.get("reason", "")
        if choice not in CHOICES:
            raise _bad('choice must be "A", "B" or "tie"')
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise _bad(f"reason must be a string of at most {MAX_REASON_CHARS} characters")
        try:
            reason.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad("reason is not valid Unicode (a lone surrogate)") from None
        if body.get("seat", self.seat) != self.seat:
            raise _bad(f"this server rates seat {self.seat!r}, not {body.get('seat')!r}")
        a, b = (self._posted(body.get(s), s, sources) for s in ("a", "b"))
        if (a.scenario, a.seed) != (b.scenario, b.seed):
            raise _bad("a and b are not a pair: they played other scenarios or seeds")
        if a.digest == b.digest:
            raise _bad("a and b show the same text: there is nothing to prefer")
        return a, b, str(choice), reason

    def _posted(self, ref: Any, name: str, sources: Mapping[str, Source]) -> Side:
        if not isinstance(ref, dict) or not all(
            isinstance(ref.get(f), str) for f in ("run", "episode", "digest")
        ):
            raise _bad(f"{name} must be {{run, episode, digest}}, as the page was given")
        src = sources.get(ref["run"])
        if src is None or src.kind != "run":
            raise web.HTTPNotFound(text=f"{name}: no run with id {ref['run'][:200]!r}")
        side = self._side(src, ref["episode"])
        if side is None:
            raise web.HTTPNotFound(
                text=f"{name}: no ok episode {ref['episode'][:200]!r} with seat {self.seat!r} "
                f"in run {src.id!r}"
            )
        if side.digest != ref["digest"]:
            raise web.HTTPConflict(text=f"{name}: the episode changed since it was shown: reload")
        return side

    async def rate(self, rater: str, body: Any, sources: Mapping[str, Source]) -> dict[str, Any]:
        """Check and append one rating; the row written (409 if ``rater`` rated it before)."""
        a, b, choice, reason = await asyncio.to_thread(self.check, body, sources)
        row = {
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "rater": rater,
            "choice": choice,
            "reason": reason,
            "scenario": a.scenario,
            "seed": a.seed,
            "seat": self.seat,
            "a": a.ref(),
            "b": b.ref(),
            **trl_fields(a, b, choice),
        }
        key = _key(a.digest, b.digest, self.seat)
        if not await asyncio.to_thread(self.prefs.append, row, key):
            raise web.HTTPConflict(text="you rated this pair already")
        return row

    def add_routes(self, app: web.Application, sources: Any) -> None:
        """``/rate`` (the page), ``/api/rate/next`` and ``POST /api/rate``; ``sources()``
        gives the runs by id (re-scanned by the viewer)."""

        async def rate_page(request: web.Request) -> web.Response:
            self.rater(request)
            return web.Response(text=PAGE, content_type="text/html", headers=_HEADERS)

        async def next_pair(request: web.Request) -> web.Response:
            rater = self.rater(request)
            pair = await asyncio.to_thread(self.next_pair, rater, sources())
            rated = self.rated_by(rater)
            return web.json_response({"pair": pair, "rated": rated}, headers=_HEADERS)

        async def post(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                raise _bad("send JSON: {a, b, choice, reason}") from None
            rater = self.rater(request)  # (the guard checked it before reading the body)
            row = await self.rate(rater, body, sources())
            return web.json_response({"ok": True, "time": row["time"]}, headers=_HEADERS)

        app.router.add_get("/rate", rate_page)
        app.router.add_get("/api/rate/next", next_pair)
        app.router.add_post("/api/rate", post)

    def announce(self, base: str, sources: Mapping[str, Source]) -> None:
        """Print each rater's page, where ratings go, and what there is to pair."""
        for name, url in self.urls(base).items():
            print(f"rate as {name}: open {url}", file=sys.stderr, flush=True)
        groups = self.groups(sources)
        episodes = sum(len(g) for g in groups)
        print(
            f"ratings go to {self.prefs.path}; {episodes} episodes in {len(groups)} groups "
            "of one scenario and seed to pair"
            + ("" if self.seat is None else f" (with seat {self.seat})"),
            file=sys.stderr,
            flush=True,
        )
        if not groups:
            print(
                "nothing to rate: rate mode pairs ok episodes of one scenario and seed; play "
                "two or more trials of each task (parley run ... --trials 2)",
                file=sys.stderr,
                flush=True,
            )


def token_owner(tokens: Mapping[str, str], request: web.Request) -> str | None:
    """Whose token (``tokens``: token -> owner) the request's ``?token=`` is, or None. Every
    token is compared, in constant time: how long it takes says nothing of any token."""
    presented = request.query.get("token", "").encode()
    found = None
    for known, owner in tokens.items():
        if secrets.compare_digest(presented, known.encode()):
            found = owner
    return found


def _bad(text: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=text)


PAGE = page(
    "rate",
    "<p id=status>loading…</p><div id=rate></div>",
    Links(),
    scripts=("rate.js",),
)
