"""The inference pool: one service that batches the generate requests of every agent.

Every LLM agent of every running episode sends :class:`GenerateRequest` messages to one
pool (over the bus under the endpoint name ``"pool"``, or in-process through
:meth:`InferencePool.generate`). The pool routes each request by ``request.policy`` to the
:class:`~parley.arena.inference.backends.base.Backend` serving that policy and runs the requests in
batches, because batching across agents is the largest performance lever there is.

Scheduling, per backend (a *lane*):

- **Static batching** (transformers, HTTP): calls are serialised. When the first request
  arrives the lane waits up to :attr:`PoolConfig.max_wait` for more, then hands up to
  :attr:`PoolConfig.max_batch_size` requests to one ``generate`` call. Requests that arrive
  while a batch runs form the next batch, which starts as soon as the running one ends.
- **Continuous batching** (``backend.continuous_batching``: vLLM, and transformers with
  ``batching="continuous"``): the engine schedules
  concurrent calls itself, so the pool submits every request at once as its own call (at
  most :attr:`PoolConfig.max_in_flight` at a time) and the engine batches them token by
  token.

Guarantees (the contract the agents and the HTTP front rely on):

- Every request gets exactly one answer: a :class:`GenerateResult`, or an error with a
  machine-readable code (:class:`PoolError` in-process, an ``Error`` body on the bus).
- ``request.timeout`` (or :attr:`PoolConfig.default_timeout` when it is 0) bounds the wait:
  when it passes the request is answered ``Error(code="timeout")``; if it had not started
  it is dropped from its batch; if it had, a continuous backend's call is cancelled and a
  static batch finishes without it (its result is discarded). The wait counts the time the
  pool ran (:class:`~parley.arena.inference.patience.PatientTimer`): a pool stopped past a
  request's timeout answers what it finishes on resuming, by at most twice the timeout.
- Backpressure: at most :attr:`PoolConfig.max_queue` requests wait (not yet started) across
  all policies; one more is refused at once with ``Error(code="overloaded",
  retryable=True)``. Callers back off and retry (:class:`parley.agents.llm.BusPoolClient`
  does).
- One request never fails another: requests are checked on receipt
  (:meth:`Backend.validate <parley.arena.inference.backends.base.Backend.validate>`, every
  field's range) and a bad one is answered ``bad_request`` naming the field; if a batch
  fails anyway, its members are retried one by one, so only the failing request gets
  ``backend_failed``.
- Every result carries the version of the weights that produced it. A
  :class:`WeightUpdate` for a policy is applied by its backend's ``update_weights`` between
  batches (a static lane finishes its running batch first), which sets the version.

Per-seat LoRA adapters: :meth:`InferencePool.add_adapter` loads an adapter into the backend
of a base policy and serves it under its own policy name, in the same lane (so the base and
its adapters batch together). Versions are per policy (``backend.version_of(name)``): an
update of one adapter bumps only that adapter's version, and the stale-weights check
compares with it.

Streaming (the HTTP front's ``stream: true``): :meth:`InferencePool.generate` takes an
optional ``on_tokens`` :data:`~parley.arena.inference.backends.base.TokenSink`; the lane
hands it to backends that stream (``backend.streams_tokens``: transformers per decoding
step of its batch, vLLM per engine step), which feed it each completion's new tokens while
the batch runs. Batching, scheduling and the bus path are unchanged (bus requests carry no
sink); a backend that does not stream just answers at the end.

Reward models (:meth:`InferencePool.add_scorer`): a :class:`ScoreRequest` names a scorer
(``request.model``) and gets one score per text, batched across callers by the scorer's
:class:`~parley.arena.inference.backends.scorer.ScoreBatcher` (``max_batch_size`` texts,
``max_wait``), bounded by ``request.timeout`` like a generation.

Error codes: ``timeout``, ``overloaded`` (retryable), ``unknown_policy``, ``bad_request``,
``backend_failed`` (retryable when the backend says so), ``stale_weights``, ``closed``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.arena.inference.backends.errors import BackendError, RequestError
from parley.arena.inference.lanes import Lane, Pending
from parley.arena.inference.patience import PatientTimer, patient_wait
from parley.arena.inference.service import POOL_ACCEPTS, POOL_ENDPOINT, PoolError, PoolService
from parley.protocols.errors import ConfigError, ParleyError
from parley.protocols.messages import (
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
    WeightUpdate,
)

if TYPE_CHECKING:
    from parley.arena.inference.backends.base import Backend, ChatTokenizer, TokenSink
    from parley.arena.inference.backends.scorer import ScoreBatcher

__all__ = [
    "PoolConfig",
    "PoolError",
    "PoolStats",
    "PoolService",
    "InferencePool",
    "POOL_ENDPOINT",
    "POOL_ACCEPTS",
]


@dataclass(frozen=True)
class PoolConfig:
    """How the pool batches, queues and times out. Validated at construction."""

    max_batch_size: int = 32
    """Most requests in one ``generate`` call of a static-batching backend."""

    max_wait: float = 0.005
    """Seconds a static lane waits, after its oldest waiting request arrived, for more
    requests to fill a batch. Longer gives bigger batches under light load; it adds at most
    this much latency. A full batch never waits."""

    max_queue: int = 1024
    """Most requests waiting (received, not yet started) across all policies. One more is
    refused with ``Error(code="overloaded", retryable=True)``."""

    default_timeout: float = 0.0
    """Seconds a request may wait for its result when its own ``timeout`` is 0; 0 means no
    limit (the bus request timeout of the caller still applies)."""

    max_in_flight: int = 256
    """Continuous-batching backends: most requests submitted to the engine at once."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait < 0:
            raise ConfigError(f"max_wait must be >= 0 seconds, got {self.max_wait}")
        if self.max_queue < 1:
            raise ConfigError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.default_timeout < 0:
            raise ConfigError(f"default_timeout must be >= 0, got {self.default_timeout}")
        if self.max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {self.max_in_flight}")


@dataclass
class PoolStats:
    """Counters since the pool started (read them; the pool only adds)."""

    requests: int = 0
    completed: int = 0
    generated_tokens: int = 0
    backend_calls: int = 0
    batches: int = 0
    """Batches handed to a backend (a member-by-member rerun counts each member)."""
    batched_requests: int = 0
    """Requests in those batches, summed (bounded counters: no per-batch list)."""
    max_batch_size: int = 0
    timeouts: int = 0
    overloaded: int = 0
    failed: int = 0
    bad_requests: int = 0
    isolated_batches: int = 0
    """Failed batches whose members were retried one by one."""
    weight_updates: int = 0

    @property
    def mean_batch_size(self) -> float:
        return self.batched_requests / self.batches if self.batches else 0.0


class InferencePool(PoolService):
    """Batches generate requests onto backends, one backend per policy name.

    Use it in-process (``await pool.generate(request)``) or on the bus
    (``pool.serve(endpoint)`` registers the handlers). Start it with :meth:`start` (or
    ``async with``); :meth:`close` answers everything still waiting with ``closed`` and
    closes the backends if ``owns_backends``.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        config: PoolConfig | None = None,
        *,
        owns_backends: bool = True,
    ) -> None:
        if not backends:
            raise ConfigError("an InferencePool needs at least one policy -> backend")
        self.config = config or PoolConfig()
        self.stats = PoolStats()
        self.owns_backends = owns_backends
        self._backends: dict[str, Backend] = dict(backends)
        self._scorers: dict[str, ScoreBatcher] = {}
        self._lanes: dict[int, Lane] = {}
        self._queued = 0
        self._closed = False
        self._started = False

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> InferencePool:
        """Start one scheduler per backend; idempotent."""
        if not self._started:
            for backend in self._backends.values():
                self._lane(backend)
            self._started = True
        return self

    async def __aenter__(self) -> InferencePool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop scheduling, answer every open request with ``closed``; idempotent."""
        if self._closed:
            return
        self._closed = True
        for batcher in self._scorers.values():
            await batcher.close()
        for lane in self._lanes.values():
            await lane.close()
            while lane.queue:
                item = lane.pop()
                if not item.future.done():
                    item.future.set_exception(PoolError("closed", "the pool was closed"))
        if self.owns_backends:
            for backend in {id(b): b for b in self._backends.values()}.values():
                await backend.close()

    # --- policies ---------------------------------------------------------------------

    @property
    def policies(self) -> dict[str, int]:
        """Policy name -> current weights version (an adapter's own version)."""
        return {name: b.version_of(name) for name, b in self._backends.items()}

    @property
    def backends(self) -> list[Backend]:
        """Every backend the pool serves, once each."""
        return list({id(b): b for b in self._backends.values()}.values())

    def backend(self, policy: str) -> Backend:
        """The backend serving ``policy``; :class:`PoolError` ``unknown_policy`` if none."""
        try:
            return self._backends[policy]
        except KeyError:
            raise PoolError(
                "unknown_policy",
                f"no policy {str(policy)[:80]!r} in this pool; it serves: "
                f"{', '.join(self._backends)}",
            ) from None

    def tokenizer(self, policy: str) -> ChatTokenizer:
        """The tokenizer of ``policy``'s model (for building prompts in-process)."""
        return self.backend(policy).tokenizer

    def add_policy(self, name: str, backend: Backend) -> None:
        """Serve ``name`` with ``backend`` from now on (several names may share one)."""
        if name in self._backends:
            raise ConfigError(f"policy {name!r} is already served by this pool")
        self._backends[name] = backend
        if self._started:
            self._lane(backend)

    async def add_adapter(self, policy: str, base_policy: str, path: str) -> None:
        """Load the PEFT adapter directory ``path`` into the backend serving
        ``base_policy`` and serve ``policy`` with it from now on (version 0).

        ``policy`` then shares ``base_policy``'s lane: its requests batch with those of the
        base and of the backend's other adapters. Raises
        :class:`~parley.protocols.errors.ConfigError` when ``policy`` is already served or
        the backend cannot load the adapter (no adapter support, another base, ...), and
        :class:`PoolError` ``unknown_policy`` when ``base_policy`` is not served; on any
        error the pool serves what it served before.
        """
        if policy in self._backends:
            raise ConfigError(f"policy {policy!r} is already served by this pool")
        backend = self.backend(base_policy)
        await backend.add_adapter(policy, path)
        self.add_policy(policy, backend)

    def add_scorer(self, name: str, scorer: Any) -> None:
        """Serve the reward model ``scorer`` (a
        :class:`~parley.arena.inference.backends.scorer.SequenceScorer`, or anything with a
        blocking ``score(texts) -> list[float]`` and a ``version``) as ``name``."""
        from parley.arena.inference.backends.scorer import ScoreBatcher

        if name in self._scorers:
            raise ConfigError(f"reward model {name!r} is already served by this pool")
        self._scorers[name] = ScoreBatcher(
            scorer, max_batch_texts=self.config.max_batch_size, max_wait=self.config.max_wait
        )

    @property
    def scorers(self) -> dict[str, int]:
        """Reward model name -> its weights version."""
        return {name: int(b.scorer.version) for name, b in self._scorers.items()}

    def _lane(self, backend: Backend) -> Lane:
        lane = self._lanes.get(id(backend))
        if lane is None:
            lane = self._lanes[id(backend)] = Lane(backend, self)
            lane.start()
        return lane

    # --- requests ---------------------------------------------------------------------

    async def generate(
        self, request: GenerateRequest, *, on_tokens: TokenSink | None = None
    ) -> GenerateResult:
        """Answer one request (batched with whatever else is waiting).

        ``on_tokens`` receives the tokens of each completion as the backend generates them
        when the backend streams (see the module docstring); the result is the same.

        Raises :class:`PoolError` with the codes listed in the module docstring.
        """
        if self._closed:
            raise PoolError("closed", "the pool is closed")
        await self.start()
        self.stats.requests += 1
        backend = self.backend(request.policy)
        if backend.failure:
            self.stats.failed += 1
            raise PoolError("backend_failed", f"policy {request.policy!r}: {backend.failure}")
        try:
            backend.validate(request)
        except ParleyError as exc:
            self.stats.bad_requests += 1
            raise PoolError("bad_request", str(exc), param=getattr(exc, "field", None)) from None
        except Exception as exc:  # a validator bug must still answer, and name itself
            self.stats.bad_requests += 1
            raise PoolError(
                "bad_request", f"the request could not be checked: {type(exc).__name__}: {exc}"
            ) from exc
        if self._queued >= self.config.max_queue:
            self.stats.overloaded += 1
            raise PoolError(
                "overloaded",
                f"the pool has {self._queued} requests waiting (max_queue="
                f"{self.config.max_queue}); retry after a short backoff",
                retryable=True,
            )
        lane = self._lane(backend)
        loop = asyncio.get_running_loop()
        item = Pending(request, loop.create_future(), loop.time(), on_tokens=on_tokens)
        self._queued += 1
        lane.put(item)
        timeout = request.timeout or self.config.default_timeout
        # A timer rather than asyncio.wait_for: the bus may run this handler inline, outside
        # a task, where asyncio.timeout (what wait_for uses from Python 3.12) cannot work.
        # A patient one: the pool stopped past the timeout (SIGSTOP, a loaded host) answers
        # what it finishes on resuming, not a timeout the caller never waited out.
        timer = PatientTimer(loop, timeout, self._expire, lane, item, timeout) if timeout else None
        try:
            return await item.future
        finally:
            if timer is not None:
                timer.cancel()
            if not item.future.done():  # the caller went away (cancelled): drop the request
                item.future.cancel()
            lane.discard(item)

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """The score of ``request.prompt + text`` for each of ``request.texts``, batched with
        the other score requests for the same reward model.

        Raises :class:`PoolError`: ``unknown_policy`` (no such reward model),
        ``bad_request`` (no texts; ``param`` names the field), ``timeout``, ``closed``,
        ``backend_failed``."""
        if self._closed:
            raise PoolError("closed", "the pool is closed")
        self.stats.requests += 1
        batcher = self._scorers.get(request.model)
        if batcher is None:
            known = ", ".join(self._scorers) or "none"
            raise PoolError(
                "unknown_policy",
                f"no reward model {str(request.model)[:80]!r} in this pool; it serves: {known}",
            )
        if not request.texts:
            self.stats.bad_requests += 1
            raise PoolError("bad_request", "texts must hold at least one text", param="texts")
        timeout = request.timeout or self.config.default_timeout
        texts = [request.prompt + text for text in request.texts]
        # asyncio.wait, not asyncio.timeout: the bus may run this handler inline, outside
        # a task (see generate); timed patiently (see generate).
        call = asyncio.ensure_future(batcher.score(texts))
        try:
            await patient_wait(call, timeout or None)
        finally:
            if not call.done():  # timed out, or the caller went away: drop the texts
                call.cancel()
        if not call.done() or call.cancelled():
            if self._closed:
                raise PoolError("closed", "the pool was closed")
            self.stats.timeouts += 1
            raise PoolError(
                "timeout", f"no scores within {timeout:g} s (reward model {request.model!r})"
            )
        try:
            scores = call.result()
        except Exception as exc:  # the scorer's failure is this request's answer
            self.stats.failed += 1
            raise PoolError(
                "backend_failed",
                f"reward model {request.model!r} failed: {type(exc).__name__}: {exc}",
            ) from exc
        self.stats.completed += 1
        return ScoreResult(model=request.model, scores=scores, version=int(batcher.scorer.version))

    def _expire(self, lane: Lane, item: Pending, timeout: float) -> None:
        if item.future.done():
            return
        self.stats.timeouts += 1
        item.future.set_exception(
            PoolError(
                "timeout",
                f"no result within {timeout:g} s (policy {item.request.policy!r}); raise the "
                "request's timeout or lower the load on the pool",
            )
        )
        lane.discard(item)

    def _unqueue(self, item: Pending) -> None:
        if item.waiting:
            item.waiting = False
            self._queued -= 1

    async def update_weights(self, update: WeightUpdate) -> int:
        """Apply ``update`` to its policy's backend between batches; returns the version.

        Raises :class:`PoolError` ``stale_weights`` when ``update.version`` is not newer
        than the version being served, ``unknown_policy``, or ``backend_failed``.
        """
        version = update.version
        if isinstance(version, bool) or not isinstance(version, int) or not 0 < version < 2**63:
            # (10**30 over HTTP had been served, then broke every result's encoding and
            # refused every later 64-bit version as stale)
            raise PoolError(
                "bad_request", f"a weights version is an integer in [1, 2**63), got {version!r}"
            )
        backend = self.backend(update.policy)
        served = backend.version_of(update.policy)
        if update.version <= served:
            raise PoolError(
                "stale_weights",
                f"policy {update.policy!r} already serves version {served}; "
                f"an update must carry a newer version than that, got {update.version}",
            )
        lane = self._lane(backend)
        # A static lane's call must not see its weights change mid-batch; a continuous
        # backend finishes running generations on the old weights itself.
        gate = contextlib.nullcontext() if lane.continuous else lane.gate.exclusive()
        async with gate:
            try:
                await backend.update_weights(update)
            except Exception as exc:  # reported to the trainer as an Error
                if _refused_update(exc):
                    # The update itself is bad (an adapter that does not fit, missing or
                    # malformed weights): the caller must change it. A 4xx, not a 500 that
                    # OpenAI clients would send twice more.
                    raise PoolError(
                        "bad_request",
                        f"the update of {update.policy!r} to version {update.version} was "
                        f"refused; nothing changed: {exc}",
                        param=getattr(exc, "field", "path" if update.path else "tensors"),
                    ) from exc
                raise PoolError(
                    "backend_failed",
                    f"updating {update.policy!r} to version {update.version} failed: "
                    f"{type(exc).__name__}: {exc}",
                ) from exc
        self.stats.weight_updates += 1
        return backend.version_of(update.policy)


def _refused_update(exc: BaseException) -> bool:
    """Whether a backend's failure to apply a weight update blames the update: a
    :class:`ConfigError` (an adapter that does not fit), a :class:`RequestError`, or a
    :class:`BackendError` that retrying cannot fix (weights missing, misnamed, misshapen).
    Backends check an update before applying any of it, so the served weights are unchanged."""
    if isinstance(exc, ConfigError | RequestError):
        return True
    return isinstance(exc, BackendError) and not exc.retryable
