"""The human seat: a person plays deal-or-no-deal at the terminal and through the page's API
(the browser itself is driven in test_browser.py), and the episode is recorded."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from parley.agents.human import TerminalHuman
from parley.arena.run.agent_specs import SeatContext, resolve_agent_spec
from parley.arena.run.config import RunConfig
from parley.arena.run.runner import Runner
from parley.arena.view import human
from parley.protocols.errors import ConfigError

SCENARIO = "negotiation/deal-or-no-deal-v1"


def counts(text: str) -> dict[str, int]:
    """What a person reads off the observation: how many of each item there are."""
    return {item: int(n) for item, n in re.findall(r"(book|hat|ball) x(\d)", text)}


def give_all(c: dict[str, int]) -> str:
    """The claim "I take nothing, you take everything" for these counts."""
    mine = " ".join(f"{k}=0" for k in ("book", "hat", "ball"))
    theirs = " ".join(f"{k}={c[k]}" for k in ("book", "hat", "ball"))
    return f"{mine} / {theirs}"


def test_tty_human_plays_a_whole_episode(tmp_path: Path) -> None:
    out = io.StringIO()
    said: list[str] = []

    def read() -> str:
        shown = out.getvalue()
        if "must match the pattern" in shown.rsplit("===", 1)[-1]:
            move = give_all(counts(shown))
        elif not said:
            move = ""  # an empty message: invalid, and the person is told so
        else:
            move = "<selection>"
        said.append(move)
        return move + "\n"

    source = resolve_agent_spec("human:tty", SeatContext(SCENARIO, "player_0"))
    assert callable(source)
    rules = source().rules  # type: ignore[attr-defined]
    assert "<selection>" in rules  # the action syntax is shown
    config = RunConfig(SCENARIO, episodes=1, out=str(tmp_path), progress=False, act_timeout=30)
    runner = Runner(config, agents={"player_0": lambda: TerminalHuman(rules, read=read, out=out)})
    result = asyncio.run(runner.run())
    shown = out.getvalue()
    assert "Rules: " in shown
    # The person is told why the empty message was invalid: by the scenario's text here (the
    # partner moved in between, so infos["invalid"] of that step never reached this seat).
    assert "Invalid move: empty message" in shown
    assert "must match the pattern" in shown  # the choose phase's constraint
    assert said[0] == ""
    assert said[-1].endswith(f"ball={counts(shown)['ball']}")
    (ep,) = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").open()]
    assert ep["status"] == "ok"
    assert [s["actions"]["player_0"] for s in ep["steps"] if "player_0" in s["actions"]] == said
    assert result.summary["episodes"]["ok"] == 1


def test_human_spec_errors_say_what_to_write() -> None:
    with pytest.raises(ConfigError, match="human:tty"):
        resolve_agent_spec("human:telepathy", SeatContext(SCENARIO, "player_0"))


async def _state(s: aiohttp.ClientSession, base: str, token: str, since: int) -> dict[str, Any]:
    async with s.get(f"{base}/api/state", params={"token": token, "since": since}) as r:
        assert r.status == 200
        return dict(await r.json())


async def test_browser_seat_api_plays_and_records_an_episode(tmp_path: Path) -> None:
    server = human.hub()  # the process's page server
    seat = resolve_agent_spec("human", SeatContext(SCENARIO, "player_1"))
    base, token = server.url_for("player_1").split("/?token=")  # (the URL the run printed)
    mine = {"token": token}
    config = RunConfig(SCENARIO, episodes=1, out=str(tmp_path), progress=False, act_timeout=30)
    run = asyncio.create_task(Runner(config, agents={"player_1": seat}).run())  # type: ignore[dict-item]
    moves: list[str] = []
    errors: list[str] = []
    async with aiohttp.ClientSession() as s:
        version = -1
        while not run.done():
            poll = asyncio.ensure_future(_state(s, base, token, version))
            await asyncio.wait([poll, run], return_when=asyncio.FIRST_COMPLETED)
            if not poll.done():  # the run is over: no move is awaited any more
                poll.cancel()
                break
            state = poll.result()
            version = state["version"]
            games = [g for g in state["games"] if g["waiting"]]
            if not games:
                continue
            game = games[0]
            assert game["seat"] == "player_1"
            assert "<selection>" in game["rules"]
            errors += [game["invalid"]] if game["invalid"] else []
            errors += [h["text"] for h in game["history"] if "Invalid move" in h["text"]]
            text = game["history"][-1]["text"]
            if game["constraint"]:
                move = give_all(counts(game["history"][0]["text"]))
            else:
                move = "" if not moves else "<selection>"
            if not moves:  # the attacks first: no token, a wrong game, a bad body
                bad = {"game": game["id"], "text": "x"}
                async with s.post(f"{base}/api/act", params={"token": "guess"}, json=bad) as r:
                    assert r.status == 403
                async with s.post(f"{base}/api/act", json={"token": token, **bad}) as r:
                    assert r.status == 403  # (the token goes in the URL: checked unread)
                async with s.get(f"{base}/api/state") as r:
                    assert r.status == 403
                async with s.post(
                    f"{base}/api/act", params=mine, json={"game": "nope", "text": "x"}
                ) as r:
                    assert r.status == 409
                async with s.post(
                    f"{base}/api/act", params=mine, json={"game": game["id"], "text": 5}
                ) as r:
                    assert r.status == 400
                async with s.post(
                    f"{base}/api/act",
                    params=mine,
                    data=b"\xff{",
                    headers={"Content-Type": "application/json"},
                ) as r:
                    assert r.status == 400
            async with s.post(
                f"{base}/api/act", params=mine, json={"game": game["id"], "text": move}
            ) as r:
                assert r.status == 200, await r.text()
            moves.append(move)
            assert text
        await run
    assert errors  # the empty message was judged invalid, and the page said why
    (ep,) = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").open()]
    assert ep["status"] == "ok"
    played = [s["actions"]["player_1"] for s in ep["steps"] if "player_1" in s["actions"]]
    assert played == moves
    state = human.hub().state()
    assert all(g["done"] for g in state["games"])
    await server.close()  # this test's event loop ends here


def test_a_run_with_a_human_seat_gives_a_person_time() -> None:
    """The agents' 60 s per move would fail a person's episode while they read; any
    act_timeout other than the default is kept."""
    from parley.arena.cli.run import HUMAN_ACT_TIMEOUT, check_config
    from parley.arena.run.config import RunConfig

    def timeout(agents: list[str], **kw: float) -> float:
        config = RunConfig(scenario="negotiation/deal-or-no-deal-v1", agents=agents, **kw)
        return check_config(config).act_timeout

    assert timeout(["human:tty", "scripted"]) == HUMAN_ACT_TIMEOUT
    assert timeout(["scripted", "human"]) == HUMAN_ACT_TIMEOUT
    assert timeout(["human:tty", "scripted"], act_timeout=90.0) == 90.0
    assert timeout(["scripted", "scripted"]) == 60.0


async def test_each_human_seat_has_its_own_page_and_no_other(tmp_path: Path) -> None:
    """Two human seats in one process: each token shows and plays only its own seat (one
    token for the process showed each person the other's private values and let them move
    for the other; found by review), and the page's server has the viewer's guards."""
    server = human.hub()
    seats = {
        s: resolve_agent_spec("human", SeatContext(SCENARIO, s)) for s in ("player_0", "player_1")
    }
    base, _ = server.url_for("player_0").split("/?token=")
    tokens = {s: server.url_for(s).split("/?token=")[1] for s in seats}
    assert tokens["player_0"] != tokens["player_1"]
    config = RunConfig(SCENARIO, episodes=1, out=str(tmp_path), progress=False, act_timeout=30)
    run = asyncio.create_task(Runner(config, agents=seats).run())  # type: ignore[arg-type]
    played: dict[str, list[str]] = {s: [] for s in seats}
    checked = False
    async with aiohttp.ClientSession() as s:
        while not run.done():
            await asyncio.sleep(0.05)
            for seat, token in tokens.items():
                state = await _state(s, base, token, -1)
                assert {g["seat"] for g in state["games"]} <= {seat}
                games = [g for g in state["games"] if g["waiting"]]
                if not games:
                    continue
                game = games[0]
                other = tokens["player_1" if seat == "player_0" else "player_0"]
                if not checked:  # the other seat's token cannot move here
                    steal = {"game": game["id"], "text": "<selection>"}
                    async with s.post(f"{base}/api/act", params={"token": other}, json=steal) as r:
                        assert r.status == 409
                    async with s.get(server.url_for(seat), headers={"Host": "evil.example"}) as r:
                        assert r.status == 421
                    body = json.dumps({"token": token, "game": game["id"], "text": "x"})
                    async with s.post(f"{base}/api/act", data=body) as r:  # text/plain
                        assert r.status == 415
                    deep = "[" * 5_000
                    headers = {"Content-Type": "application/json"}
                    async with s.post(
                        f"{base}/api/act", params={"token": token}, data=deep, headers=headers
                    ) as r:
                        assert r.status == 400
                    checked = True
                if game["constraint"]:
                    move = give_all(counts(game["history"][0]["text"]))
                else:
                    move = "<selection>"
                act = {"game": game["id"], "text": move}
                async with s.post(f"{base}/api/act", params={"token": token}, json=act) as r:
                    assert r.status == 200, await r.text()
                played[seat].append(move)
        await run
    assert checked
    (ep,) = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").open()]
    for seat, moves in played.items():
        assert [st["actions"][seat] for st in ep["steps"] if seat in st["actions"]] == moves
    await server.close()
