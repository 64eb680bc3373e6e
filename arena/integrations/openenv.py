"""The learner seat as an OpenEnv environment (``parley env-server --protocol openenv``).

OpenEnv (``openenv`` 0.10.0, the ``integrations`` extra) serves an environment over HTTP and
WebSocket: ``POST /reset``, ``POST /step``, ``GET /state`` and ``GET /schema``, and ``/ws``,
where each WebSocket connection is one session with its own environment instance (TRL's
environment path and OpenEnv's ``EnvClient`` use it). This module gives OpenEnv what it needs
to serve a :class:`~parley.arena.integrations.learner.LearnerArena`:

- :class:`ParleyAction` (``text``, optional ``seat``), :class:`ParleyObservation` (the
  :class:`~parley.arena.integrations.learner.LearnerTurn` fields; ``reward`` and ``done``
  are OpenEnv's own) and :class:`ParleyState`;
- :class:`ParleyEnvironment`: one per OpenEnv session, holding one learner session; its
  ``reset_async``/``step_async`` run on the server's event loop, where the arena's runner
  plays the other seats (so sessions share one runner and one bus);
- :func:`create_openenv_app`: the FastAPI app (OpenEnv's ``create_fastapi_app``), its
  session cap set to the arena's, trainer mistakes answered as OpenEnv errors (WebSocket:
  an ``error`` frame, ``EXECUTION_ERROR`` with the learner error's code in the message, or
  ``VALIDATION_ERROR`` for a malformed action; HTTP: 409 with ``code``, 422), and, when
  bound to loopback, only loopback ``Host`` headers answered (421; a closed WebSocket), as
  parley's other HTTP servers do against DNS rebinding;
- :class:`ParleyEnvClient`: OpenEnv's :class:`EnvClient` typed for these models, for
  trainers (``async with ParleyEnvClient(base_url=url) as env: await env.reset(seed=1)``).

HTTP ``/reset`` and ``/step`` are stateless in OpenEnv (a fresh environment per request,
closed after it): a step there has no episode. Play episodes over the WebSocket.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from parley.arena.inference.http_guard import LOOPBACK_HOSTS, _host_name
from parley.arena.integrations.learner import LearnerArena, LearnerError, LearnerTurn

__all__ = [
    "ParleyAction",
    "ParleyEnvClient",
    "ParleyEnvironment",
    "ParleyObservation",
    "ParleyState",
    "create_openenv_app",
]


class ParleyAction(Action):  # type: ignore[misc]  # openenv is untyped
    """The trainer's action for the learner seat that acts now."""

    text: str = Field(description="The action text, as an agent in the seat would answer")
    seat: str = Field(default="", description="The acting seat (optional; checked if given)")


class ParleyObservation(Observation):  # type: ignore[misc]  # (openenv is untyped)
    """A learner turn (``LearnerTurn``); ``reward`` is None when the episode failed."""

    episode: str = ""
    seat: str = Field(default="", description="The learner seat that acts now")
    text: str = Field(default="", description="That seat's observation")
    messages: list[dict[str, str]] = Field(
        default_factory=list, description="The chat an arena LLM agent in the seat would send"
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The seat's own infos")
    steps: int = 0
    returns: dict[str, float] = Field(default_factory=dict)
    components: dict[str, dict[str, float]] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    failed: str = Field(default="", description="Why the episode failed ('' if it did not)")


class ParleyState(State):  # type: ignore[misc]  # (openenv is untyped)
    """The session's state: the scenario, its learner seats, who acts, how it ended."""

    scenario: str = ""
    learners: list[str] = Field(default_factory=list)
    seat: str = ""
    done: bool = False
    failed: str = ""


def _observation(turn: LearnerTurn) -> ParleyObservation:
    return ParleyObservation(
        done=turn.done,
        reward=turn.reward,
        episode=turn.episode,
        seat=turn.seat,
        text=turn.text,
        messages=turn.messages,
        info=turn.info,
        steps=turn.steps,
        returns=turn.returns,
        components=turn.components,
        metrics=turn.metrics,
        failed=turn.failed,
    )


class ParleyEnvironment(Environment[ParleyAction, ParleyObservation, ParleyState]):  # type: ignore[misc]
    """One OpenEnv session of a :class:`LearnerArena`; async only (the arena's loop)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    # Every session's work runs on the server's event loop; OpenEnv's executor only builds
    # and closes environments (both trivial), so all sessions share one thread instead of
    # OpenEnv's default of one per session.
    REQUIRES_SINGLE_THREAD_EXECUTOR = True

    def __init__(self, arena: LearnerArena) -> None:
        super().__init__()
        self._arena = arena
        self._session: Any = None  # made on the first reset, on the event loop

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> ParleyObservation:
        """Start an episode (``seed``: the scenario's; ``episode_id`` is not used)."""
        if self._session is None:
            self._session = self._arena.session()
        return _observation(await self._session.reset(seed))

    async def step_async(
        self, action: ParleyAction, timeout_s: float | None = None, **kwargs: Any
    ) -> ParleyObservation:
        """Play ``action`` for the acting learner seat; the next turn or the end."""
        if self._session is None:
            raise LearnerError("no_episode", "no episode in this session: send reset first")
        return _observation(await self._session.step(action.text, action.seat))

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> ParleyObservation:
        raise LearnerError("bad_action", "ParleyEnvironment is async: use reset_async")

    def step(
        self, action: ParleyAction, timeout_s: float | None = None, **kwargs: Any
    ) -> ParleyObservation:
        raise LearnerError("bad_action", "ParleyEnvironment is async: use step_async")

    @property
    def state(self) -> ParleyState:
        if self._session is None:
            return ParleyState(scenario=self._arena.scenario, learners=self._arena.learners)
        return ParleyState(**self._session.state())

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=f"parley:{self._arena.scenario}",
            description=(
                f"parley scenario {self._arena.scenario}: the trainer plays "
                f"{self._arena.learners}, parley plays the other seats"
            ),
        )

    def close(self) -> None:
        """End the session's episode (OpenEnv may call this from an executor thread)."""
        if self._session is not None:
            self._session.close_threadsafe()


class _LoopbackHosts:
    """ASGI middleware: only loopback ``Host`` headers (DNS rebinding; http_guard's rule)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope.get("headers") or [])
            host = bytes(headers.get(b"host", b"")).decode("latin-1")
            if _host_name(host).lower() not in LOOPBACK_HOSTS:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                refused = JSONResponse(
                    {
                        "detail": f"unexpected Host header {host!r}: loopback only",
                        "code": "bad_host",
                    },
                    status_code=421,
                )
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_openenv_app(arena: LearnerArena, *, loopback_only: bool = True) -> Any:
    """The OpenEnv FastAPI app serving ``arena`` (open it first, on the serving loop)."""
    app: FastAPI = create_fastapi_app(
        functools.partial(ParleyEnvironment, arena),  # (a class: OpenEnv reads its flags)
        ParleyAction,
        ParleyObservation,
        max_concurrent_envs=arena.max_sessions,
        env_name="parley",
        state_cls=ParleyState,
    )

    async def learner_error(request: Request, exc: Exception) -> JSONResponse:
        code = getattr(exc, "code", "bad_action")
        return JSONResponse({"detail": str(exc), "code": code}, status_code=409)

    app.add_exception_handler(LearnerError, learner_error)
    return _LoopbackHosts(app) if loopback_only else app


class ParleyEnvClient(EnvClient[ParleyAction, ParleyObservation, ParleyState]):  # type: ignore[misc]
    """OpenEnv's WebSocket client typed for a parley learner seat."""

    def _step_payload(self, action: ParleyAction) -> dict[str, Any]:
        payload: dict[str, Any] = action.model_dump()
        return payload

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ParleyObservation]:
        fields = dict(payload.get("observation", {}))
        observation = ParleyObservation(
            **fields, reward=payload.get("reward"), done=bool(payload.get("done"))
        )
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> ParleyState:
        return ParleyState(**payload)
