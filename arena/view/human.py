"""A person plays a seat in the browser (``--agents human``), or at the terminal
(``--agents human:tty``).

``human`` starts one small web server per process, bound to 127.0.0.1 (options ``-o
human_host=...``, ``-o human_port=8765``; default: a free port), and prints one URL per
human seat, each with its own secret token: every request must present it, and a token
shows and plays only its own seat, so another local user, a web page in the same browser,
or the person in another human seat cannot read a seat's private observation or play its
move. Each episode a human seat is in shows up on that seat's page as a game: the
scenario's rules and action syntax (the system prompt an LLM in the seat would get), every
observation the seat got, the action constraint when the scenario gives one (choices become
buttons), and the scenario's reason when the previous move was invalid. The episode is run
and recorded like any other. A person is slower than an agent: ``parley run`` gives a run
with a human seat 30 minutes a move unless ``--act-timeout`` says otherwise; play with
``--concurrency 1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from parley.agents.base import Agent
from parley.agents.human import TerminalHuman, describe_constraint
from parley.arena.inference.http_guard import (
    ConnectionLimits,
    GuardedSite,
    bind_tcp,
    guard,
    http_is_loopback,
)
from parley.arena.run.agent_specs import AgentSource, SeatContext
from parley.arena.view.html import CSP, esc
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Action, Observation

__all__ = ["resolve_human"]

MAX_ACTION_CHARS = 20_000
"""Longest move the page accepts (the scenario applies its own, usually smaller, limit)."""
POLL_S = 20.0
"""How long ``/api/state`` waits for something new before answering anyway."""


@dataclass
class Game:
    """One seat of one episode played by a person."""

    id: str
    seat: str
    scenario: str
    rules: str
    history: list[dict[str, Any]] = field(default_factory=list)
    waiting: asyncio.Future[str] | None = None
    constraint: dict[str, Any] | None = None
    invalid: str = ""
    done: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "seat": self.seat,
            "scenario": self.scenario,
            "rules": self.rules,
            "history": self.history,
            "waiting": self.waiting is not None and not self.waiting.done(),
            "constraint": self.constraint,
            "hint": describe_constraint(self.constraint),
            "invalid": self.invalid,
            "done": self.done,
        }


class HumanHub:
    """The page and its API; one per process (see :func:`hub`). The listening socket is
    bound at construction (so the URL can be printed before the run starts); the server
    starts on the event loop of the first move."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, limits: ConnectionLimits | None = None
    ) -> None:
        self.sock = bind_tcp(host, port)
        self.limits = limits  # (None: ConnectionLimits.default())
        bound = self.sock.getsockname()
        self.base = f"http://{host}:{bound[1]}/"
        self.loopback_only = http_is_loopback(host, bound[1])
        self.tokens: dict[str, str] = {}  # token -> the seat it shows and plays
        self.games: dict[str, Game] = {}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._changed: asyncio.Condition | None = None
        self.version = 0

    def url_for(self, seat: str) -> str:
        """The page of ``seat`` (its token made, and the URL printed, on first use)."""
        token = next((t for t, known in self.tokens.items() if known == seat), None)
        if token is None:
            token = secrets.token_urlsafe(18)
            self.tokens[token] = seat
            print(
                f"human seat {seat}: open {self.base}?token={token}\n  (one episode at a "
                "time is easier to follow: --concurrency 1)",
                file=sys.stderr,
                flush=True,
            )
        return f"{self.base}?token={token}"

    async def ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop, self._changed = loop, asyncio.Condition()
        self.games = {k: g for k, g in self.games.items() if not g.done and g.waiting is None}
        self._runner = web.AppRunner(self._app(), handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        # A duplicate of the socket for each event loop (a run per asyncio.run): the one
        # bound at construction stays open however many runs this process plays.
        await GuardedSite(self._runner, self.sock.dup(), self.limits).start()  # (slow clients)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner, self._loop = None, None

    def new_game(self, seat: str, scenario: str, rules: str) -> Game:
        game = Game(str(next(self._ids)), seat, scenario, rules)
        self.games[game.id] = game
        return game

    async def changed(self) -> None:
        self.version += 1
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    def state(self, seat: str | None = None) -> dict[str, Any]:
        """The games of ``seat`` (None: every seat's), live ones and the last 5 finished."""
        games = [g for g in self.games.values() if seat is None or g.seat == seat]
        live = [g for g in games if not g.done]
        finished = [g for g in games if g.done][-5:]
        return {"version": self.version, "games": [g.as_json() for g in live + finished]}

    def _seat(self, request: web.Request) -> str:
        """The seat whose token the request's URL presents (``?token=``); 403 without a
        valid one."""
        from parley.arena.view.rate import token_owner

        found = token_owner(self.tokens, request)
        if found is None:
            raise web.HTTPForbidden(text="this page needs the URL the run printed (token)")
        return found

    def _app(self) -> web.Application:
        app = web.Application(
            client_max_size=4 * MAX_ACTION_CHARS + 4096,
            # The token is checked before a byte of a body is read: a stranger's trickled
            # body held a connection of the seat's server for as long as it liked.
            middlewares=[
                guard(loopback_only=self.loopback_only, authorize=self._seat),
                _one_request_per_connection,
            ],
        )

        async def page(request: web.Request) -> web.Response:
            self._seat(request)
            return web.Response(text=PAGE, content_type="text/html", headers=_HEADERS)

        async def script(request: web.Request) -> web.Response:
            from parley.arena.view.server import asset

            name = request.path.rpartition("/")[2]
            return web.Response(body=asset(name), content_type=_ASSETS[request.path])

        async def state(request: web.Request) -> web.Response:
            seat = self._seat(request)
            try:
                since = int(request.query.get("since", "-1"))
            except ValueError:
                since = -1
            if since >= self.version and self._changed is not None:
                async with self._changed:
                    # Nothing new within POLL_S: answer anyway; the page asks again.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._changed.wait_for(lambda: self.version > since), POLL_S
                        )
            return web.json_response(self.state(seat), headers=_HEADERS)

        async def act(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                raise web.HTTPBadRequest(text="send JSON: {game, text}") from None
            if not isinstance(body, dict):
                raise web.HTTPBadRequest(text="send JSON: {game, text}")
            seat = self._seat(request)  # (guard checked it before reading the body)
            game = self.games.get(str(body.get("game", "")))
            if game is not None and game.seat != seat:
                game = None  # another seat's game: as if it did not exist
            text = body.get("text")
            if not isinstance(text, str) or len(text) > MAX_ACTION_CHARS:
                raise web.HTTPBadRequest(
                    text=f"text must be a string of at most {MAX_ACTION_CHARS} characters"
                )
            if game is None or game.waiting is None or game.waiting.done():
                raise web.HTTPConflict(text="that game is not waiting for a move")
            game.waiting.set_result(text)
            return web.json_response({"ok": True}, headers=_HEADERS)

        app.router.add_get("/", page)
        app.router.add_get("/api/state", state)
        app.router.add_post("/api/act", act)
        for path in _ASSETS:
            app.router.add_get(path, script)
        return app


_ASSETS = {"/static/human.js": "text/javascript", "/static/view.css": "text/css"}
_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
PAGE = (
    "<!doctype html><html lang=en><head><meta charset=utf-8>"
    f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
    "<title>parley · your seat</title><link rel=stylesheet href=/static/view.css>"
    "<script src=/static/human.js defer></script></head><body><header>"
    "<span class=brand>parley</span><span class=title>your seat</span></header>"
    "<main id=play><p id=status>connecting…</p><div id=games></div></main></body></html>"
)


@web.middleware
async def _one_request_per_connection(request: web.Request, handler: Any) -> web.StreamResponse:
    """No keep-alive: a browser must not reuse a connection to the server of an earlier run
    in this process (its event loop is gone; the new run's server shares the socket)."""
    response: web.StreamResponse = await handler(request)
    response.force_close()
    return response


_hub: HumanHub | None = None


def hub(host: str = "127.0.0.1", port: int = 0) -> HumanHub:
    """The process's human-seat server (made on first use; each seat's page URL is printed
    by :meth:`HumanHub.url_for`)."""
    global _hub
    if _hub is None:
        _hub = HumanHub(host, port)
    return _hub


class BrowserHuman(Agent):
    """A seat played in the browser page of :func:`hub`."""

    name = "human"

    def __init__(self, seat: str, scenario: str, rules: str, server: HumanHub) -> None:
        self.seat, self.scenario, self.rules, self.server = seat, scenario, rules, server
        self.game: Game | None = None

    def reset(self, seed: int | None = None) -> None:
        self.game = None

    async def act(self, observation: Observation) -> Action:
        await self.server.ensure_started()
        if self.game is None:
            self.game = self.server.new_game(self.seat, self.scenario, self.rules)
        game = self.game
        info = observation.info
        game.invalid = str(info.get("invalid") or "")
        game.constraint = (
            info.get("constraint") if isinstance(info.get("constraint"), dict) else None
        )
        game.history.append(
            {"from": "scenario", "text": observation.text, "turn": info.get("turn")}
        )
        game.waiting = asyncio.get_running_loop().create_future()
        await self.server.changed()
        try:
            text = await game.waiting
        finally:
            game.waiting = None
        game.history.append({"from": "you", "text": text})
        await self.server.changed()
        return Action(agent=observation.agent, text=text)

    async def close(self) -> None:
        if self.game is not None and not self.game.done:
            self.game.done = True
            if self.game.waiting is not None and not self.game.waiting.done():
                self.game.waiting.cancel()
            await self.server.changed()


def _rules(seat: SeatContext) -> str:
    from parley.scenarios import make

    env = make(seat.scenario)
    try:
        prompt = getattr(env, "system_prompt", None)
        return str(prompt(seat.seat)) if callable(prompt) else ""
    finally:
        env.close()


def resolve_human(arg: str, seat: SeatContext) -> AgentSource:
    """``human`` (the browser page) or ``human:tty`` (the terminal) for ``seat``."""
    rules = _rules(seat)
    if arg == "tty":
        return lambda: TerminalHuman(rules)
    if arg not in ("", "web", "browser"):
        raise ConfigError(f"human:{arg}: use human (a browser page) or human:tty (the terminal)")
    host = str(seat.options.get("human_host", "127.0.0.1"))
    try:
        port = int(seat.options.get("human_port", 0))
        server = hub(host, port)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"human seat: cannot listen on {host}: {exc}") from exc
    server.url_for(seat.seat)  # (prints the seat's page)
    return lambda: BrowserHuman(seat.seat, seat.scenario, rules, server)
