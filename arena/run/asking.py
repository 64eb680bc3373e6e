"""How the runner asks the seats of a step: over their transports, waiting for absent agents
and asking again those refused as ``overloaded``.

:class:`SeatAsking` is the part of :class:`~parley.arena.run.runner.Runner` that sends a step's
requests (one call when every seat shares a transport, every request out before any reply
is awaited otherwise) and turns what comes back into actions or an :class:`EpisodeFailed`
with its reason; the runner sets the transports when it opens.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from parley.arena.run.backpressure import SEPARATOR, backoff, failure_reason, retryable
from parley.arena.run.config import RunConfig
from parley.arena.run.gather import send_all_then_gather
from parley.arena.run.seats import InProcessSeats, Replies, SeatTransport, ask_in_order
from parley.protocols.errors import BusError
from parley.protocols.messages import Action, Body, Observation

__all__: list[str] = []  # the runner's own part, imported by module path: nothing for users


class EpisodeFailed(Exception):
    """Ends an episode early; ``str(exc)`` is the recorded reason."""


class SeatAsking:
    """Asks the seats of a step (see the module docstring); the runner sets its state."""

    config: RunConfig
    overloaded_retries: int  # requests refused as overloaded and sent again
    _jitter: random.Random  # backoff jitter only: never reaches an episode
    _transports: dict[str, SeatTransport] | None  # each seat's (None while closed)
    _shared: SeatTransport | None  # the one every seat shares, if any
    _local: InProcessSeats | None  # _shared, when every seat is in-process
    _away_checks: list[SeatTransport]  # transports whose agents may be away

    def _ask(
        self,
        requests: Mapping[str, Observation],
        episode: str,
        turn: int,
        seeds: Mapping[str, int] | None = None,
    ) -> Coroutine[Any, Any, Replies]:
        """A coroutine of the reply or failure of each of ``requests``, in order (nothing is
        sent before it is awaited): :meth:`SeatTransport.ask` over the seats' transports,
        one call when they share one (then the transport's own coroutine: none of the
        runner's per step). Seats whose agent may be away are waited for first
        (:meth:`_ask_present`). ``seeds``: the requests were built without their agent seed
        (see :meth:`_play`). The caller fails the episode or asks again (:meth:`_retry`)
        when an answer is not an action.
        """
        if self._transports is None:
            raise BusError("the runner's bus is not open: play episodes inside Runner.open()")
        if self._away_checks:  # seats whose agent may be away: are they here?
            return self._ask_present(requests, episode, turn, seeds)
        timeout = self.config.act_timeout
        shared = self._shared
        if shared is not None:  # every seat on one transport (the usual case): one call
            observations = list(requests.values())
            return self._together(shared, observations, timeout, episode, turn, seeds)
        return self._send(requests, list(requests), timeout, episode, turn, seeds)

    async def _ask_present(
        self,
        requests: Mapping[str, Observation],
        episode: str,
        turn: int,
        seeds: Mapping[str, int] | None,
    ) -> Replies:
        """:meth:`_ask` with seats whose agent may be away: wait for them (raises
        :class:`EpisodeFailed` naming those that did not come), then ask; requests refused
        as ``overloaded`` are asked again here, ``act_timeout`` counted from this send
        (after the wait), so that only actions or a failure come back."""
        await self._wait_for_absent(requests)
        sent_at = time.perf_counter()
        timeout = self.config.act_timeout
        results = await self._send(requests, list(requests), timeout, episode, turn, seeds)
        if all(type(result) is Action for result in results):
            return results
        actions = await self._retry(requests, results, sent_at, episode, turn, seeds)
        return [actions[seat] for seat in requests]

    async def _retry(
        self,
        requests: Mapping[str, Observation],
        results: Replies,
        sent_at: float,
        episode: str,
        turn: int,
        seeds: Mapping[str, int] | None,
    ) -> dict[str, Action]:
        """Every seat's action once an answer in ``results`` (to ``requests``, sent at
        ``sent_at`` by :func:`time.perf_counter`) was not an action: the episode fails with
        its reason, or the seats refused as ``overloaded`` are asked again after a growing,
        jittered wait, as long as ``act_timeout`` (counted from the first send) has time
        left."""
        clock = time.perf_counter
        deadline = sent_at + self.config.act_timeout
        actions: dict[str, Action] = {}
        todo = list(requests)
        tries = 0
        while True:
            failures: list[str] = []
            refused: list[str] = []
            for seat, result in zip(todo, results, strict=False):
                if isinstance(result, Action):
                    actions[seat] = result
                elif retryable(result):
                    refused.append(seat)
                else:
                    failures.append(failure_reason(seat, result))
            if failures:
                raise EpisodeFailed(SEPARATOR.join(failures))
            # Sent one at a time, the seats after a refusal were not asked yet.
            todo = [seat for seat in todo if seat not in actions]
            if not todo:
                return actions
            tries += 1
            self.overloaded_retries += len(todo)
            wait = backoff(tries, self._jitter)
            if clock() + wait >= deadline:
                raise EpisodeFailed(
                    SEPARATOR.join(
                        f"{seat}: timeout: still refused as overloaded after {tries} tries "
                        f"within act_timeout={self.config.act_timeout:g} s"
                        for seat in refused or todo
                    )
                )
            await asyncio.sleep(wait)
            left = max(deadline - clock(), 1e-3)
            results = await self._send(requests, todo, left, episode, turn, seeds)

    async def _send(
        self,
        requests: Mapping[str, Observation],
        seats: Sequence[str],
        timeout: float,  # noqa: ASYNC109 -- what is left of the act timeout
        episode: str,
        turn: int,
        seeds: Mapping[str, int] | None = None,
    ) -> Replies:
        """The replies (or errors) of ``seats``' requests, in order (as
        :meth:`SeatTransport.ask`, over the seats' transports; ``seeds``: see :meth:`_ask`)."""
        pipeline = self.config.pipeline
        observations = [requests[seat] for seat in seats]
        transports = self._transports
        assert transports is not None  # (checked by _ask)
        shared = self._shared  # every seat on one transport: the usual case
        if shared is None:
            if not seats:
                return []
            first = transports[seats[0]]
            if all(transports[seat] is first for seat in seats[1:]):
                shared = first  # the seats acting now share one
        if shared is not None:
            return await self._together(shared, observations, timeout, episode, turn, seeds)

        def request(obs: Observation) -> Coroutine[Any, Any, Body]:
            transport = transports[obs.agent]
            return transport.request(obs, timeout=timeout, episode=episode, turn=turn)

        if pipeline:  # in-process and remote seats: every request out, then the replies
            return await send_all_then_gather([request(obs) for obs in observations])
        return await ask_in_order(observations, request)

    def _together(
        self,
        transport: SeatTransport,
        observations: list[Observation],
        timeout: float,
        episode: str,
        turn: int,
        seeds: Mapping[str, int] | None,
    ) -> Coroutine[Any, Any, Replies]:
        """``transport.ask`` of ``observations`` (their seats all on ``transport``); with
        ``seeds`` (see :meth:`_ask`), the in-process transport's, which takes them."""
        pipeline = self.config.pipeline
        local = self._local
        if seeds is not None and local is not None:  # (then local is transport)
            return local.ask(
                observations,
                timeout=timeout,
                episode=episode,
                turn=turn,
                pipeline=pipeline,
                seeds=seeds,
            )
        return transport.ask(
            observations, timeout=timeout, episode=episode, turn=turn, pipeline=pipeline
        )

    async def _wait_for_absent(self, requests: Mapping[str, Observation]) -> None:
        """Wait up to ``join_timeout`` for the agents of the acting seats that are away
        (remote seats join late); raises :class:`EpisodeFailed` naming every seat whose
        agent did not come."""
        for transport in self._away_checks:
            missing = transport.missing(list(requests))
            if not missing:
                continue
            absent = await transport.join(missing)
            if absent:
                raise EpisodeFailed(
                    SEPARATOR.join(
                        f"{seat}: not_joined: {str(why).replace(SEPARATOR, ', ')}"
                        for seat, why in absent.items()
                    )
                )
