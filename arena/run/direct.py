"""In-process agents called directly: the bus's semantics without its hops.

An agent in the runner's own process needs no socket, heartbeat, timer or receive loop to
be asked for an action. :class:`DirectAgents` calls the agents of the run's
:class:`~parley.arena.run.agent_host.AgentHost` itself (the runner reaches it through
:class:`~parley.arena.run.seats.InProcessSeats`), and keeps what the bus would do to the
messages and the failures, so in-process and remote agents stay interchangeable and
transcripts identical:

- an agent sees exactly the decoded copy of its observation a remote agent would get, and
  the runner gets the decoded copy of the action. An observation the wire cannot carry is a
  ``ProtocolError`` (no agent sees it), an action it cannot carry a :class:`RemoteError`
  ``bad_message`` ("reply not sendable"), as over the bus;
- an agent that raises, or returns something other than an ``Action``, is a
  :class:`RemoteError` ``handler_failed`` with the message the bus sends, logged the same way;
- an agent that does not answer within the timeout is a :class:`RequestTimeout` (its
  ``act`` is then cancelled); time past it that the loop stood still (the process stopped,
  another agent blocking it) is given back first, as the bus does.

:meth:`DirectAgents.ask_all` asks several seats at once, as the pipelined runner does over
the bus: every ``act`` runs to its first suspension before any is awaited.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, cast

import msgspec

from parley.agents.base import Agent
from parley.arena.run.agent_host import AGENT_SEED_KEY, AgentHost
from parley.arena.run.gather import _drive
from parley.protocols.bus.requests import LATE_S
from parley.protocols.codec import Codec
from parley.protocols.errors import ProtocolError, RemoteError, RequestTimeout
from parley.protocols.messages import Action, AnyBody, Body, Envelope, Observation

__all__ = ["DirectAgents"]

log = logging.getLogger("parley.arena.run")

Waiting = list[tuple[int, Observation, "asyncio.Task[None]"]]
"""The acts :meth:`DirectAgents.start_all` left suspended: each one's index in the results,
its observation and the task finishing it (:meth:`DirectAgents.finish` waits for them)."""

# What encoding a value outside the closed protocol may raise: the codec then decides.
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)
_DECODE_ERRORS = (msgspec.DecodeError, ValueError, TypeError, RecursionError)


class DirectAgents:
    """Asks the agents of ``host`` for actions without the bus (see the module docstring)."""

    def __init__(self, host: AgentHost, codec: Codec, *, name: str) -> None:
        self.host = host
        self._codec = codec
        self._name = name  # the bus name this host would have, for messages
        self.seats = frozenset(host.seats)
        # Room for the envelope around a body (sender, episode, ids, keys).
        self._plain_limit = codec.max_message_bytes - 1024
        self._encode = msgspec.msgpack.Encoder().encode  # no hook: builtin types only
        self._decode = msgspec.msgpack.Decoder(Observation).decode
        self._decode_all = msgspec.msgpack.Decoder(list[Observation]).decode
        # Each episode's agents by seat, as the host made them: one lookup per seat and step
        # without the host's (episode, seat) key; forgotten when the host ends them.
        self._held: dict[str, dict[str, Agent]] = {}

    def _wire(self, body: Body, sender: str, episode: str) -> Body:
        """``body`` as the receiving end of the bus would decode it."""
        codec = self._codec
        envelope = Envelope(body=cast("AnyBody", body), sender=sender, episode=episode)
        return codec.decode(codec.encode(envelope)).body

    def _seen(self, obs: Observation, sender: str, episode: str) -> Observation:
        """``obs`` as its agent would receive it over the bus (a copy; never ``obs``)."""
        # The common case costs one msgpack round trip of the body alone, without the
        # envelope (~1.1 µs for a small observation against ~1.5 µs through the codec,
        # measured); a body the plain encoder refuses (arrays, foreign types), one that is
        # near the size limit or one that does not decode back takes the full codec, which
        # names the problem.
        try:
            data = self._encode(obs)
        except _ENCODE_ERRORS:
            data = b""
        if data and len(data) + len(sender) + len(episode) <= self._plain_limit:
            try:  # (a try, not contextlib.suppress: that builds an object per observation)
                return self._decode(data)
            except _DECODE_ERRORS:
                pass  # the codec below names what is wrong
        seen = self._wire(obs, sender, episode)
        assert isinstance(seen, Observation)  # the codec decodes the type it was given
        return seen

    def _seen_all(
        self,
        observations: Sequence[Observation],
        sender: str,
        episode: str,
        seeds: Mapping[str, int] | None,
    ) -> list[Observation] | list[Observation | ProtocolError]:
        """What :meth:`_seen` gives for each of ``observations`` (with its seat's seed in
        ``info``, when ``seeds`` is given; the ``ProtocolError`` of one the wire cannot
        carry, in its place), in order."""
        # A step's observations are copied in one msgpack round trip of their list (one
        # encode and one decode per step instead of per seat): each of them is smaller than
        # the list, so a list within the size limit has every observation within it. The
        # seeds are put in the copies, where they land as they would inside the message (a
        # key set last, or in its place if the info had it), with room left for them in the
        # size. A list the plain encoder refuses, one over the limit or one that does not
        # decode back is copied observation by observation, where the codec names what is
        # wrong.
        room = len(sender) + len(episode)
        if seeds is not None:
            room += _SEED_ROOM * len(observations)
        try:
            data = self._encode(observations)
        except _ENCODE_ERRORS:
            data = b""
        if data and len(data) + room <= self._plain_limit:
            try:
                copies = self._decode_all(data)
            except _DECODE_ERRORS:
                pass  # each observation's own copy below says which one is wrong
            else:
                if seeds is not None:
                    for seen in copies:
                        seen.info[AGENT_SEED_KEY] = seeds[seen.agent]
                return copies
        if seeds is not None:
            observations = with_seeds(observations, seeds)
        each: list[Observation | ProtocolError] = []
        for obs in observations:
            try:
                each.append(self._seen(obs, sender, episode))
            except ProtocolError as exc:
                each.append(exc)
        return each

    def _returned(
        self, returned: Any, obs: Observation, agent: Agent, episode: str
    ) -> Body | RemoteError:
        """The runner's decoded copy of what ``agent`` returned for ``obs``, or the bus's
        ``bad_message`` error for an action the wire cannot carry (the agent's failure).
        (:meth:`_act_all` keeps a plain action as it is without this call.)"""
        action = self.host.own(returned, obs, agent)
        codec = self._codec
        try:
            envelope = Envelope(body=action, sender=self._name, episode=episode)
            return codec.decode(codec.encode(envelope)).body
        except ProtocolError as exc:
            # What an agent host over the bus answers when it cannot send its reply; an
            # action that encodes but does not decode (a text that is no str) is the
            # agent's too, not the run's protocol error.
            message = f"reply not sendable: {exc.reason}"
            return RemoteError("bad_message", message, peer=self._name)

    async def request(
        self,
        obs: Observation,
        *,
        timeout: float,  # noqa: ASYNC109 -- the act timeout, as for a bus request
        episode: str,
        sender: str,
    ) -> Body:
        """The action of ``obs.agent`` in ``episode``, or the bus's error for its failure."""
        result = (await self.ask_all([obs], timeout=timeout, episode=episode, sender=sender))[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def ask_all(
        self,
        observations: Sequence[Observation],
        *,
        timeout: float,  # noqa: ASYNC109 -- the act timeout, as for bus requests
        episode: str,
        sender: str,
        seeds: Mapping[str, int] | None = None,
    ) -> list[Body | BaseException]:
        """The reply (an action) or the error of each of ``observations``, in order.

        Every agent's ``act`` runs to its first suspension before any is awaited, as bus
        requests all go out first; the suspended ones then share ``timeout``. Cancellation
        cancels the ``act``s still running and propagates. ``seeds`` (seat -> agent seed,
        ints msgpack carries) are for observations built without them: each agent sees its
        seat's seed in ``info[AGENT_SEED_KEY]`` as if it had been sent there
        (:func:`with_seeds`), without a dict merged, encoded and decoded per seat.
        """
        results, waiting = self.start_all(observations, episode=episode, sender=sender, seeds=seeds)
        if waiting:
            await self.finish(waiting, results, timeout)
        return results

    def start_all(
        self,
        observations: Sequence[Observation],
        *,
        episode: str,
        sender: str,
        seeds: Mapping[str, int] | None = None,
    ) -> tuple[list[Body | BaseException], Waiting]:
        """:meth:`ask_all` up to its first wait, on the caller's thread: every ``act`` run
        to its first suspension. Returns the results (those of the acts that suspended
        still pending) and those acts, which :meth:`finish` waits for; none, usually (an
        agent that answers without suspending): then the results are every reply."""
        # The acts are awaited in turn by one coroutine (:meth:`_act_all`) that this call
        # drives itself: scripted agents that answer without suspending cost no task, no
        # timer and no StopIteration each (one per step). When an act suspends, that
        # coroutine is left to finish it alone in a task (its slot, the first one still
        # pending, is marked detached: it stops after that act) and a new one goes on from
        # the next seat, so every act still starts before any is awaited.
        seen = self._seen_all(observations, sender, episode, seeds)
        count = len(seen)
        results: list[Body | BaseException] = [_PENDING] * count
        waiting: Waiting = []
        start = 0
        while start < count:
            acts = self._act_all(seen, results, start, episode, sender)
            try:
                yielded = acts.send(None)
            except StopIteration:
                break  # every act from ``start`` on answered at once: the usual step
            # Its act is the first without a result (those before it have theirs).
            at = next(i for i in range(start, count) if results[i] is _PENDING)
            results[at] = _DETACHED
            waiting.append((at, cast(Observation, seen[at]), _finish_in_task(acts, yielded)))
            start = at + 1
        return results, waiting

    async def _act_all(
        self,
        seen: Sequence[Observation | ProtocolError],
        results: list[Body | BaseException],
        start: int,
        episode: str,
        sender: str,
    ) -> None:
        """Await the ``act`` of each of ``seen`` from ``start`` on, each outcome into
        ``results`` (see :meth:`ask_all`); stop after an act whose slot was marked
        :data:`_DETACHED` while it was suspended."""
        host, limit = self.host, self._plain_limit
        held = self._held.get(episode)
        if held is None:
            held = self._held[episode] = {}
        for index in range(start, len(seen)):
            obs = seen[index]
            if type(obs) is not Observation:  # the wire cannot carry it: no agent sees it
                results[index] = cast(ProtocolError, obs)
                continue
            result: Body | BaseException
            try:
                agent = held.get(obs.agent)
                if agent is None:
                    agent = held[obs.agent] = host.agent(episode, obs)
                # (an act that returns no awaitable fails with Python's words, as when the
                # bus's handler awaits it)
                returned = await agent.act(obs)
            except Exception as exc:
                result = self._failed(exc, sender)
            except asyncio.CancelledError as exc:
                # The act's own CancelledError (no one cancels this act's task) is its
                # failure; a cancellation of the episode goes on.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                result = self._failed(exc, sender)
            else:
                if (
                    type(returned) is Action
                    and returned.agent == obs.agent
                    and not returned.tokens
                    and type(text := returned.text) is str
                    and text.isascii()
                    and len(text) < limit
                ):
                    # An Action in the seat is what AgentHost.own returns as it is, and a
                    # plain ASCII text without tokens decodes as itself: the round trip,
                    # which could not change it, is skipped (the usual answer).
                    result = returned
                else:
                    try:
                        result = self._returned(returned, obs, agent, episode)
                    except ProtocolError as exc:
                        result = exc
                    except Exception as exc:
                        result = self._failed(exc, sender)
            slot = results[index]
            if slot is _PENDING or slot is _DETACHED:
                results[index] = result
            if slot is not _PENDING:
                # Detached (ask_all went on without this pass), or timed out by finish and
                # outlived its cancel: this pass ends with its act (the results the runner
                # got stay as they are, and no later seat's act is called twice).
                return

    async def finish(
        self,
        waiting: Waiting,
        results: list[Body | BaseException],
        timeout: float,  # noqa: ASYNC109 -- what is left of the act timeout
    ) -> None:
        """Wait up to ``timeout`` for the acts that suspended (each task fills its own
        result); a request whose act is not done by then is a :class:`RequestTimeout`."""
        tasks = {task for *_, task in waiting}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            late = loop.time() - deadline
            if pending and late > LATE_S:
                # The loop stood still past the deadline (the process stopped or another
                # in-process agent blocked it): the acts still pending lost that time, as
                # the bus gives it back to requests (protocols.bus.requests).
                await asyncio.wait(pending, timeout=min(late, timeout))
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()  # the episode was cancelled: so are the agents' acts
            raise
        for index, seen, task in waiting:
            if not task.done():
                task.cancel()
                results[index] = RequestTimeout(
                    f"no reply from {self._name} ({seen.agent}) within {timeout:g} s"
                )
                continue
            if task.cancelled():  # (no one else cancels it: the act cancelled its own task)
                results[index] = self._failed(asyncio.CancelledError(), "the runner")
                continue
            error = task.exception()
            if error is not None:  # (what an act raises is its result: only BaseException)
                raise error

    def _failed(self, exc: BaseException, sender: str) -> RemoteError:
        try:
            message = f"{type(exc).__name__}: {exc}"
        except Exception:  # (an agent's exception whose str() raises is its failure)
            # (the class's own name: a metaclass may make __name__ raise too)
            name = _TYPE_NAME.__get__(type(exc), type)
            message = f"{name}: (its message could not be made)"
        log.warning("%s: handler for observation from %s failed: %s", self._name, sender, message)
        return RemoteError("handler_failed", message, peer=self._name)

    def end(self, episode: str, seat: str, failed: str | None = None) -> Coroutine[Any, Any, None]:
        """``episode`` is over for ``seat`` (``failed``: why it failed): its agent is closed
        and forgotten, as the bus's end-of-episode notice does (the host's coroutine, as it
        is: no coroutine of its own per seat and episode)."""
        self._forget(episode, seat)
        return self.host.end(episode, seat, failed)

    def end_now(self, episode: str, seat: str, failed: str | None = None) -> None:
        """:meth:`end`, done before it returns (on the event loop's thread: an agent whose
        ``close`` suspends finishes it in a task, which :meth:`close` waits for)."""
        self._forget(episode, seat)
        self.host.end_now(episode, seat, failed)

    def _forget(self, episode: str, seat: str) -> None:
        held = self._held.get(episode)
        if held is not None:
            held.pop(seat, None)
            if not held:
                del self._held[episode]

    async def close(self) -> None:
        """Close every agent still held."""
        self._held.clear()
        await self.host.close()


_TYPE_NAME = type.__dict__["__name__"]  # (a class's name as Python keeps it, no lookup)
_PENDING = RuntimeError("internal: request not finished")
_DETACHED = RuntimeError("internal: request finishing in a task")

_SEED_ROOM = 32
"""Bytes an agent seed adds to an observation's message, at most: its key, an int of up to
64 bits, a longer map header."""
_SEED_RANGE = range(-(2**63), 2**64)  # the ints msgpack carries


def seeds_carried(seeds: Mapping[str, int]) -> bool:
    """Whether every one of ``seeds`` is an int the wire carries (what ``ask_all`` takes)."""
    return all(type(seed) is int and seed in _SEED_RANGE for seed in seeds.values())


def with_seeds(observations: Sequence[Observation], seeds: Mapping[str, int]) -> list[Observation]:
    """``observations``, each with its seat's seed from ``seeds`` in ``info`` (the env's
    info with ``AGENT_SEED_KEY`` set, as the runner sends it)."""
    return [
        msgspec.structs.replace(obs, info={**obs.info, AGENT_SEED_KEY: seeds[obs.agent]})
        for obs in observations
    ]


def _finish_in_task(acts: Coroutine[Any, Any, None], yielded: Any) -> asyncio.Task[None]:
    """A task that drives ``acts``, suspended at ``yielded`` outside one, to its end."""

    async def finish() -> None:
        await _drive(cast("Coroutine[Any, Any, Body]", acts), yielded)

    return asyncio.ensure_future(finish())
