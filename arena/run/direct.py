"""In-process agents called directly: the bus's semantics without its hops.

An agent in the runner's own process needs no socket, heartbeat, timer or receive loop to
be asked for an action. :class:`DirectAgents` calls the run's
:class:`~parley.arena.run.agent_host.AgentHost` itself, and keeps what the bus would do to
the messages and the failures, so in-process and remote agents stay interchangeable and
transcripts identical:

- the observation and the action pass through the wire codec (an agent sees exactly the
  decoded copy a remote agent would get; a value the wire cannot carry is a
  ``ProtocolError``, as over the bus); a plain action (ASCII text, no tokens) skips the
  round trip, which could not change it;
- an agent that raises is a :class:`RemoteError` ``handler_failed`` with the message the
  bus sends, logged the same way;
- an agent that does not answer within the timeout is a :class:`RequestTimeout` (its
  ``act`` is then cancelled).

A scripted agent that answers without suspending costs no task and no timer: ``act`` runs
eagerly in the episode's task; only one that suspends is finished in a task of its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from parley.arena.run.agent_host import AgentHost
from parley.arena.run.gather import _drive
from parley.protocols.codec import Codec
from parley.protocols.errors import RemoteError, RequestTimeout
from parley.protocols.messages import Action, AnyBody, Body, Envelope, Observation

__all__ = ["DirectAgents"]

log = logging.getLogger("parley.arena.run")


class DirectAgents:
    """Asks the agents of ``host`` for actions without the bus (see the module docstring)."""

    def __init__(self, host: AgentHost, codec: Codec, *, name: str) -> None:
        self.host = host
        self._codec = codec
        self._name = name  # the bus name this host would have, for messages
        self.seats = frozenset(host.seats)
        self._plain_limit = codec.max_message_bytes // 2  # well within one message

    def _wire(self, body: Body, sender: str, episode: str) -> Body:
        """``body`` as the receiving end of the bus would decode it."""
        codec = self._codec
        envelope = Envelope(body=cast("AnyBody", body), sender=sender, episode=episode)
        return codec.decode(codec.encode(envelope)).body

    async def request(
        self,
        obs: Observation,
        *,
        timeout: float,  # noqa: ASYNC109 -- the act timeout, as for a bus request
        episode: str,
        sender: str,
    ) -> Body:
        """The action of ``obs.agent`` in ``episode``, or the bus's error for its failure."""
        seen = self._wire(obs, sender, episode)
        assert isinstance(seen, Observation)  # the codec decodes the type it was given
        coro = self.host.answer(episode, seen)
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            action: Any = stop.value
        except Exception as exc:
            raise self._failed(exc, sender) from exc
        else:
            task = asyncio.ensure_future(_finish(coro, yielded))
            try:
                done, _ = await asyncio.wait({task}, timeout=timeout)
            except asyncio.CancelledError:
                task.cancel()  # the episode was cancelled: so is the agent's act
                raise
            if not done:
                task.cancel()
                raise RequestTimeout(
                    f"no reply from {self._name} ({obs.agent}) within {timeout:g} s"
                )
            error = task.exception()
            if error is not None:
                if not isinstance(error, Exception):
                    raise error
                raise self._failed(error, sender) from error
            action = task.result()
        if (
            type(action) is Action
            and not action.tokens
            and type(action.text) is str
            and action.text.isascii()
            and len(action.text) < self._plain_limit
        ):
            # A plain ASCII action decodes as itself: the round trip would change nothing.
            return action
        return self._wire(action, self._name, episode)

    def _failed(self, exc: Exception, sender: str) -> RemoteError:
        message = f"{type(exc).__name__}: {exc}"
        log.warning("%s: handler for observation from %s failed: %s", self._name, sender, message)
        return RemoteError("handler_failed", message, peer=self._name)

    async def end(self, episode: str, seat: str) -> None:
        """``episode`` is over for ``seat``: its agent is closed and forgotten."""
        await self.host.end(episode, seat)

    async def close(self) -> None:
        """Close every agent still held."""
        await self.host.close()


async def _finish(coro: Any, yielded: Any) -> Body:
    """Finish, in a task, a coroutine that suspended at ``yielded`` outside one."""
    result: Body = await _drive(coro, yielded)
    return result
