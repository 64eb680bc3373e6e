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
  ``act`` is then cancelled).

:meth:`DirectAgents.ask_all` asks several seats at once, as the pipelined runner does over
the bus: every ``act`` runs to its first suspension before any is awaited.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Sequence
from typing import Any, cast

import msgspec

from parley.agents.base import Agent
from parley.arena.run.agent_host import AgentHost
from parley.arena.run.gather import _drive
from parley.protocols.codec import Codec
from parley.protocols.errors import ProtocolError, RemoteError, RequestTimeout
from parley.protocols.messages import Action, AnyBody, Body, Envelope, Observation

__all__ = ["DirectAgents"]

log = logging.getLogger("parley.arena.run")

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

    def _returned(
        self, returned: Any, obs: Observation, agent: Agent, episode: str
    ) -> Body | RemoteError:
        """The runner's decoded copy of what ``agent`` returned for ``obs``, or the bus's
        ``bad_message`` error for an action the wire cannot carry (the agent's failure)."""
        action = self.host.own(returned, obs, agent)
        text = action.text
        if (
            not action.tokens
            and type(text) is str
            and text.isascii()
            and len(text) < self._plain_limit
        ):
            # A plain ASCII action (no tokens) decodes as itself: its round trip, which
            # could not change it, is skipped.
            return action
        codec = self._codec
        try:
            envelope = Envelope(body=action, sender=self._name, episode=episode)
            frames = codec.encode(envelope)
        except ProtocolError as exc:
            # What an agent host over the bus answers when it cannot send its reply.
            message = f"reply not sendable: {exc.reason}"
            return RemoteError("bad_message", message, peer=self._name)
        return codec.decode(frames).body

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
    ) -> list[Body | BaseException]:
        """The reply (an action) or the error of each of ``observations``, in order.

        Every agent's ``act`` runs to its first suspension before any is awaited, as bus
        requests all go out first; the suspended ones then share ``timeout``. Cancellation
        cancels the ``act``s still running and propagates.
        """
        # A scripted agent that answers without suspending costs no task and no timer: its
        # act runs eagerly in the caller's task; only one that suspends is finished in a
        # task of its own.
        host = self.host
        results: list[Body | BaseException] = []
        waiting: list[tuple[int, Observation, Agent, asyncio.Task[Action]]] = []
        for obs in observations:
            try:
                seen = self._seen(obs, sender, episode)
            except ProtocolError as exc:
                results.append(exc)
                continue
            agent: Any = None
            try:
                agent = host.agent(episode, seen)
                act = agent.act(seen)
                if type(act) is not types.CoroutineType:
                    act = _await(act)  # not a coroutine: awaited as the bus's handler would
                yielded = act.send(None)
            except StopIteration as stop:
                try:
                    results.append(self._returned(stop.value, seen, agent, episode))
                except ProtocolError as exc:
                    results.append(exc)
                except Exception as exc:
                    results.append(self._failed(exc, sender))
            except Exception as exc:
                results.append(self._failed(exc, sender))
            else:
                task = asyncio.ensure_future(_resume(act, yielded))
                waiting.append((len(results), seen, agent, task))
                results.append(_PENDING)
        if waiting:
            await self._finish(waiting, results, timeout, episode, sender)
        return results

    async def _finish(
        self,
        waiting: list[tuple[int, Observation, Agent, asyncio.Task[Action]]],
        results: list[Body | BaseException],
        timeout: float,  # noqa: ASYNC109 -- what is left of the act timeout
        episode: str,
        sender: str,
    ) -> None:
        """Fill ``results`` with the outcome of each suspended ``act`` (see :meth:`ask_all`)."""
        tasks = {task for *_, task in waiting}
        try:
            await asyncio.wait(tasks, timeout=timeout)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()  # the episode was cancelled: so are the agents' acts
            raise
        for index, seen, agent, task in waiting:
            if not task.done():
                task.cancel()
                results[index] = RequestTimeout(
                    f"no reply from {self._name} ({seen.agent}) within {timeout:g} s"
                )
                continue
            error = task.exception()
            if error is not None:
                if not isinstance(error, Exception):
                    raise error
                results[index] = self._failed(error, sender)
                continue
            try:
                results[index] = self._returned(task.result(), seen, agent, episode)
            except ProtocolError as exc:
                results[index] = exc
            except Exception as exc:
                results[index] = self._failed(exc, sender)

    def _failed(self, exc: Exception, sender: str) -> RemoteError:
        message = f"{type(exc).__name__}: {exc}"
        log.warning("%s: handler for observation from %s failed: %s", self._name, sender, message)
        return RemoteError("handler_failed", message, peer=self._name)

    async def end(self, episode: str, seat: str, failed: str | None = None) -> None:
        """``episode`` is over for ``seat`` (``failed``: why it failed): its agent is closed
        and forgotten, as the bus's end-of-episode notice does."""
        await self.host.end(episode, seat, failed)

    async def close(self) -> None:
        """Close every agent still held."""
        await self.host.close()


_PENDING = RuntimeError("internal: request not finished")


async def _resume(act: Any, yielded: Any) -> Action:
    """Finish, in a task, an ``act`` that suspended at ``yielded`` outside one."""
    action = await _drive(act, yielded)
    return cast(Action, action)


async def _await(awaitable: Any) -> Action:
    """Await what an ``act`` returned that is not a coroutine (the error, if any, is
    Python's, as when the bus's handler awaits it)."""
    result: Action = await awaitable
    return result
