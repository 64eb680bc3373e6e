"""The learner seat: an outside trainer plays named seats, parley plays every other one.

A :class:`LearnerArena` wraps one registered scenario for a trainer that generates the
actions of one or more *learner* seats itself (TRL, an OpenEnv client, any RL loop). The
other seats are played by parley agent specs resolved exactly as ``parley run`` resolves
them (:func:`~parley.arena.run.agent_specs.resolve_agent_spec`: ``scripted``,
``module:Class``, ``llm:...`` through a pool, ``remote``...), and every episode is played by
the arena's own :class:`~parley.arena.run.runner.Runner`: the learner seats are seats whose
agent is the trainer, so observations, ``infos``, rewards, failures and the transcript are
the arena's, not a copy of its logic.

Each trainer-side episode stream is a :class:`LearnerSession` (one per OpenEnv WebSocket
session)::

    async with LearnerArena("collaboration/referential-v1", learners=["listener"]) as arena:
        session = arena.session()
        turn = await session.reset(seed=7)        # the listener's first observation
        while not turn.done:
            turn = await session.step(my_policy(turn.messages))
        print(turn.returns, turn.components, turn.metrics, turn.failed)

Contract of a :class:`LearnerTurn`:

- ``seat`` is the learner seat that must act now, ``text`` its observation and ``messages``
  the chat an arena :class:`~parley.agents.llm.LLMAgent` in that seat would send (system
  prompt, then its observations and its own actions, alternating; no token budget
  folding: the trainer owns its context). ``info`` is the seat's own ``infos`` entry
  (``constraint``, ``view``, reward ``components`` of the last step...) without parley's
  internal keys. Nothing of another seat crosses: the trainer sees what the seat's agent
  would see in the arena, and the episode's end adds only the learner seats' returns,
  reward components and the scenario's episode metrics.
- ``reward`` is the acting seat's reward of the step before this observation; the last
  turn's (``done``) is what is left of every learner seat's return, so the rewards of an
  episode sum to the learner seats' total return exactly (a reward earned on a step the
  seat sat out reaches the trainer at its next turn or at the end).
- A failed episode (an agent or the scenario failed, ``max_steps``, the trainer took longer
  than ``turn_timeout`` to answer) ends with ``done`` set, ``failed`` naming the reason
  and ``reward`` None: it is never scored 0 silently.

Several learner seats are presented one at a time, in seat order: ``step`` answers the
seat of the last turn (``seat`` may name it, and must when given).

Trainer mistakes raise :class:`LearnerError` with a code (``unknown_seat``,
``not_your_turn``, ``no_episode``, ``episode_over``, ``busy``, ``capacity``, ``closed``,
``bad_action``); the session stays usable and no other session notices.

How the runner reaches the trainer: the learner seat's agent (:class:`_TrainerSeat`) is
made by the runner per episode and reset with the episode's agent seed; the arena gives
every learner seat of an episode that episode's number as its seed (the trainer's seat
has no parley-side randomness to seed), which is how the agent finds its session. Its
``act`` parks the observation in the session and waits for :meth:`LearnerSession.step`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.agents.base import Agent
from parley.arena.run.agent_host import AGENT_SEED_KEY
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import EpisodePlan, derive_seed
from parley.arena.run.records import EpisodeRecord
from parley.arena.run.runner import Runner
from parley.protocols.errors import ConfigError, ParleyError
from parley.protocols.messages import Action, Observation
from parley.scenarios import make
from parley.scenarios.base import ORACLE_KEY

__all__ = ["LearnerArena", "LearnerError", "LearnerSession", "LearnerTurn"]

LEARNER_SPEC = "learner"
"""The agent spec the transcripts show for a seat the trainer plays."""
_PRIVATE_INFO = frozenset({AGENT_SEED_KEY, ORACLE_KEY})  # parley's, never the trainer's
_SCENARIO_SEED, _AGENT_SEED = 0, 1  # derive_seed purpose tags (as the runner's)


class LearnerError(ParleyError, ValueError):
    """The trainer asked for something the session cannot do; ``code`` names what."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")  # the code travels in protocols' messages
        self.code = code


@dataclass
class LearnerTurn:
    """What the trainer gets after ``reset`` and every ``step`` (module docstring)."""

    episode: str
    """The episode's id (unique within the arena)."""
    seat: str = ""
    """The learner seat that acts now ("" once ``done``)."""
    text: str = ""
    """That seat's observation."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The chat an arena LLM agent in that seat would send (system, user, assistant...)."""
    info: dict[str, Any] = field(default_factory=dict)
    """The seat's own ``infos`` entry of the last step (constraint, view, components...)."""
    reward: float | None = 0.0
    """The seat's reward since its last action; at the end, the rest of the learner seats'
    returns; None when the episode failed."""
    done: bool = False
    """The episode is over (ended or failed): call ``reset`` for another."""
    steps: int = 0
    """Actions the trainer has taken in this episode."""
    returns: dict[str, float] = field(default_factory=dict)
    """At the end: each learner seat's return (empty when failed)."""
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    """At the end: each learner seat's reward per component, summed over the episode."""
    metrics: dict[str, float] = field(default_factory=dict)
    """At the end: the scenario's episode metrics (empty when failed)."""
    failed: str = ""
    """At the end: why the episode failed ("" when it did not)."""


class _TrainerSeat(Agent):
    """The agent of a learner seat: hands each observation to the trainer's session."""

    name = LEARNER_SPEC

    def __init__(self, episodes: Mapping[int, LearnerSession]) -> None:
        self._episodes = episodes
        self._session: LearnerSession | None = None

    def reset(self, seed: int | None = None) -> None:
        # The arena seeds learner seats with the episode number (module docstring).
        self._session = self._episodes.get(seed) if seed is not None else None

    async def act(self, observation: Observation) -> Action:
        if self._session is None:  # the session was reset or closed meanwhile
            raise LearnerError("closed", "the trainer's session of this episode is gone")
        return await self._session._ask(observation)


class LearnerArena:
    """One scenario served to an outside trainer: many sessions over one runner.

    ``learners``: the seats the trainer plays (default: the first seat). ``agents``: who
    plays the other seats, as ``parley run --agents`` (a list in seat order over the
    non-learner seats, or a mapping seat -> spec; ``scripted`` where none is given).
    ``turn_timeout``: seconds an agent may take for one action, the trainer included
    (an abandoned episode fails after it and frees its seats). ``max_sessions``: sessions
    open at once (also the runner's concurrency, which sizes its bus bounds). ``seed``:
    scenario seeds of ``reset()`` without one derive from it. ``listen``/``insecure``: the
    bus address remote agents (``remote`` specs) join, as ``parley run --listen``.
    Use as an async context manager (it opens the runner's bus).
    """

    def __init__(
        self,
        scenario: str,
        *,
        learners: Sequence[str] | None = None,
        agents: Sequence[str] | Mapping[str, str] | None = None,
        scenario_kwargs: Mapping[str, Any] | None = None,
        agent_options: Mapping[str, Any] | None = None,
        max_sessions: int = 64,
        turn_timeout: float = 600.0,
        max_steps: int = 10_000,
        seed: int = 0,
        listen: str = "",
        insecure: bool = False,
    ) -> None:
        if max_sessions < 1:
            raise ConfigError(f"max_sessions must be 1 or more, got {max_sessions}")
        probe = make(scenario, **dict(scenario_kwargs or {}))
        self.seats: list[str] = list(probe.possible_agents)
        prompt = getattr(probe, "system_prompt", None)
        self._system = {seat: str(prompt(seat)) if callable(prompt) else "" for seat in self.seats}
        probe.close()
        self.learners = list(learners) if learners else self.seats[:1]
        unknown = [seat for seat in self.learners if seat not in self.seats]
        if unknown or len(set(self.learners)) != len(self.learners):
            raise ConfigError(
                f"learner seats {self.learners} are not distinct seats of {scenario}; "
                f"its seats are {self.seats}"
            )
        others = [seat for seat in self.seats if seat not in self.learners]
        specs = _other_specs(scenario, agents, others)
        specs.update(dict.fromkeys(self.learners, LEARNER_SPEC))
        self.scenario = scenario
        self.max_sessions = max_sessions
        self.seed = seed
        self.config = RunConfig(
            scenario=scenario,
            scenario_kwargs=dict(scenario_kwargs or {}),
            agents=specs,
            episodes=1,
            concurrency=max_sessions,
            act_timeout=turn_timeout,
            max_steps=max_steps,
            agent_options=dict(agent_options or {}),
            progress=False,
            listen=listen,
            insecure=insecure,
        )
        self._episodes: dict[int, LearnerSession] = {}
        trainer = dict.fromkeys(self.learners, lambda: _TrainerSeat(self._episodes))
        self.runner = Runner(self.config, agents=trainer)
        self._sessions: set[LearnerSession] = set()
        self._numbers = 0
        self._open = False

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[LearnerArena]:
        async with self.runner.open():
            self._open = True
            try:
                yield self
            finally:
                self._open = False
                for session in list(self._sessions):
                    await session.close()

    async def __aenter__(self) -> LearnerArena:
        self._context = self._opened()
        return await self._context.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self._context.__aexit__(*exc)

    @property
    def sessions(self) -> int:
        """Sessions open now."""
        return len(self._sessions)

    def session(self) -> LearnerSession:
        """A new session; :class:`LearnerError` ``capacity`` past ``max_sessions``."""
        if not self._open:
            raise LearnerError("closed", "the learner arena is not open (use `async with`)")
        if len(self._sessions) >= self.max_sessions:
            raise LearnerError(
                "capacity",
                f"{len(self._sessions)} sessions are open, the most this server holds "
                "(--max-sessions): close one or raise the limit",
            )
        session = LearnerSession(self)
        self._sessions.add(session)
        return session

    def _plan(self, session: LearnerSession, seed: int | None) -> EpisodePlan:
        """A new episode for ``session``: its number keys the learner seats' agents."""
        self._numbers += 1
        number = self._numbers
        if seed is None:
            seed = derive_seed(self.seed, _SCENARIO_SEED, number)
        seeds = {
            seat: number if seat in self.learners else derive_seed(seed, _AGENT_SEED, i)
            for i, seat in enumerate(self.seats)
        }
        self._episodes[number] = session
        return EpisodePlan(index=number, task=number, trial=0, seed=seed, agent_seeds=seeds)


def _other_specs(
    scenario: str, agents: Sequence[str] | Mapping[str, str] | None, others: list[str]
) -> dict[str, str]:
    """Spec of every non-learner seat from ``agents`` (list over ``others`` or mapping)."""
    if agents is None:
        return dict.fromkeys(others, "scripted")
    if isinstance(agents, Mapping):
        unknown = sorted(set(agents) - set(others))
        if unknown:
            raise ConfigError(
                f"--agents names {unknown}, which are not seats parley plays in {scenario} "
                f"(those are {others}; the learner seats are the trainer's)"
            )
        return {seat: agents.get(seat, "scripted") for seat in others}
    if len(agents) != len(others):
        raise ConfigError(
            f"{scenario}: parley plays seats {others}; got {len(agents)} agent specs "
            "(give one per seat parley plays, in that order)"
        )
    return dict(zip(others, agents, strict=True))


class LearnerSession:
    """One trainer-side stream of episodes (see the module docstring)."""

    def __init__(self, arena: LearnerArena) -> None:
        self._arena = arena
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[EpisodeRecord] | None = None
        self._number = 0
        self._episode = ""
        self._pending: dict[str, tuple[Observation, asyncio.Future[str]]] = {}
        self._wake = asyncio.Event()
        self._chats: dict[str, list[dict[str, str]]] = {}
        self._reported: dict[str, float] = {}
        self._current = ""  # the seat shown last, that step() answers
        self._last: LearnerTurn | None = None
        self._busy = False
        self._closed = False
        self.steps = 0

    # ---------------------------------------------------------------- trainer side

    async def reset(self, seed: int | None = None) -> LearnerTurn:
        """End any episode in progress and start one (``seed``: the scenario's reset seed;
        None derives one); returns the first learner turn (or the end, if no learner
        seat ever acts)."""
        if seed is not None and (type(seed) is not int or seed < 0):
            raise LearnerError("bad_action", f"seed must be a non-negative integer, got {seed!r}")
        with self._exclusive():
            await self._stop()
            arena = self._arena
            plan = arena._plan(self, seed)
            self._number, self._episode = plan.index, plan.episode_id
            self._chats = {seat: [] for seat in arena.learners}
            self._reported = dict.fromkeys(arena.learners, 0.0)
            self._current, self.steps, self._last = "", 0, None
            self._task = asyncio.ensure_future(arena.runner.play(plan))
            self._task.add_done_callback(functools.partial(self._ended, plan.index))
            return await self._next_turn()

    async def step(self, text: str, seat: str = "") -> LearnerTurn:
        """Play ``text`` as the action of the seat of the last turn; returns the next turn."""
        with self._exclusive():
            if self._task is None:
                raise LearnerError("no_episode", "no episode is running: call reset first")
            if not self._current:
                raise LearnerError(
                    "episode_over",
                    f"episode {self._episode} is over (done was true): call reset to start another",
                )
            if not isinstance(text, str):
                raise LearnerError("bad_action", f"an action is text, got {type(text).__name__}")
            if seat and seat != self._current:
                if seat not in self._arena.learners:
                    raise LearnerError(
                        "unknown_seat",
                        f"{seat!r} is not a learner seat of {self._arena.scenario}; the "
                        f"trainer plays {self._arena.learners}",
                    )
                raise LearnerError(
                    "not_your_turn",
                    f"seat {self._current!r} acts now, not {seat!r}: answer the observation "
                    "the last turn showed",
                )
            pending = self._pending.pop(self._current, None)
            self._chats[self._current].append({"role": "assistant", "content": text})
            self.steps += 1
            # No pending answer: the episode failed meanwhile (this seat's turn timed out,
            # another seat failed), and the next turn is its end, with the reason.
            if pending is not None and not pending[1].done():
                pending[1].set_result(text)
            return await self._next_turn()

    def state(self) -> dict[str, Any]:
        """The session's state for the trainer: no other seat's data."""
        last = self._last
        return {
            "episode_id": self._episode or None,
            "step_count": self.steps,
            "scenario": self._arena.scenario,
            "learners": list(self._arena.learners),
            "seat": self._current,
            "done": bool(last and last.done),
            "failed": last.failed if last else "",
        }

    async def close(self) -> None:
        """End the episode in progress and free the session's slot. Idempotent."""
        self._closed = True
        await self._stop()
        self._arena._sessions.discard(self)

    def close_threadsafe(self) -> None:
        """:meth:`close` from another thread (OpenEnv closes environments in executors)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.close()))

    # ---------------------------------------------------------------- machinery

    @contextlib.contextmanager
    def _exclusive(self) -> Any:
        if self._closed:
            raise LearnerError("closed", "this session is closed: open a new one")
        if self._busy:
            raise LearnerError("busy", "a reset or step of this session is still running")
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    async def _ask(self, obs: Observation) -> Action:
        """The trainer's action for ``obs`` (called by the learner seat's agent)."""
        answer: asyncio.Future[str] = self._loop.create_future()
        self._pending[obs.agent] = (obs, answer)
        self._wake.set()
        try:
            text = await answer
        finally:
            pending = self._pending.get(obs.agent)
            if pending is not None and pending[1] is answer:
                del self._pending[obs.agent]
        return Action(agent=obs.agent, text=text)

    def _ended(self, number: int, task: asyncio.Task[EpisodeRecord]) -> None:
        self._arena._episodes.pop(number, None)
        self._wake.set()

    async def _next_turn(self) -> LearnerTurn:
        """Wait until a learner seat must act or the episode is over; the turn to show."""
        task = self._task
        assert task is not None  # (reset made it)
        while not self._pending and not task.done():
            self._wake.clear()
            await self._wake.wait()
        if self._pending:
            seat = next(s for s in self._arena.learners if s in self._pending)
            turn = self._turn(seat, self._pending[seat][0])
        else:
            turn = self._final(task)
        self._last = turn
        return turn

    def _turn(self, seat: str, obs: Observation) -> LearnerTurn:
        chat = self._chats[seat]
        chat.append({"role": "user", "content": obs.text})
        system = str(obs.info.get("system_prompt") or self._arena._system.get(seat, ""))
        messages = ([{"role": "system", "content": system}] if system else []) + [*chat]
        reward = float(obs.reward)
        self._reported[seat] += reward
        self._current = seat
        info = {key: value for key, value in obs.info.items() if key not in _PRIVATE_INFO}
        return LearnerTurn(
            episode=self._episode,
            seat=seat,
            text=obs.text,
            messages=messages,
            info=info,
            reward=reward,
            steps=self.steps,
        )

    def _final(self, task: asyncio.Task[EpisodeRecord]) -> LearnerTurn:
        self._current = ""
        turn = LearnerTurn(episode=self._episode, done=True, steps=self.steps, reward=None)
        if task.cancelled():
            turn.failed = "cancelled: the episode was stopped"
            return turn
        error = task.exception()
        if error is not None:  # the runner itself failed (its bus): still a reason
            turn.failed = f"arena_error: {type(error).__name__}: {error}"
            return turn
        record = task.result()
        if record.failed:
            turn.failed = record.failed
            return turn
        learners = self._arena.learners
        trajectories = {t.agent: t for t in record.trajectories if t.agent in learners}
        turn.returns = {seat: float(trajectories[seat].reward) for seat in learners}
        turn.components = {seat: dict(trajectories[seat].components) for seat in learners}
        turn.metrics = dict(record.metrics)
        turn.reward = sum(turn.returns[seat] - self._reported[seat] for seat in learners)
        return turn

    async def _stop(self) -> None:
        """Cancel the episode in progress, if any, and wait for it to unwind."""
        task, self._task = self._task, None
        self._pending.clear()
        self._current = ""
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
