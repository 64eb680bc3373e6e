"""A pool's face on the bus: the endpoint name, what it takes, its errors and its handlers.

:class:`PoolService` answers ``GenerateRequest``, ``ScoreRequest`` and ``WeightUpdate``
requests with the subclass's :meth:`~PoolService.generate`, :meth:`~PoolService.score`
(reward models; by default none) and :meth:`~PoolService.update_weights`
(:class:`~parley.arena.inference.pool.InferencePool` in one process,
:class:`~parley.arena.inference.ray_pool.RayPool` over replicas); everything here is
re-exported by :mod:`parley.arena.inference.pool`.
"""

from __future__ import annotations

import abc
from collections.abc import Collection
from typing import TYPE_CHECKING

from parley.protocols.errors import ParleyError
from parley.protocols.messages import (
    Error,
    GenerateRequest,
    GenerateResult,
    Ok,
    ScoreRequest,
    ScoreResult,
    WeightUpdate,
)

if TYPE_CHECKING:
    from parley.protocols.bus import Endpoint
    from parley.protocols.messages import Envelope

__all__ = ["POOL_ACCEPTS", "POOL_ENDPOINT", "PoolError", "PoolService"]

POOL_ENDPOINT = "pool"
"""The bus endpoint name the pool serves under."""

POOL_ACCEPTS = frozenset({"generate", "weights", "score"})
"""``BusConfig.accept`` of a pool's endpoint: what :meth:`PoolService.serve` answers (the
session kinds aside, every other body is refused unread)."""


class PoolError(ParleyError):
    """The pool could not answer a request; ``code`` is the wire ``Error`` code.

    ``param`` names the request field at fault for ``bad_request`` (``"seed"``, ``"stop"``,
    ...; the HTTP front reports it as OpenAI's ``param``), None otherwise.
    """

    def __init__(
        self, code: str, message: str, *, retryable: bool = False, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.param = param

    def to_message(self) -> Error:
        """This error as the ``Error`` body the bus sends back."""
        return Error(code=self.code, message=self.message, retryable=self.retryable)


class PoolService(abc.ABC):
    """A pool's face on the bus: ``GenerateRequest`` and ``WeightUpdate`` requests answered
    by the subclass's :meth:`generate` and :meth:`update_weights` (a :class:`PoolError` is
    the reply's :class:`~parley.protocols.messages.Error`)."""

    @abc.abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """The completion of ``request``; raises :class:`PoolError` to refuse it."""

    @abc.abstractmethod
    async def update_weights(self, update: WeightUpdate) -> int:
        """Apply ``update`` to its policy; returns the version now served."""

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """The scores of ``request``'s texts by its reward model; raises :class:`PoolError`
        (this default: the pool serves no reward model)."""
        raise PoolError(
            "unknown_policy",
            f"this pool serves no reward model (asked for {str(request.model)[:80]!r}); "
            "add one with InferencePool.add_scorer",
        )

    _weights_keys: frozenset[str] | None = None
    _endpoint: Endpoint | None = None

    def serve(self, endpoint: Endpoint, *, weights_keys: Collection[str] | None = None) -> None:
        """Answer ``GenerateRequest``, ``ScoreRequest`` (when the endpoint accepts ``score``)
        and ``WeightUpdate`` requests arriving at ``endpoint`` (name it
        :data:`POOL_ENDPOINT` so agents find it).

        ``weights_keys`` (CURVE public keys, Z85): only peers connected with one of them may
        change weights; the others get ``Error(forbidden)``. Empty: weights are not taken
        over the bus at all (leave ``weights`` out of the endpoint's ``accept``). ``None``:
        every peer may (an in-process or loopback pool whose clients are all trusted)."""
        self._endpoint = endpoint
        self._weights_keys = None if weights_keys is None else frozenset(weights_keys)
        endpoint.on(GenerateRequest, self._on_generate)
        accept = endpoint.config.accept
        if accept is None or "score" in accept:  # (an endpoint may take generation only)
            endpoint.on(ScoreRequest, self._on_score)
        if self._weights_keys != frozenset():
            endpoint.on(WeightUpdate, self._on_weights)

    async def _on_generate(self, env: Envelope) -> GenerateResult | Error:
        assert isinstance(env.body, GenerateRequest)  # the bus dispatches by body type
        try:
            return await self.generate(env.body)
        except PoolError as exc:
            return exc.to_message()

    async def _on_score(self, env: Envelope) -> ScoreResult | Error:
        assert isinstance(env.body, ScoreRequest)  # the bus dispatches by body type
        try:
            return await self.score(env.body)
        except PoolError as exc:
            return exc.to_message()

    async def _on_weights(self, env: Envelope) -> Ok | Error:
        assert isinstance(env.body, WeightUpdate)
        keys, endpoint = self._weights_keys, self._endpoint
        if keys is not None and (endpoint is None or endpoint.peer_key(env.sender) not in keys):
            message = (
                f"{env.sender} may generate but not change weights: this pool takes weights "
                "only from the keys it was given (parley serve --weights-key FILE)"
            )
            return Error(code="forbidden", message=message)
        try:
            await self.update_weights(env.body)
        except PoolError as exc:
            return exc.to_message()
        return Ok()
