"""SkyRL: a parley seat as a ``skyrl_gym`` ``BaseTextEnv``, made per trajectory.

SkyRL's generator (``skyrl/train/generators/skyrl_gym_generator.py``, ``agent_loop``) makes
one environment per trajectory with ``skyrl_gym.make(env_class, env_config=...,
extras=row)``, calls ``init(prompt)`` once, then ``step(model_text)`` until ``done``, then
``get_metrics()`` and ``close()``; each call synchronous, in a thread of its
``max_env_workers`` pool (32) or, with 0 workers, on its own event loop. :class:`ParleyTextEnv`
is such an environment: the model plays one learner seat, parley plays every other seat
through :class:`~parley.arena.integrations.learner.LearnerArena`::

    from parley.arena.integrations.skyrl_env import dataset_rows, register

    register("parley-dond", scenario="negotiation/deal-or-no-deal-v3", learner="player_0")
    rows = dataset_rows("parley-dond", episodes=1000, seed=0)  # prompt, env_class, seed

Contract:

- **One arena thread per process.** The environments of a process share one background
  thread running one event loop, with one ``LearnerArena`` per distinct settings; each
  environment is a session of it, and each call is submitted to that loop and waited for
  at most ``call_timeout`` seconds. (SkyRL makes environments by ``make`` alone, with no
  owner object to hold an arena: the thread is the process's, keyed by settings so
  different settings never share an arena.)
- **Seeds and prompts.** ``init`` resets the scenario with the row's ``seed`` (SkyRL passes
  the row's other columns as ``extras``) and answers the seat's own chat (system prompt,
  first observation): the row's prompt is only what SkyRL's dataset filters on.
- **Rewards.** Each ``step`` answers the seat's next observation as one user message and
  its reward since its last action; the last step carries what is left of the return, so
  the rewards of an episode sum to the seat's return (SkyRL's ``mean_raw_reward`` sums
  them). ``metadata`` holds the seat's own ``info``; at the end ``return``, reward
  ``components`` and the scenario's ``metrics``, which :meth:`ParleyTextEnv.get_metrics`
  also answers (with ``parley_failed``), for SkyRL's env metrics.
- **Failures** (a partner crashed, ``max_steps``, ``turn_timeout``, SkyRL's
  ``generator.max_turns`` learner turns, the episode reaped, a call past ``call_timeout``)
  are never a silent 0. SkyRL has no way to leave a trajectory out: a ``None`` reward
  fails its generator's ``assert step_reward is not None`` (and ``float(None)`` step-wise),
  and it ignores ``metadata``. So by default the call raises :class:`EpisodeFailed` with
  the reason, which stops SkyRL's ``generate``; ``failed_reward`` (a number) ends the
  trajectory with that reward instead, ``metadata["failed"]`` giving the reason and
  ``get_metrics()["parley_failed"]`` 1.0 (the failed fraction in SkyRL's logs).
- **Bounded by work.** At most ``max_sessions`` episodes are held per arena; starting one
  more ends the least recently used, and one no call touched in ``idle_calls`` calls of
  its arena ends too (counted in calls: no wall clock a loaded machine could fake).
  ``close`` ends the episode and frees its slot (idempotent).
- **Text is text.** The action is played as the arena plays any text (invalid moves are
  the scenario's to judge; a lone surrogate, which UTF-8 cannot carry, becomes U+FFFD); it
  is never echoed into observations, so forged chat tags stay the model's own turn.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError as error:  # pragma: no cover - the hint is the point
    raise ImportError(
        "the SkyRL environment needs skyrl-gym: pip install skyrl-gym==0.4.0 (see "
        "docs/integrations.md)"
    ) from error

from parley.arena.integrations.held import HeldEpisodes
from parley.arena.integrations.learner import LearnerArena, LearnerError, LearnerTurn
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import plan_episodes
from parley.protocols.errors import ConfigError, ParleyError
from parley.scenarios import make

# What SkyRL and its users name: ParleyTextEnv (the entry point), register, dataset_rows,
# EpisodeFailed (the failure it sees), shutdown.
__all__ = ["EpisodeFailed", "ParleyTextEnv", "dataset_rows", "register", "shutdown"]


class EpisodeFailed(ParleyError):
    """The episode failed (``reason`` says why) and ``failed_reward`` gives no score."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"parley episode failed ({reason}): give the env failed_reward to score failed "
            "episodes, or fix the cause"
        )
        self.reason = reason


@dataclass
class ParleySkyRLConfig:
    """The environment's settings: ``register`` kwargs, then SkyRL's ``env_config``."""

    scenario: str = "collaboration/referential-v1"
    """A registered scenario id (``parley list``)."""
    learner: str = ""
    """The seat the trained model plays; "" is the scenario's first seat."""
    agents: list[str] | dict[str, str] = field(default_factory=list)
    """Specs of the other seats, as ``parley run --agents`` (``scripted`` where none)."""
    scenario_kwargs: dict[str, Any] = field(default_factory=dict)
    """Scenario options (``parley run -s key=value``)."""
    agent_options: dict[str, Any] = field(default_factory=dict)
    """Options of parley's agents (an ``llm:`` spec's pool address...), as RunConfig's."""
    max_sessions: int = 1024
    """Episodes held at once per arena; one more ends the least recently used."""
    idle_calls: int = 0
    """Calls of the arena after which an untouched episode ends; 0 is 64 x max_sessions
    (a slow trajectory among a batch's fast ones is not abandoned; the capacity bound holds
    whatever this is)."""
    turn_timeout: float = 600.0
    """Seconds any seat may take for one action, the model's (its generation) included."""
    max_steps: int = 10_000
    """Scenario steps after which an episode fails (as ``parley run --max-steps``)."""
    failed_reward: float | None = None
    """The reward of a failed episode's last step; None raises :class:`EpisodeFailed`."""
    call_timeout: float = 900.0
    """Seconds one call waits for the arena thread; past it the episode fails."""

    def __post_init__(self) -> None:
        if (
            self.max_sessions < 1
            or self.idle_calls < 0
            or self.turn_timeout <= 0
            or self.call_timeout <= 0
        ):
            raise ConfigError(
                "parley env: max_sessions must be 1 or more, idle_calls 0 or more, "
                "turn_timeout and call_timeout positive"
            )
        if not self.idle_calls:
            self.idle_calls = 64 * self.max_sessions

    @classmethod
    def merged(cls, *sources: Mapping[str, Any] | None) -> ParleySkyRLConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        given: dict[str, Any] = {}
        for source in sources:
            given.update({str(key): _plain(value) for key, value in (source or {}).items()})
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(f"parley env: unknown settings {unknown}; known: {sorted(known)}")
        return cls(**given)

    def arena_key(self) -> str:
        """What tells arenas apart: everything but the per-call settings."""
        settings = dataclasses.asdict(self)
        del settings["failed_reward"], settings["call_timeout"]
        return json.dumps(settings, sort_keys=True, default=str)


def _plain(value: Any) -> Any:
    """An OmegaConf node (SkyRL's env_config) as plain containers."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


class _Served:
    """One settings' arena and its running episodes, least recently used first."""

    def __init__(self, settings: ParleySkyRLConfig) -> None:
        self.settings = settings
        self.arena: LearnerArena | None = None
        # Each environment's running session (touched only on the arena thread).
        self.held: HeldEpisodes[int, Any] = HeldEpisodes(
            max_sessions=settings.max_sessions, idle_calls=settings.idle_calls
        )
        self.ended: OrderedDict[int, str] = OrderedDict()  # why the arena ended an episode
        self._opening = asyncio.Lock()

    async def start(self, key: int, seed: int) -> LearnerTurn:
        self.held.call()
        await self._reap(room=1)
        async with self._opening:
            if self.arena is None:
                s = self.settings
                arena = LearnerArena(
                    s.scenario,
                    learners=[s.learner] if s.learner else None,
                    agents=s.agents or None,
                    scenario_kwargs=s.scenario_kwargs,
                    agent_options=s.agent_options,
                    max_sessions=s.max_sessions,
                    turn_timeout=s.turn_timeout,
                    max_steps=s.max_steps,
                )
                await arena.__aenter__()
                self.arena = arena
        session = self.arena.session()
        self.held.add(key, session)
        with self.held.playing(key):  # (a reset played long is not idleness either)
            return await session.reset(seed=seed)

    async def step(self, key: int, action: str) -> LearnerTurn | str:
        """The next turn, or why the arena ended the episode."""
        self.held.call()
        if key not in self.held:
            return self.ended.pop(key, "closed: the environment was closed")
        # Never idle while its step is played (a slow partner); idle from the answer on.
        with self.held.playing(key):
            await self._reap(room=0)
            if key not in self.held:
                return self.ended.pop(key, "closed: the environment was closed")
            return await self.held[key].step(action)  # type: ignore[no-any-return]

    async def end(self, key: int, why: str = "") -> None:
        if not why:  # the environment closes: nothing left to tell it
            self.ended.pop(key, None)
        session = self.held.pop(key)
        if session is None:
            return
        if why:  # the environment learns it at its next step
            self.ended[key] = why
            while len(self.ended) > self.settings.max_sessions:
                self.ended.popitem(last=False)
        await session.close()

    async def _reap(self, room: int) -> None:
        """End episodes idle past ``idle_calls``, then the least recent past capacity."""
        s = self.settings
        for key in self.held.idle():
            await self.end(key, f"reaped: no call in {s.idle_calls} calls of its arena")
        for key in self.held.over(room):
            await self.end(
                key,
                f"reaped: {s.max_sessions} episodes held (max_sessions): raise max_sessions to "
                "the trajectories SkyRL runs at once",
            )

    async def close(self) -> None:
        for key in self.held.in_order():
            await self.end(key)
        arena, self.arena = self.arena, None
        if arena is not None:
            await arena.__aexit__(None, None, None)


class _Hub:
    """The process's arena thread: one event loop, one :class:`_Served` per settings."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._served: dict[str, _Served] = {}
        self._keys = 0

    def call(self, make: Any, timeout: float) -> Any:
        """Run ``make()`` (a coroutine) on the arena thread; wait at most ``timeout``."""
        loop = self._running()
        if threading.current_thread() is self._thread:
            raise ParleyError("a ParleyTextEnv call from the arena's own thread would deadlock")
        future = asyncio.run_coroutine_threadsafe(_wrap(make), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def submit(self, make: Any) -> None:
        """Run ``make()`` on the arena thread without waiting for it."""
        asyncio.run_coroutine_threadsafe(_wrap(make), self._running())

    def served(self, settings: ParleySkyRLConfig) -> tuple[_Served, int]:
        """The arena of ``settings`` (made on the arena thread) and a new episode key."""
        with self._lock:
            self._keys += 1
            key = settings.arena_key()
            if key not in self._served:
                self._served[key] = self.call(lambda: _make_served(settings), 60.0)
            return self._served[key], self._keys

    def shutdown(self) -> None:
        with self._lock:
            loop, thread, served = self._loop, self._thread, list(self._served.values())
            self._loop, self._thread, self._served = None, None, {}
            if loop is None or thread is None or self._pid != os.getpid():
                return
            for one in served:
                future = asyncio.run_coroutine_threadsafe(one.close(), loop)
                try:
                    future.result(30.0)
                except concurrent.futures.TimeoutError:  # the thread is a daemon: exit anyway
                    future.cancel()
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30.0)

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # a forked child starts anew
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="parley-skyrl-arena", daemon=True
                )
                thread.start()
                self._loop, self._thread, self._pid, self._served = loop, thread, os.getpid(), {}
            return self._loop


async def _wrap(make: Any) -> Any:
    return await make()


async def _make_served(settings: ParleySkyRLConfig) -> _Served:
    return _Served(settings)  # its asyncio.Lock belongs to the arena's loop


_HUB = _Hub()
atexit.register(_HUB.shutdown)


def shutdown() -> None:
    """Close every arena of this process and stop its thread (at exit anyway)."""
    _HUB.shutdown()


class ParleyTextEnv(BaseTextEnv):  # type: ignore[misc]
    """A parley learner seat as a SkyRL-Gym text environment (module docstring)."""

    def __init__(
        self,
        env_config: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self.settings = ParleySkyRLConfig.merged(settings, env_config)
        extras = extras or {}
        seed = extras.get("seed")
        if type(seed) is not int or seed < 0:
            raise ConfigError(
                f"parley env: the row's seed must be a non-negative integer, got {seed!r} "
                "(build the rows with parley's skyrl_env.dataset_rows)"
            )
        self.seed = seed
        max_turns = extras.get("max_turns")  # SkyRL's generator.max_turns
        self.max_turns = int(max_turns) if max_turns else 0
        self._served, self._key = _HUB.served(self.settings)
        self._started = False
        self._closed = False
        self._end: dict[str, Any] = {}

    def init(self, prompt: Any = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset the scenario with the row's seed; the seat's first chat."""
        if self._started:
            raise LearnerError("busy", "init was called already: make one env per trajectory")
        self._started = True
        turn = self._call(lambda: self._served.start(self._key, self.seed))
        if isinstance(turn, str) or turn.done:
            self._fail(turn if isinstance(turn, str) else turn.failed or "the seat never acts")
            return list(prompt or []), {"failed": self._end["failed"]}
        return turn.messages, {"seat": turn.seat, "info": turn.info}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Play ``action`` as the seat's move; its next observation and reward."""
        if not self._started:
            raise LearnerError("no_episode", "call init before step")
        if self._closed:
            raise LearnerError("closed", "this environment is closed: make another")
        if self._end:
            if not self._end.get("failed") or "reported" in self._end:
                raise LearnerError("episode_over", "the episode is over: make another env")
            self._end["reported"] = True
            return self._output([], self.settings.failed_reward, True, self._end)
        if not isinstance(action, str):
            raise LearnerError("bad_action", f"an action is text, got {type(action).__name__}")
        self.turns += 1
        # A lone surrogate cannot cross the arena's bus (UTF-8): played as U+FFFD, as a
        # tokenizer's decode gives it, not as a failed episode.
        text = action.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        turn = self._call(lambda: self._served.step(self._key, text))
        if isinstance(turn, str):
            return self._failed(turn)
        if turn.failed:
            return self._failed(turn.failed)
        if turn.done:
            seat = self.settings.learner or next(iter(turn.returns))
            self._end = {
                "return": turn.returns[seat],
                "components": turn.components.get(seat, {}),
                "metrics": turn.metrics,
                "failed": "",
            }
            self._close_session()
            return self._output([], turn.reward, True, self._end)
        if self.max_turns and self.turns >= self.max_turns:
            return self._failed(
                f"max_turns: the seat took {self.turns} turns (SkyRL's generator.max_turns) "
                "and the episode goes on: raise generator.max_turns"
            )
        obs = [{"role": "user", "content": turn.text}]
        return self._output(obs, turn.reward, False, {"seat": turn.seat, "info": turn.info})

    def get_metrics(self) -> dict[str, Any]:
        """The scenario's episode metrics and ``parley_failed`` (1.0 when it failed)."""
        if not self._end:
            return {}
        metrics = dict(self._end.get("metrics") or {})
        metrics["parley_failed"] = 1.0 if self._end.get("failed") else 0.0
        return metrics

    def close(self) -> None:
        """End the episode (if it runs) and free its slot. Idempotent."""
        if not self._closed:
            self._closed = True
            self._close_session()

    # ---------------------------------------------------------------- machinery

    def _call(self, make: Any) -> Any:
        try:
            return _HUB.call(make, self.settings.call_timeout)
        except concurrent.futures.TimeoutError:  # the call was cancelled: end the episode
            _HUB.submit(lambda: self._served.end(self._key))  # without waiting again
            return f"call_timeout: no answer in {self.settings.call_timeout} s"

    def _close_session(self) -> None:
        self._call(lambda: self._served.end(self._key))

    def _fail(self, reason: str) -> None:
        self._end = {"failed": reason, "return": None, "components": {}, "metrics": {}}
        self._close_session()
        if self.settings.failed_reward is None:
            raise EpisodeFailed(reason)

    def _failed(self, reason: str) -> BaseTextEnvStepOutput:
        self._fail(reason)
        self._end["reported"] = True
        return self._output([], self.settings.failed_reward, True, self._end)

    @staticmethod
    def _output(
        obs: list[dict[str, str]], reward: float | None, done: bool, metadata: dict[str, Any]
    ) -> BaseTextEnvStepOutput:
        if reward is None:  # (a failure raised before, unless failed_reward is a number)
            raise ParleyError("parley env: no reward to give")
        meta = {k: v for k, v in metadata.items() if k != "reported"}
        return BaseTextEnvStepOutput(
            observations=obs, reward=float(reward), done=done, metadata=meta
        )


def register(env_id: str, **settings: Any) -> None:
    """Register ``env_id`` in SkyRL-Gym's registry as a :class:`ParleyTextEnv` with
    ``settings`` (:class:`ParleySkyRLConfig`'s fields), checked now."""
    ParleySkyRLConfig.merged(settings)
    skyrl_gym.register(id=env_id, entry_point=f"{__name__}:ParleyTextEnv", kwargs=dict(settings))


def dataset_rows(env_id: str, episodes: int, seed: int = 0) -> list[dict[str, Any]]:
    """SkyRL dataset rows of ``parley run --seed SEED --episodes N``'s scenario seeds: the
    seat's first chat as ``prompt``, ``env_class`` and the row's ``seed``."""
    spec = skyrl_gym.spec(env_id)
    settings = ParleySkyRLConfig.merged(spec.kwargs)
    probe = make(settings.scenario, **settings.scenario_kwargs)
    seats = list(probe.possible_agents)
    probe.close()
    run = RunConfig(scenario=settings.scenario, episodes=episodes, seed=seed)
    rows = []
    for index, plan in enumerate(plan_episodes(run, seats)):
        env = skyrl_gym.make(env_id, extras={"seed": plan.seed})
        try:
            prompt, _ = env.init([])
        finally:
            env.close()
        rows.append(
            {
                "data_source": f"parley/{settings.scenario}",
                "prompt": prompt,
                "env_class": env_id,
                "seed": plan.seed,
                "extra_info": {"index": index},
            }
        )
    return rows
