"""Agent hosting: a bus endpoint that answers each ``Observation`` with its agent's ``Action``.

The runner reaches remote agents through the bus: a remote agent (``parley agent --connect
... --seat ...``) is an :class:`AgentHost` on an endpoint of another process. In-process
agents live in the very same :class:`AgentHost`, which the runner calls directly
(:meth:`AgentHost.answer`, with the observation and action passed through the wire codec so
that the agent sees what a remote one would), or, with ``RunConfig.local_agents_over_bus``,
on an ``inproc://`` endpoint of the runner's process. One host serves any number of
concurrent episodes: it keeps one agent instance per ``(episode id, seat)``, created on the
first observation of that pair and reset with the seed the runner put in
``Observation.info["agent_seed"]``.

Batched frames (``RunConfig.batch_frames``): an ``ObservationBatch`` carries observations of
several episodes for the seats this host plays; each is answered as if it had come alone
(the same agent per episode and seat, the same ``Error`` for an agent that raises), all
together in one ``ActionBatch``, sent by the batch's ``timeout`` at the latest: an ``act``
still running then is cancelled and answered ``Error(timeout)`` (the arena fails that
episode, as it would have on its own timeout), so it cannot hold its batch-mates' actions
back. An action too big to send fails its own item (``bad_message``, ``reply not sendable``,
as a single reply does), not the whole reply (:func:`_fit_reply`). A host always takes both
kinds of request.

Episode end: the arena sends each seat it asked anything a one-way ``Observation`` with
``terminated`` (or ``truncated``) set; the host then closes the agent and forgets it (a
``close()`` that waits goes on in a task: no episode waits for it; the host's own close
waits :data:`CLOSE_GRACE_S` for those still running, then cancels them).
``info["failed"]`` holds the reason when the episode failed. An ``act`` still running then
(an agent that hung past the arena's timeout) is not cancelled over the bus: ``act`` runs
inside the bus's request handler, eagerly, so that a scripted agent answers without creating
a task; :meth:`Agent.close` should make it return, and closing the endpoint cancels it.
Called directly, an ``act`` past its timeout is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import Any, cast

import msgspec
import zmq

from parley.agents.base import Agent
from parley.arena.run.agent_specs import AgentFactory, remote_peer_name
from parley.arena.run.gather import _drive
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import BusError, ConfigError
from parley.protocols.messages import (
    Action,
    ActionBatch,
    Body,
    Envelope,
    Error,
    Observation,
    ObservationBatch,
)

__all__ = ["AgentHost", "AGENT_ACCEPTS", "AGENT_SEED_KEY", "ArenaLost", "FAILED_KEY", "join_arena"]

log = logging.getLogger(__name__)

AGENT_SEED_KEY = "agent_seed"
"""``Observation.info`` key with the seed the agent of this seat and episode resets with."""
FAILED_KEY = "failed"
"""``Observation.info`` key of an end-of-episode notice: why the episode failed."""
CLOSE_GRACE_S = 10.0
"""How long :meth:`AgentHost.close` waits for agents' ``close()`` calls still running; they
are then cancelled. An episode's end waits for none: an agent whose ``close()`` hangs holds
neither its episode nor any other (it did, run in-process, for ever)."""


class AgentHost:
    """Plays the seats in ``factories`` for every episode that asks, on ``endpoint``.

    Registers an ``Observation`` handler on ``endpoint`` at construction (none without
    one: the owner calls :meth:`answer` and :meth:`end`); the endpoint's owner binds or
    connects it. An agent that raises makes the request answer with an ``Error`` (the
    runner fails that episode); other episodes are unaffected.
    """

    def __init__(self, endpoint: Endpoint | None, factories: Mapping[str, AgentFactory]) -> None:
        self.endpoint = endpoint
        self._factories = dict(factories)
        self._agents: dict[tuple[str, str], Agent] = {}
        self._closing: set[asyncio.Future[Any]] = set()
        if endpoint is not None:
            endpoint.on(Observation, self._on_observation)
            endpoint.on(ObservationBatch, self._on_batch)

    @property
    def seats(self) -> list[str]:
        """The seats this host plays."""
        return sorted(self._factories)

    @property
    def live_agents(self) -> int:
        """Agent instances currently held (one per seat of each unfinished episode)."""
        return len(self._agents)

    async def _on_observation(self, envelope: Envelope) -> Body | None:
        obs = envelope.body
        if not isinstance(obs, Observation):  # the bus dispatches by type; be explicit
            raise TypeError(f"expected an observation, got {type(obs).__name__}")
        if obs.terminated or obs.truncated:
            failed = obs.info.get(FAILED_KEY)
            await self.end(envelope.episode, obs.agent, failed if isinstance(failed, str) else None)
            return None
        return await self.answer(envelope.episode, obs)

    async def _on_batch(self, envelope: Envelope) -> ActionBatch:
        batch = envelope.body
        if not isinstance(batch, ObservationBatch):  # (as _on_observation)
            raise TypeError(f"expected an observation batch, got {type(batch).__name__}")
        if len(batch.episodes) != len(batch.observations):
            raise ValueError(
                f"an observation batch needs one episode per observation, got "
                f"{len(batch.episodes)} for {len(batch.observations)}"
            )
        # Every act runs to its first suspension before any is awaited (no task each, as
        # the bus runs the handler of a single observation); the suspended ones get a task
        # and the batch's timeout, so that one agent that hangs fails its own item only.
        results: list[Action | Error] = []
        suspended: dict[asyncio.Task[Body], int] = {}
        for episode, obs in zip(batch.episodes, batch.observations, strict=True):
            act = self.answer(episode, obs)
            try:
                yielded = act.send(None)
            except StopIteration as stop:
                results.append(self._result(stop.value, envelope))
            except Exception as exc:
                results.append(self._result(exc, envelope))
            else:
                suspended[asyncio.ensure_future(_resume(act, yielded))] = len(results)
                results.append(_LATE)
        if suspended:
            await self._finish(suspended, results, batch.timeout or None, envelope)
        if self.endpoint is not None:
            _fit_reply(results, self.endpoint.config.max_message_bytes)
        return ActionBatch(results=results)

    async def _finish(
        self,
        suspended: dict[asyncio.Task[Body], int],
        results: list[Action | Error],
        timeout: float | None,  # noqa: ASYNC109 -- the batch's, from the arena
        envelope: Envelope,
    ) -> None:
        """Fill ``results`` with the outcome of each suspended act; one still running after
        ``timeout`` is cancelled and answered as timed out (the arena fails its episode)."""
        try:
            done, late = await asyncio.wait(suspended, timeout=timeout)
        except asyncio.CancelledError:  # the endpoint is closing: so are the acts
            for task in suspended:
                task.cancel()
            raise
        for task in late:
            task.cancel()
            message = f"no action within the batch's {timeout:g} s"
            results[suspended[task]] = Error(code="timeout", message=message)
        for task in done:
            error = task.exception()
            outcome = task.result() if error is None else error
            results[suspended[task]] = self._result(outcome, envelope)

    @staticmethod
    def _result(result: Body | BaseException, envelope: Envelope) -> Action | Error:
        """One item of an ``ActionBatch``: the action, or the ``Error`` the bus answers a
        single observation with when its handler raised (the same code and message)."""
        if isinstance(result, Action):
            return result
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # (cancellation, KeyboardInterrupt: not the agent's failure)
        if not isinstance(result, Exception):  # (answer() gives actions only)
            result = TypeError(f"expected an Action, got {type(result).__name__}")
        message = f"{type(result).__name__}: {result}"
        log.warning("handler for observations from %s failed: %s", envelope.sender, message)
        return Error(code="handler_failed", message=message)

    async def answer(self, episode: str, obs: Observation) -> Action:
        """The action of ``obs.agent``'s agent in ``episode`` (made on first use)."""
        agent = self.agent(episode, obs)
        return self.own(await agent.act(obs), obs, agent)

    def agent(self, episode: str, obs: Observation) -> Agent:
        """The agent of ``obs.agent`` in ``episode``, made and reset on first use."""
        key = (episode, obs.agent)
        agent = self._agents.get(key)
        if agent is None:
            agent = self._new_agent(obs)
            self._agents[key] = agent
        return agent

    @staticmethod
    def own(action: Any, obs: Observation, agent: Agent) -> Action:
        """``action`` (what ``agent`` returned for ``obs``) checked, in ``obs``'s seat."""
        if not isinstance(action, Action):
            raise TypeError(
                f"{type(agent).__name__}.act returned {type(action).__name__}, not an Action"
            )
        # The seat is the runner's to name; an agent may leave ``agent`` empty or stale.
        if type(action) is Action and action.agent == obs.agent:
            return action  # as the runner would rebuild it: no copy
        return Action(agent=obs.agent, text=action.text, tokens=action.tokens)

    def _new_agent(self, obs: Observation) -> Agent:
        factory = self._factories.get(obs.agent)
        if factory is None:
            raise ConfigError(
                f"this agent host plays seats {self.seats}, not {obs.agent!r}; "
                f"start one with --seat {obs.agent}"
            )
        agent = factory()
        seed = obs.info.get(AGENT_SEED_KEY)
        agent.reset(seed if isinstance(seed, int) else None)
        return agent

    async def end(self, episode: str, seat: str, failed: str | None = None) -> None:
        """``episode`` is over for ``seat``: close its agent and forget it. ``failed`` is
        the reason when the episode failed (logged at debug level; the agent is closed the
        same way)."""
        self.end_now(episode, seat, failed)

    def end_now(self, episode: str, seat: str, failed: str | None = None) -> None:
        """:meth:`end`, from a caller on the event loop that need not await it (the runner's
        in-process seats: no coroutine per seat and episode)."""
        if failed:
            log.debug("episode %s failed for seat %s: %s", episode, seat, failed)
        self._end((episode, seat))

    def _end(self, key: tuple[str, str]) -> None:
        agent = self._agents.pop(key, None)
        if agent is None:
            return
        # Run eagerly to its first suspension (most closes end there, with no task); one that
        # waits goes on in a task of its own, which close() waits for.
        closing = _close_agent(agent, key)
        try:
            yielded = closing.send(None)
        except StopIteration:
            return
        task = asyncio.ensure_future(_drive(cast(Coroutine[Any, Any, Body], closing), yielded))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every agent still held, and wait up to :data:`CLOSE_GRACE_S` for the
        ``close()`` calls still running (the endpoint's owner closes the endpoint)."""
        for key in list(self._agents):
            self._end(key)
        if not self._closing:
            return
        _, hung = await asyncio.wait(set(self._closing), timeout=CLOSE_GRACE_S)
        for task in hung:
            task.cancel()
        if hung:
            log.warning(
                "%d agent close() call(s) still running after %.0f s were cancelled",
                len(hung), CLOSE_GRACE_S,
            )  # fmt: skip
            await asyncio.wait(hung, timeout=1.0)  # (one that ignores its cancel is left)


_ENVELOPE_ROOM = 4096
"""Bytes of a reply's limit kept for its envelope and the batch's own framing."""


def _fit_reply(results: list[Action | Error], limit: int) -> None:
    """Make an :class:`ActionBatch` of ``results`` sendable within ``limit`` bytes by
    failing only the actions that do not fit: one over the limit alone gets the
    ``bad_message`` error a single reply gets (``reply not sendable``); then, while the
    batch is still too big, the largest action left. The whole reply failed before, and
    every batch-mate's episode with it."""
    room = limit - _ENVELOPE_ROOM
    bound = 0  # an upper bound of the encoded size, without encoding (the usual case)
    for item in results:
        if isinstance(item, Action):
            bound += 4 * len(item.text) + 64 + 4 * len(item.agent)
            for record in item.tokens:
                ids = len(record.prompt_token_ids) + len(record.token_ids)
                bound += 5 * ids + 9 * len(record.logprobs) + 4 * len(record.policy) + 64
        else:
            bound += 4 * len(item.message) + 64
    if bound <= room:
        return
    sizes = {i: len(msgspec.msgpack.encode(item)) for i, item in enumerate(results)}
    total = sum(sizes.values())
    order = sorted(sizes, key=sizes.__getitem__, reverse=True)
    for i in order:
        if total <= room and sizes[i] <= room:
            break
        if not isinstance(results[i], Action):
            continue
        if sizes[i] > room:  # (the codec's words for a single reply)
            reason = (
                f"message of {sizes[i]} bytes exceeds the limit of {limit}; send large "
                "payloads by path or raise max_message_bytes on both ends"
            )
        else:
            reason = (
                f"action of {sizes[i]} bytes does not fit in its batch's reply (limit {limit}): "
                "raise max_message_bytes or play without batch_frames"
            )
        results[i] = Error(code="bad_message", message=f"reply not sendable: {reason}")
        total += len(msgspec.msgpack.encode(results[i])) - sizes[i]


async def _close_agent(agent: Agent, key: tuple[str, str]) -> None:
    try:
        await agent.close()
    except Exception as exc:  # the episode is over: an agent's failing close is its bug
        log.warning("closing the agent of seat %s, episode %s failed: %r", key[1], key[0], exc)


_LATE = Error(code="internal", message="not finished")  # (replaced before any reply)


async def _resume(act: Any, yielded: Any) -> Body:
    """Finish, in a task, an ``act`` that suspended at ``yielded`` outside one."""
    body: Body = await _drive(act, yielded)
    return body


AGENT_ACCEPTS = frozenset({"observation", "observations"})
"""What an agent host's endpoint decodes from the arena besides the session kinds."""


REJOIN_WINDOW = 60.0
"""Default seconds a joined agent waits for an arena it lost (not one that said goodbye)."""


async def join_arena(
    address: str,
    seats: Mapping[str, AgentFactory],
    *,
    names: Mapping[str, str] | None = None,
    bus: BusConfig | None = None,
    context: zmq.Context[Any] | None = None,
    connect_timeout: float | None = None,
    rejoin_window: float = REJOIN_WINDOW,
    poll_interval: float = 0.2,
) -> None:
    """Play ``seats`` in the arena bound at ``address`` until the arena says goodbye.

    Seats are served by endpoints named ``names[seat]``, or ``agent-SEAT`` (the name the
    runner waits for with a plain ``remote`` spec); seats given the same name share one
    endpoint (match them with ``remote:NAME`` specs). Each endpoint serves every episode of
    its seats. Returns when the arena has closed (it said ``Bye``). An arena lost otherwise
    (its connection closed: it died or restarted; or silent past the bus's ``peer_timeout``)
    is waited for up to ``rejoin_window`` seconds: the bus says ``Hello`` again by itself
    when it is back, and play goes on. Raises :class:`ArenaLost` when it is not back in
    time, :class:`~parley.protocols.errors.RequestTimeout` when no arena answers within
    ``connect_timeout`` seconds at first.
    """
    if not rejoin_window >= 0:  # (NaN fails every comparison)
        raise ConfigError(f"rejoin_window must be 0 or more seconds, got {rejoin_window}")
    # An arena sends observations only: nothing else it sends is decoded (section 4 of
    # PROTOCOL.md). (An observation's info is any MessagePack value: an agent trusts the
    # arena it joins that far.)
    bus = (bus or BusConfig()).accepting(AGENT_ACCEPTS)
    groups: dict[str, dict[str, AgentFactory]] = {}
    for seat, factory in seats.items():
        name = (names or {}).get(seat, remote_peer_name(seat))
        groups.setdefault(name, {})[seat] = factory
    joined: list[tuple[Endpoint, AgentHost, str]] = []
    try:
        for name, factories in groups.items():
            endpoint = Endpoint(name, config=bus, context=context)
            host = AgentHost(endpoint, factories)
            joined.append((endpoint, host, ""))
            arena = await endpoint.connect(address, timeout=connect_timeout)
            joined[-1] = (endpoint, host, arena)
        await _play_until_goodbye(address, joined, rejoin_window, poll_interval)
    finally:
        # The endpoint first: it says Bye and cancels the acts in flight, so that no agent
        # closed under a running act answers the arena with an error (a replica stopped by
        # SIGTERM must cost no episode: its sessions move to another replica).
        for endpoint, host, _ in joined:
            await endpoint.close()
            await host.close()


class ArenaLost(BusError):
    """The arena went away without saying goodbye and did not come back in time."""


async def _play_until_goodbye(
    address: str, joined: list[tuple[Endpoint, AgentHost, str]], window: float, poll: float
) -> None:
    loop = asyncio.get_running_loop()
    lost_at: float | None = None
    # The bus has no "peer left" event to await; polling its peer list is cheap enough.
    while True:
        if any(endpoint.farewell(arena) is not None for endpoint, _, arena in joined):
            return
        if all(arena in endpoint.peers for endpoint, _, arena in joined):
            if lost_at is not None:
                log.warning("the arena at %s is back after %.1f s", address, loop.time() - lost_at)
            lost_at = None
        elif lost_at is None:
            lost_at = loop.time()
            log.warning("lost the arena at %s; waiting up to %g s for it", address, window)
        elif loop.time() - lost_at > window:
            raise ArenaLost(
                f"lost the arena at {address} (no goodbye) and it did not come back within "
                f"{window:g} s; raise --rejoin-window to wait longer"
            )
        await asyncio.sleep(poll)
