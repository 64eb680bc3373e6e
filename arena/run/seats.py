"""How the runner reaches a seat's agent: one interface, an in-process and a bus implementation.

The runner chooses a :class:`SeatTransport` for every seat once, when it opens
(:meth:`~parley.arena.run.runner.Runner.open`), and asks seats only through it:

- :class:`InProcessSeats`: agents in the runner's own process, called directly through the
  wire codec (:class:`~parley.arena.run.direct.DirectAgents`: no socket, no bus hop);
- :class:`BusSeats`: an agent host on another endpoint, reached over the arena's
  :class:`~parley.protocols.bus.Endpoint`, one peer per seat: remote agents (``parley
  agent``), or the run's own agents with ``RunConfig.local_agents_over_bus``; with
  ``RunConfig.batch_frames``, through a :class:`~parley.arena.run.frames.FrameBatcher`.

Both show an agent the same observation (the bus's decoded copy) and give the runner the
same thing for the same agent: the reply (an ``Action``) or the failure
(``RemoteError("handler_failed")`` for an agent that raises or returns something other than
an action, ``RemoteError("bad_message")`` for an action the wire cannot carry,
``RequestTimeout`` for one that does not answer within the timeout, ``ProtocolError`` for an
observation the wire cannot carry, which no agent sees), and both deliver the same
end-of-episode notice, with the reason when the episode failed, to the agent host
(:meth:`~parley.arena.run.agent_host.AgentHost.end`). ``tests/arena/run/test_seat_transport.py``
checks this once for both. What to do with a failure (retry a refusal, fail the episode with
a reason) is the runner's.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from parley.arena.run.agent_host import FAILED_KEY
from parley.arena.run.direct import DirectAgents, with_seeds
from parley.arena.run.frames import FrameBatcher
from parley.arena.run.gather import send_all_then_gather
from parley.arena.run.peers import AbsentPeers
from parley.protocols.bus import Endpoint
from parley.protocols.errors import BusError, ProtocolError, RequestTimeout
from parley.protocols.messages import Action, Body, Observation

__all__ = ["BusSeats", "InProcessSeats", "SeatTransport", "ask_in_order"]

ARENA_NAME = "arena"
"""Bus name of the runner's endpoint (the sender of every observation)."""
LOCAL_HOST_NAME = "arena-agents"
"""Bus name of the endpoint hosting the run's in-process agents."""

Replies = list[Body | BaseException]
"""One reply (an ``Action``) or failure per request, in the requests' order."""


class SeatTransport(abc.ABC):
    """The way to the agents of some seats (see the module docstring).

    Implementations provide :meth:`request` and :meth:`end`; :meth:`ask` is built on
    :meth:`request` unless an implementation has a faster way to the same results.
    """

    seats: frozenset[str]
    """The seats this transport reaches."""
    remote = False
    """Whether a seat's agent may be absent (then :meth:`missing` and :meth:`join` matter)."""

    @abc.abstractmethod
    def request(
        self,
        obs: Observation,
        *,
        timeout: float,
        episode: str,
        turn: int,
    ) -> Coroutine[Any, Any, Body]:
        """A coroutine that returns ``obs.agent``'s reply to ``obs`` in ``episode``, or
        raises its failure (a :class:`BusError` or :class:`ProtocolError`).

        Until awaited it has sent nothing, so the caller may send several before awaiting
        any (:func:`~parley.arena.run.gather.send_all_then_gather`)."""

    async def ask(
        self,
        requests: Sequence[Observation],
        *,
        timeout: float,  # noqa: ASYNC109 -- the act timeout (what is left of it)
        episode: str,
        turn: int,
        pipeline: bool,
    ) -> Replies:
        """The reply or failure of each of ``requests`` (one per seat), in order.

        With ``pipeline`` every request is sent before any reply is awaited and every
        request has a result; without, they are asked one at a time and the results stop
        at the first that is not an ``Action`` (the seats after it were not asked).
        """
        if pipeline:
            return await send_all_then_gather(
                [self.request(obs, timeout=timeout, episode=episode, turn=turn) for obs in requests]
            )
        return await ask_in_order(
            requests, lambda obs: self.request(obs, timeout=timeout, episode=episode, turn=turn)
        )

    @abc.abstractmethod
    async def end(self, episode: str, seat: str, failed: str | None) -> None:
        """Tell ``seat``'s agent host that ``episode`` is over (``failed``: why it failed),
        one way: its agent is closed. A seat whose agent cannot be reached is skipped."""

    def missing(self, seats: Sequence[str]) -> list[str]:
        """Those of ``seats`` (any seats: others are ignored) whose agent is not here now."""
        return []

    async def join(self, seats: Sequence[str]) -> dict[str, RequestTimeout]:
        """Wait for the agents of ``seats`` (from :meth:`missing`); returns, for each seat
        whose agent did not come in time, why."""
        return {}

    async def close(self) -> None:
        """Release what the transport holds (requests in flight are cancelled)."""


async def ask_in_order(
    requests: Sequence[Observation], request: Callable[[Observation], Coroutine[Any, Any, Body]]
) -> Replies:
    """``request(obs)`` for each of ``requests`` in turn, stopping after the first that
    brought no ``Action`` (a failure or a reply of another kind): :meth:`SeatTransport.ask`
    without ``pipeline``."""
    results: Replies = []
    for obs in requests:
        try:
            reply = await request(obs)
        except (BusError, ProtocolError) as exc:
            results.append(exc)
            break  # the episode has failed or must wait: ask nobody else now
        results.append(reply)
        if not isinstance(reply, Action):
            break
    return results


class InProcessSeats(SeatTransport):
    """Seats played in the runner's process, asked through ``direct`` (the wire codec's
    copies and failures, no bus hop)."""

    def __init__(self, direct: DirectAgents) -> None:
        self.direct = direct
        self.seats = direct.seats

    def request(
        self,
        obs: Observation,
        *,
        timeout: float,
        episode: str,
        turn: int,
    ) -> Coroutine[Any, Any, Body]:
        return self.direct.request(obs, timeout=timeout, episode=episode, sender=ARENA_NAME)

    def ask(
        self,
        requests: Sequence[Observation],
        *,
        timeout: float,
        episode: str,
        turn: int,
        pipeline: bool,
        seeds: Mapping[str, int] | None = None,
    ) -> Coroutine[Any, Any, Replies]:
        """:meth:`SeatTransport.ask`; ``seeds`` (seat -> agent seed) for requests built
        without their seed (:meth:`DirectAgents.ask_all`)."""
        # (the callee's coroutine, returned as it is: no coroutine of its own per step)
        if pipeline:
            # Every seat's act runs to its first suspension before any is awaited, with no
            # coroutine or task per seat: the runner's usual step.
            return self.direct.ask_all(
                requests, timeout=timeout, episode=episode, sender=ARENA_NAME, seeds=seeds
            )
        if seeds is not None:
            requests = with_seeds(requests, seeds)
        return super().ask(requests, timeout=timeout, episode=episode, turn=turn, pipeline=False)

    def end(self, episode: str, seat: str, failed: str | None) -> Coroutine[Any, Any, None]:
        return self.direct.end(episode, seat, failed)  # (its coroutine: none of our own)

    async def close(self) -> None:
        await self.direct.close()


class BusSeats(SeatTransport):
    """Seats whose agent hosts are peers of ``arena`` (``peers``: seat -> peer name).

    ``frames`` (batched frames) carries the observations instead of one request each.
    ``absent`` keeps how long each peer has been away, shared by every episode.
    """

    remote = True

    def __init__(
        self,
        arena: Endpoint,
        peers: dict[str, str],
        *,
        scenario: str,
        absent: AbsentPeers,
        frames: FrameBatcher | None = None,
    ) -> None:
        self.arena = arena
        self.peers = peers
        self.seats = frozenset(peers)
        self.scenario = scenario
        self.absent = absent
        self.frames = frames

    def request(
        self,
        obs: Observation,
        *,
        timeout: float,
        episode: str,
        turn: int,
    ) -> Coroutine[Any, Any, Body]:
        peer = self.peers[obs.agent]
        if self.frames is not None:
            return self.frames.request(peer, obs, timeout=timeout, episode=episode)
        return self.arena.request(peer, obs, timeout=timeout, episode=episode, turn=turn)

    def missing(self, seats: Sequence[str]) -> list[str]:
        peers = self.peers
        ours = [seat for seat in seats if seat in peers]
        if not ours:
            return []
        live = self.arena.peers  # (built on every read: once per call, not once per seat)
        self.absent.seen(live)
        return [seat for seat in ours if peers[seat] not in live]

    async def join(self, seats: Sequence[str]) -> dict[str, RequestTimeout]:
        wanted = sorted({self.peers[seat] for seat in seats})
        waits = [self.absent.wait_for(self.arena, peer) for peer in wanted]
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        absent: dict[str, RequestTimeout] = {}
        for peer, outcome in zip(wanted, outcomes, strict=True):
            if isinstance(outcome, RequestTimeout):
                absent[peer] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
        return {seat: absent[self.peers[seat]] for seat in seats if self.peers[seat] in absent}

    async def end(self, episode: str, seat: str, failed: str | None) -> None:
        peer = self.peers[seat]
        if peer not in self.arena.peers:
            return
        body = Observation(
            agent=seat,
            text="The episode is over.",
            scenario=self.scenario,
            terminated=True,
            info={FAILED_KEY: failed} if failed else {},
        )
        # A peer that died between the check and the send cannot be told; that is fine.
        with contextlib.suppress(BusError):
            try:
                await self.arena.send(peer, body, episode=episode)
            except ProtocolError:
                # A reason longer than the wire takes (the record keeps it whole): the
                # notice goes without it, so that the agent is closed all the same.
                body.info = {}
                await self.arena.send(peer, body, episode=episode)

    async def close(self) -> None:
        if self.frames is not None:
            await self.frames.close()
