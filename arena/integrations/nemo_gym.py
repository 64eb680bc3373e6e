"""The learner seat as a NeMo Gym resources server (NeMo Gym's ``gymnasium`` contract).

NeMo Gym (``nemo-gym``) collects rollouts through an *agent* server that calls a *model*
server and a *resources* server. Its multi-turn contract is ``resources_servers.gymnasium``,
played by its ``gymnasium_agent``: ``POST /reset`` (the dataset row) answers the first
observation, then, after each model response, ``POST /step`` (the row plus ``response``, a
Responses-API object) answers ``observation``, ``reward``, ``terminated``, ``truncated``
and ``info``; the agent sums the step rewards and passes the resources server's cookies from
each answer to the next request, which is how a rollout keeps its session. This module
serves a :class:`~parley.arena.integrations.learner.LearnerArena` under that contract:

- ``/reset`` opens a learner session for the rollout (a ``parley_session`` cookie) and resets
  the scenario with the row's ``seed`` (an integer field of the row; none derives one); the
  observation is the learner seat's first one.
- ``/step`` plays the text of the response's output messages (``output_text`` parts, joined,
  then :func:`~parley.agents.llm.parse_action`) as the seat's action. ``reward`` is the
  adapter's turn reward, so a rollout's rewards sum to the seat's return; the last step's
  ``info`` carries ``returns``, ``components`` and ``metrics``.
- A failed parley episode answers 409 with ``{"code": "episode_failed", "detail": reason}``
  and a trainer mistake 409 with the learner error's code (``no_episode``,
  ``episode_over``...): NeMo Gym's agent raises on it and rollout collection records a
  failure, so a failed episode is never scored 0. Past ``max_sessions`` open rollouts:
  503 ``capacity``.
- ``/aggregate_metrics`` answers the mean reward (NeMo Gym's ``AggregateMetrics`` shape,
  reduced); ``/verify`` is NeMo Gym's single-turn path and answers 404 (as its
  ``GymnasiumServer`` does, the contract is ``/step``).

The system prompt of the seat travels in the dataset row (``responses_create_params.input``),
as NeMo Gym datasets carry prompts: :func:`dataset_rows` writes the rows of ``parley run``'s
episodes. Bound to loopback, only loopback ``Host`` headers are answered (421), as parley's
other servers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from parley.agents.llm import parse_action
from parley.arena.integrations.learner import LearnerArena, LearnerError, LearnerSession
from parley.arena.integrations.openenv import _LoopbackHosts
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import plan_episodes

__all__ = ["create_nemo_gym_app", "dataset_rows"]

SESSION_COOKIE = "parley_session"
"""The cookie that names a rollout's learner session (NeMo Gym's agent passes it back)."""


def response_text(response: Mapping[str, Any]) -> str:
    """The text of a Responses-API object's output messages (NeMo Gym's ``extract_text``)."""
    parts: list[str] = []
    for item in response.get("output") or []:
        if not isinstance(item, Mapping) or item.get("type") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
            continue
        for part in content or []:
            if isinstance(part, Mapping) and part.get("type") == "output_text":
                parts.append(str(part.get("text", "")))
    return "".join(parts)


def dataset_rows(
    arena: LearnerArena, *, seed: int = 0, episodes: int = 10
) -> Iterator[dict[str, Any]]:
    """NeMo Gym dataset rows of ``parley run --seed SEED --episodes N``'s episodes: the
    learner seat's system prompt as the input, the episode's scenario seed as ``seed``."""
    (seat,) = arena.learners[:1]
    system = arena._system.get(seat, "")
    run = RunConfig(scenario=arena.scenario, episodes=episodes, seed=seed)
    for plan in plan_episodes(run, arena.seats):
        messages = [{"role": "system", "content": system}] if system else []
        yield {"responses_create_params": {"input": messages}, "seed": plan.seed}


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"code": code, "detail": detail}, status_code=status)


def create_nemo_gym_app(arena: LearnerArena, *, loopback_only: bool = True) -> Any:
    """The ASGI app serving ``arena`` (open it first: the app does not own it)."""
    app = FastAPI(title=f"parley {arena.scenario} (NeMo Gym gymnasium resources server)")
    sessions: dict[str, LearnerSession] = {}

    async def _turn_answer(session_id: str, coro: Any) -> JSONResponse:
        try:
            turn = await coro
        except LearnerError as error:
            status = 503 if error.code == "capacity" else 409
            return _error(status, error.code, str(error))
        if turn.done:
            session = sessions.pop(session_id, None)
            if session is not None:
                await session.close()
            if turn.failed:
                return _error(409, "episode_failed", turn.failed)
        info: dict[str, Any] = {"seat": turn.seat, "episode": turn.episode, **turn.info}
        if turn.done:
            info.update(returns=turn.returns, components=turn.components, metrics=turn.metrics)
        body = {
            "observation": turn.text or None,
            "reward": float(turn.reward or 0.0),
            "terminated": turn.done,
            "truncated": False,
            "info": info,
        }
        answer = JSONResponse(json.loads(json.dumps(body, default=str)))
        answer.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict")
        return answer

    @app.post("/seed_session")
    async def seed_session() -> dict[str, Any]:
        return {}

    @app.post("/reset")
    async def reset(request: Request) -> JSONResponse:
        row = await request.json()
        seed = row.get("seed") if isinstance(row, dict) else None
        if seed is not None and (type(seed) is not int or seed < 0):
            return _error(422, "bad_action", f"seed must be a non-negative integer, got {seed!r}")
        old = sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)
        if old is not None:
            await old.close()
        try:
            session = arena.session()
        except LearnerError as error:
            return _error(503 if error.code == "capacity" else 409, error.code, str(error))
        session_id = uuid.uuid4().hex
        sessions[session_id] = session
        return await _turn_answer(session_id, session.reset(seed=seed))

    @app.post("/step")
    async def step(request: Request) -> JSONResponse:
        session_id = request.cookies.get(SESSION_COOKIE, "")
        session = sessions.get(session_id)
        if session is None:
            return _error(409, "no_episode", "no episode for this rollout: POST /reset first")
        row = await request.json()
        response = row.get("response") if isinstance(row, dict) else None
        if not isinstance(response, Mapping):
            return _error(422, "bad_action", "the body needs `response`, a Responses-API object")
        text = parse_action(response_text(response), None)
        return await _turn_answer(session_id, session.step(text))

    @app.post("/verify")
    async def verify() -> JSONResponse:
        return _error(404, "use_step", "a gymnasium resources server: rollouts use /reset, /step")

    @app.post("/aggregate_metrics")
    async def aggregate_metrics(request: Request) -> dict[str, Any]:
        body = await request.json()
        rewards = [float(r.get("reward", 0.0)) for r in body.get("verify_responses") or []]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        return {"agent_metrics": {"mean/reward": mean}, "key_metrics": {"mean/reward": mean}}

    return _LoopbackHosts(app) if loopback_only else app


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m parley.arena.integrations.nemo_gym SCENARIO [--learner SEAT]...``"""
    parser = argparse.ArgumentParser(prog="python -m parley.arena.integrations.nemo_gym")
    parser.add_argument("scenario")
    parser.add_argument("--learner", action="append", default=None)
    parser.add_argument("--agents", default=None, help="specs of the other seats, comma-separated")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--insecure", action="store_true", help="allow a non-loopback --host")
    parser.add_argument("--max-sessions", type=int, default=64)
    parser.add_argument("--turn-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", type=Path, help="write NeMo Gym rows of --episodes here")
    parser.add_argument("--episodes", type=int, default=10)
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "::1", "localhost") and not args.insecure:
        parser.error("the server has no authentication: a non-loopback --host needs --insecure")
    arena = LearnerArena(
        args.scenario,
        learners=args.learner,
        agents=args.agents.split(",") if args.agents else None,
        max_sessions=args.max_sessions,
        turn_timeout=args.turn_timeout,
        seed=args.seed,
    )
    if args.dataset is not None:
        rows = dataset_rows(arena, seed=args.seed, episodes=args.episodes)
        args.dataset.write_text("".join(f"{json.dumps(row)}\n" for row in rows))
    # Bound here, so the printed port is the real one when --port is 0.
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    print(f"nemo-gym: serving {args.scenario} at http://{args.host}:{sock.getsockname()[1]}")
    sys.stdout.flush()

    async def serve() -> None:
        import uvicorn

        async with arena:
            app = create_nemo_gym_app(arena, loopback_only=not args.insecure)
            config = uvicorn.Config(app, log_level="warning", lifespan="off")
            await uvicorn.Server(config).serve(sockets=[sock])

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
