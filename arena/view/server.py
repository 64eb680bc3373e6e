"""``parley view``: the aiohttp app, the live training feed and the static export.

Routes (ids come from :func:`parley.arena.view.data.discover`; nothing in a URL is a path):

====================================  ===========================================
``/``                                 runs and training runs found
``/run/ID``                           metrics ± CI, pass^k, invalid moves, failures
``/run/ID/episodes?filters``          the episode list (see ``filter_episodes``)
``/run/ID/episode/EP``                one episode's timeline
``/compare?a=ID&b=ID``                two runs side by side, differences with CIs
``/train/ID``                         the training dashboard
``/train/ID/events``                  metrics.jsonl rows as server-sent events
``/static/NAME``                      the package's CSS and scripts (a fixed list)
``/rate``, ``/api/rate[/next]``         rate mode (``--rate``), token-guarded: see ``rate.py``
====================================  ===========================================

Bound to a loopback address, it answers only requests whose ``Host`` is a loopback name
(DNS rebinding cannot turn a web page into a reader of the runs); every response carries a
Content Security Policy that allows no inline script.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from parley.arena.inference.http_guard import ConnectionLimits, guard, serve_guarded
from parley.arena.view.data import (
    EPISODE_ID,
    Source,
    discover,
    filter_episodes,
    finite,
    load_jsonl,
)
from parley.arena.view.episode import episode_page
from parley.arena.view.evals import eval_page
from parley.arena.view.html import CSP, Links
from parley.arena.view.index import episode_rows, iter_episodes, read_episode
from parley.arena.view.league import league_page
from parley.arena.view.pages import (
    compare_page,
    episodes_page,
    index_page,
    run_page,
    train_page,
)
from parley.arena.view.rate import Rating

__all__ = ["export_static", "serve", "start"]

ASSETS = {
    "view.css": "text/css",
    "train.js": "text/javascript",
    "human.js": "text/javascript",
    "rate.js": "text/javascript",
}
"""The only files ``/static/`` serves, from this package's ``static`` folder."""
POLL_S = 0.5
"""How often the training feed looks for new metrics rows."""

log = logging.getLogger("parley.view")


def asset(name: str) -> bytes:
    return resources.files("parley.arena.view").joinpath("static", name).read_bytes()


RESCAN_S = 1.0
"""Least time between two re-scans of the folders for an unknown run id."""


class ViewerState:
    """The folders given to ``parley view`` and the runs found in them (re-scanned when an
    id is not found, so runs started after the server appear)."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [Path(r) for r in roots]
        self.sources: dict[str, Source] = discover(self.roots)
        self._scanned = time.monotonic()

    def rescan(self) -> dict[str, Source]:
        self.sources = discover(self.roots)
        self._scanned = time.monotonic()
        return self.sources

    def get(self, sid: str, kind: str) -> Source:
        src = self.sources.get(sid)
        # An unknown id re-scans the folders at most once a second: a page asking for
        # made-up ids made every request walk every folder, on the event loop.
        if src is None and time.monotonic() - self._scanned >= RESCAN_S:
            src = self.rescan().get(sid)
        if src is None or src.kind != kind:
            raise web.HTTPNotFound(text=f"no {kind} with id {sid!r}")
        return src


def _html(text: str) -> web.Response:
    body = text.encode("utf-8", "replace")  # (a lone surrogate esc() did not see: "?")
    return web.Response(body=body, content_type="text/html", charset="utf-8")


@web.middleware
async def _headers(request: web.Request, handler: Any) -> web.StreamResponse:
    response: web.StreamResponse = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})


def _host_name(host: str) -> str:
    """``Host`` header without its port: ``[::1]:8000`` -> ``[::1]``, ``a:80`` -> ``a``."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _host_check(allowed: frozenset[str]) -> Any:
    """Refuse requests whose Host is not one of ``allowed``: a web page whose domain is
    re-pointed at 127.0.0.1 (DNS rebinding) cannot read the runs through the browser."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        host = _host_name(request.host or "")
        if host.lower() not in allowed:
            raise web.HTTPMisdirectedRequest(text="unexpected Host header")
        response: web.StreamResponse = await handler(request)
        return response

    return check


def make_app(
    roots: Sequence[Path], *, hosts: Sequence[str] = (), rating: Rating | None = None
) -> web.Application:
    """The viewer application over the run folders under ``roots`` (pages that read
    transcripts render in a worker thread: a large run does not stall the live feeds);
    ``hosts`` are the host names it answers to besides the loopback ones (``"*"``: any);
    ``rating``: rate mode's pages and API (its token checked before a body is read)."""
    state = ViewerState(roots)
    links = Links()
    # guard: each request's headers and body timed, idle connections evicted first (it
    # tells serve_guarded's connections when a request starts and ends).
    authorize = rating.rater if rating is not None else None
    middlewares = [guard(loopback_only=False, authorize=authorize), _headers]
    if "*" not in hosts:
        allowed = LOOPBACK_NAMES | {h.lower() for h in hosts}
        middlewares.insert(1, _host_check(frozenset(allowed)))
    app = web.Application(middlewares=middlewares)

    async def index(request: web.Request) -> web.Response:
        return _html(await asyncio.to_thread(lambda: index_page(state.rescan(), links)))

    async def run(request: web.Request) -> web.Response:
        src = state.get(request.match_info["rid"], "run")
        return _html(await asyncio.to_thread(run_page, src, links))

    async def episodes(request: web.Request) -> web.Response:
        src = state.get(request.match_info["rid"], "run")
        query = {k: v for k, v in request.query.items()}

        def render() -> str:
            shown = filter_episodes(episode_rows(src.file("transcripts.jsonl")), query)
            return episodes_page(src, links, query, shown)

        return _html(await asyncio.to_thread(render))

    async def episode(request: web.Request) -> web.Response:
        src = state.get(request.match_info["rid"], "run")
        eid = request.match_info["ep"]
        if EPISODE_ID.match(eid):
            ep = await asyncio.to_thread(read_episode, src.file("transcripts.jsonl"), eid)
            if ep is not None:  # (built off the loop: a 150k-step page takes seconds)
                return _html(await asyncio.to_thread(episode_page, src, ep, links))
        raise web.HTTPNotFound(text=f"no episode {eid!r} in run {src.id!r}")

    async def compare(request: web.Request) -> web.Response:
        a = state.get(request.query.get("a", ""), "run")
        b = state.get(request.query.get("b", ""), "run")
        return _html(await asyncio.to_thread(compare_page, a, b, links))

    async def train(request: web.Request) -> web.Response:
        return _html(train_page(state.get(request.match_info["tid"], "train"), links))

    async def league(request: web.Request) -> web.Response:
        src = state.get(request.match_info["lid"], "league")
        return _html(await asyncio.to_thread(league_page, src, state.sources, links))

    async def evaluation(request: web.Request) -> web.Response:
        src = state.get(request.match_info["eid"], "eval")
        return _html(await asyncio.to_thread(eval_page, src, state.sources, links))

    async def events(request: web.Request) -> web.StreamResponse:
        return await _train_events(request, state.get(request.match_info["tid"], "train"))

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise web.HTTPNotFound(text="no such asset")
        return web.Response(body=asset(name), content_type=ASSETS[name])

    app.router.add_get("/", index)
    app.router.add_get("/run/{rid}", run)
    app.router.add_get("/run/{rid}/episodes", episodes)
    app.router.add_get("/run/{rid}/episode/{ep}", episode)
    app.router.add_get("/compare", compare)
    app.router.add_get("/train/{tid}", train)
    app.router.add_get("/train/{tid}/events", events)
    app.router.add_get("/league/{lid}", league)
    app.router.add_get("/eval/{eid}", evaluation)
    app.router.add_get("/static/{name}", static)
    if rating is not None:
        rating.add_routes(app, lambda: state.sources)
    return app


MAX_LINE_BYTES = 4 << 20
"""Longest metrics.jsonl line the live feed reads; a longer one is skipped (a row is a few
KB: re-splitting a line of 100 MB as it arrived held the server for seconds)."""


async def _train_events(request: web.Request, src: Source) -> web.StreamResponse:
    """Every metrics.jsonl row as an SSE ``message`` (old rows first, then new ones as they
    are written), and ``summary`` once summary.json appears (the run is over)."""
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    response = web.StreamResponse(headers={**headers, "Content-Security-Policy": CSP})
    await response.prepare(request)
    offset, pending, sent_summary, idle, skipping = 0, b"", False, 0.0, False
    while request.transport is not None and not request.transport.is_closing():
        path = src.file("metrics.jsonl")
        chunk = b""
        if path is not None:
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read(1 << 20)
            offset += len(chunk)
        lines: list[bytes] = []
        if b"\n" in chunk:
            *lines, pending = (pending + chunk).split(b"\n")
        else:
            pending += chunk
        if skipping and lines:
            lines, skipping = lines[1:], False  # (the rest of the overlong line)
        if len(pending) > MAX_LINE_BYTES:  # no row is that long: skip to the next newline
            pending, skipping = b"", True
        out = []
        for line in lines:
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(row, dict):
                out.append(f"data: {json.dumps(finite(row))}\n\n")
        summary = src.file("summary.json")
        if summary is not None and not sent_summary and not chunk:
            try:
                data = json.loads(summary.read_text(errors="replace"))
            except (ValueError, RecursionError):  # being written: next poll
                data = None
            if isinstance(data, dict):
                out.append(f"event: summary\ndata: {json.dumps(finite(data))}\n\n")
                sent_summary = True
        idle = 0.0 if out else idle + POLL_S
        if idle >= 15:
            out.append(": keep-alive\n\n")
            idle = 0.0
        if out:
            await response.write("".join(out).encode())
        if len(chunk) == 1 << 20:
            await asyncio.sleep(0)  # (more to read at once; other requests first)
            continue
        await asyncio.sleep(POLL_S)
    return response


def export_static(roots: Sequence[Path], out: Path) -> list[Path]:
    """Write every page as static HTML under ``out`` (open ``out/index.html``); returns the
    files written. Episode filters need the server: the exported list shows every episode."""
    sources = discover(roots)
    links = Links(static=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "static").mkdir(exist_ok=True)
    written: list[Path] = []

    def write(name: str, build: Callable[..., str], *args: Any, **kwargs: Any) -> None:
        """Write one page; a page that cannot be built (a damaged record) is logged and
        skipped, never the end of the export (one bad step had stopped every later page)."""
        try:
            content = build(*args, **kwargs)
        except Exception as exc:  # (whatever a hand-made or foreign file holds)
            log.warning("parley view: page %s skipped: %s: %s", name, type(exc).__name__, exc)
            return
        path = out / name
        path.write_text(content, encoding="utf-8", errors="replace")
        written.append(path)

    for name in ASSETS:
        (out / "static" / name).write_bytes(asset(name))
    write("index.html", index_page, sources, links)
    runs = [s for s in sources.values() if s.kind == "run"]
    for src in runs:
        transcripts = src.file("transcripts.jsonl")
        write(links.run(src.id), run_page, src, links)
        rows = episode_rows(transcripts)
        write(links.episodes(src.id), episodes_page, src, links, {}, rows)
        for ep in iter_episodes(transcripts):
            eid = str(ep.get("episode", ""))
            if EPISODE_ID.match(eid):
                write(links.episode(src.id, eid), episode_page, src, ep, links)
    for a in runs:
        for b in runs:
            if a.id < b.id and len(written) < 100_000:
                write(links.compare(a.id, b.id), compare_page, a, b, links)
    for src in sources.values():
        if src.kind == "train":
            rows = load_jsonl(src.file("metrics.jsonl"))
            write(links.train(src.id), train_page, src, links, rows=rows)
        elif src.kind == "league":
            write(links.league(src.id), league_page, src, sources, links)
        elif src.kind == "eval":
            write(links.eval(src.id), eval_page, src, sources, links)
    return written


async def start(
    roots: Sequence[Path],
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ConnectionLimits | None = None,
    rating: Rating | None = None,
) -> tuple[web.AppRunner, str]:
    """Start the viewer; returns its runner (``await runner.cleanup()`` stops it) and URL.
    ``limits``: see :class:`~parley.arena.inference.http_guard.ConnectionLimits`;
    ``rating``: serve rate mode too."""
    # Bound to a loopback address, answer only to loopback names; on another address the
    # user chose to expose the runs, under whatever name reaches it.
    hosts = () if host in ("127.0.0.1", "localhost", "::1") else ("*",)
    app = make_app(roots, hosts=hosts, rating=rating)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await serve_guarded(runner, host, port, limits)  # (slow and idle connections)
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    return runner, f"http://{shown}:{bound[1]}/"


def serve(
    roots: Sequence[Path], host: str = "127.0.0.1", port: int = 8000, rating: Rating | None = None
) -> None:
    """Serve the viewer until interrupted, printing its URL (and the raters' pages) first."""

    async def main() -> None:
        runner, url = await start(roots, host, port, rating=rating)
        print(f"parley view: {url}  (Ctrl-C to stop)", flush=True)
        if rating is not None:
            rating.announce(url, discover(roots))
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
