"""Continuous (iteration-level) batching for the transformers backend.

With ``batching="continuous"`` the backend does not run a batch to its end: requests
join and leave the running batch at every decoding step (Orca, OSDI 2022), so a long or
slow request no longer holds the requests that arrive after it. One loop,
:meth:`ContinuousScheduler.run`, runs on the backend's torch thread while there is work;
each step it

1. drops the rows of requests that were cancelled or failed;
2. admits waiting requests (up to ``max_batch_rows`` rows in all): prefills them together
   (with prefix reuse, :mod:`~parley.arena.inference.backends.prefix_cache`) and stacks
   their KV cache under the running one, both LEFT-padded to the wider of the two (the
   attention mask hides the padding and position ids count real tokens only, as in a
   static batch, so a row computes as it would alone);
3. computes constraint masks; a constraint that runs out of the engine's work limits
   fails its own request (``ConstraintError``, a 400), not the batch;
4. samples one token per row (:func:`~parley.arena.inference.backends.transformers_sampling.sample`,
   the static loop's code: same tokens and logprobs for greedy and seeded requests);
5. answers each request whose rows all finished (its sequence kept for prefix reuse) and
   removes finished rows, trimming cache columns no live row uses;
6. runs one forward pass of the remaining rows.

The running batch's keys and values live in buffers with spare columns
(:func:`_growing_cache`): a decoding step writes its one new column in place, where
transformers' ``DynamicCache`` would copy the whole cache (``torch.cat``) at every step
and layer, and trimming unused columns moves a view's start instead of copying. The
values the model reads are the same, so are its outputs.

Constraint cost per request: each mask is bounded by the engine's per-step work limits
(:data:`~parley.arena.inference.backends.constraints.MATCHER_LIMITS`, counts of work), a
request has at most ``max_tokens`` masks per row, and a request's constraint no longer
decides when its neighbours start or finish: a neighbour that arrives while it runs joins
at the next step and leaves as soon as its own tokens are done.

Weights change between steps with no row live: :meth:`ContinuousScheduler.drain` stops
admissions, the loop finishes the live rows on the old weights and exits, and the
update runs next on the same thread; each request's ``policy_version`` is the version
at its admission.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from parley.arena.inference.backends.errors import BackendError
from parley.arena.inference.backends.transformers_sampling import Row, sample
from parley.protocols.errors import require
from parley.protocols.messages import Completion, GenerateRequest, GenerateResult

if TYPE_CHECKING:
    from parley.arena.inference.backends.transformers import TransformersBackend

torch: Any = require("torch", "torch")

__all__ = ["ContinuousScheduler", "Job", "SchedulerStats"]


@dataclasses.dataclass(eq=False)
class Job:
    """One ``generate`` call: its requests, answered together through ``future`` (on
    ``loop``) when every row of every request has finished."""

    requests: list[GenerateRequest]
    sinks: list[Callable[[int, Completion], None] | None]
    future: asyncio.Future[list[GenerateResult]]
    loop: asyncio.AbstractEventLoop
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    prompts: list[list[int]] = dataclasses.field(default_factory=list)
    rows: list[Row] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    left: int = 0  # rows not finished yet
    failed: bool = False  # answered with an error: its rows leave the batch
    submitted_step: int = 0  # the scheduler's step count when it was queued

    @property
    def dead(self) -> bool:
        """Failed or cancelled: its rows leave the batch at the next step."""
        return self.failed or self.cancelled.is_set()

    @property
    def width(self) -> int:
        """Rows this job decodes (``n`` per request)."""
        return sum(r.params.n for r in self.requests)

    def answer(self, outcome: list[GenerateResult] | BaseException) -> None:
        """Settle ``future`` from the decoding thread (ignored once it is done)."""

        def settle() -> None:
            if self.future.done():
                return
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)

        if isinstance(outcome, BaseException):
            self.failed = True
        self.loop.call_soon_threadsafe(settle)


@dataclasses.dataclass
class SchedulerStats:
    """Counters of the continuous scheduler (work, not time)."""

    steps: int = 0
    """Decoding forward passes (one token for every live row)."""
    prefills: int = 0
    """Forward passes that admitted waiting requests."""
    admitted: int = 0
    """Requests admitted."""
    max_rows: int = 0
    """Most rows decoded together."""
    waited: deque[int] = dataclasses.field(default_factory=lambda: deque(maxlen=4096))
    """Per answered request (the latest 4096): decoding steps from its submission to its
    answer, whatever else ran meanwhile (an unconstrained request of ``k`` tokens that
    joins at once waits ``k - 1`` or ``k``)."""


class ContinuousScheduler:
    """The running batch of a :class:`TransformersBackend` with ``batching="continuous"``.

    :meth:`submit`, :meth:`drain`, :meth:`resume` and :meth:`close` are called on the
    event loop; :meth:`run` on the backend's torch thread, which alone touches the batch.
    """

    def __init__(self, backend: TransformersBackend) -> None:
        self._backend = backend
        self._inbox: deque[Job] = deque()
        self._lock = threading.Lock()  # guards _inbox, _running, _draining, _closed
        self._running = False
        self._draining = False
        self._closed = False
        self.stats = SchedulerStats()
        self._live: list[Row] = []
        self._mask: Any = None  # (B, T) attention mask, 1 = a real token
        self._next_pos: Any = None  # (B, 1) position id of each row's next token
        self._cache: Any = None  # DynamicCache, (B, H, T, D) per layer
        self._logits: Any = None  # (B, V) logits of each row's next token
        self._adapters_stale = True

    # --- event loop side ---------------------------------------------------------------

    def submit(self, job: Job) -> bool:
        """Queue ``job``; True when the caller must start :meth:`run` on the torch thread."""
        with self._lock:
            if self._closed:
                raise BackendError("the backend is closed")
            job.submitted_step = self.stats.steps
            self._inbox.append(job)
            return self._claim()

    def drain(self) -> None:
        """Admit nothing until :meth:`resume`: :meth:`run` returns once the live rows end."""
        with self._lock:
            self._draining = True

    def resume(self) -> bool:
        """Admit again; True when the caller must start :meth:`run`."""
        with self._lock:
            self._draining = False
            return self._claim()

    def close(self) -> None:
        """Refuse new jobs and answer waiting ones with an error; live rows finish."""
        with self._lock:
            self._closed = self._draining = True
            waiting, self._inbox = list(self._inbox), deque()
        for job in waiting:
            job.answer(BackendError("the backend is closed"))

    def _claim(self) -> bool:
        start = bool(self._inbox) and not self._running and not self._draining
        self._running = self._running or start
        return start

    # --- torch thread ------------------------------------------------------------------

    def run(self) -> None:
        """Decode until no row is live and nothing may be admitted."""
        lora = self._backend._lora
        try:
            with torch.inference_mode():
                while True:
                    try:
                        if not self._step():
                            return
                    except Exception as exc:  # a failed forward: its rows' requests fail
                        for job in {id(r.job): r.job for r in self._live}.values():
                            job.answer(exc)
                        self._keep([])
        finally:
            lora.set_rows([])  # any other forward of the model is the base's
            with self._lock:
                # A job submitted while this loop was leaving found it running.
                again = self._running = bool(self._inbox) and not self._draining
            if again:
                self._backend._executor.submit(self.run)

    def _step(self) -> bool:
        """One scheduling step; False when the loop should end."""
        self._keep([k for k, r in enumerate(self._live) if not r.job.dead])
        self._admit()
        if not self._live:
            with self._lock:
                return bool(self._inbox) and not self._draining
        for row in self._live:
            if row.matcher is not None and not row.job.dead:
                try:
                    row.matcher.allowed()  # kept until the next advance: sample reuses it
                except BackendError as exc:  # ConstraintError: out of the work limits
                    row.job.answer(exc)
        self._keep([k for k, r in enumerate(self._live) if not r.job.dead])
        if not self._live:
            return True
        backend = self._backend
        tokens, logprobs, tops = sample(self._logits, self._live)
        keep: list[int] = []
        for k, row in enumerate(self._live):
            backend._append(row, int(tokens[k]), float(logprobs[k]), tops[k])
            if row.finish is None:
                keep.append(k)
                continue
            backend._store_prefix(row, self._cache, k, self._mask[k])
            row.job.left -= 1
            if row.job.left == 0:
                job = row.job
                self.stats.waited.append(self.stats.steps - job.submitted_step)  # before: seen
                job.answer(backend._results(job.requests, job.prompts, job.rows, job.versions))
        tokens = tokens[keep]
        self._keep(keep)
        if not self._live:
            return True
        if self._adapters_stale:
            backend._lora.set_rows([r.policy for r in self._live])
            self._adapters_stale = False
        ones = torch.ones((len(self._live), 1), dtype=self._mask.dtype)
        self._mask = torch.cat([self._mask, ones], dim=1)
        self._logits = backend._forward(tokens.view(-1, 1), self._mask, self._next_pos, self._cache)
        self._next_pos = self._next_pos + 1
        self.stats.steps += 1
        return True

    def _admit(self) -> None:
        """Prefill the jobs that fit and stack them under the running batch."""
        backend = self._backend
        jobs: list[Job] = []
        rows = len(self._live)
        with self._lock:
            while self._inbox and not self._draining:
                width = self._inbox[0].width
                if rows and rows + width > backend.max_batch_rows:
                    break
                jobs.append(self._inbox.popleft())
                rows += width
        new: list[Row] = []
        for job in jobs:
            if job.cancelled.is_set():
                continue
            try:
                job.prompts, job.rows = backend._make_rows(job.requests, job.sinks)
            except Exception as exc:  # a constraint refused at compile time: this job only
                job.answer(exc)
                continue
            job.versions = [backend.version_of(r.policy) for r in job.requests]
            job.left = len(job.rows)
            for row in job.rows:
                row.job = job
            new += job.rows
            self.stats.admitted += len(job.requests)
        if not new:
            return
        try:
            mask, next_pos, cache, logits = backend._prefill(new)
        except Exception as exc:  # e.g. out of memory: the joiners fail, the batch goes on
            for job in {id(r.job): r.job for r in new}.values():
                job.answer(exc)
            self._adapters_stale = True
            return
        self.stats.prefills += 1
        self._adapters_stale = True
        if not self._live:
            self._live, self._mask, self._next_pos = new, mask, next_pos
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            self._cache, self._logits = _growing_cache(layers, mask.shape[1]), logits
        else:
            self._stack(new, mask, next_pos, cache, logits)
        self.stats.max_rows = max(self.stats.max_rows, len(self._live))

    def _stack(self, rows: list[Row], mask: Any, next_pos: Any, cache: Any, logits: Any) -> None:
        """Append ``rows`` (their own mask, positions, cache, logits) to the running batch,
        both left-padded to the wider one."""
        width = max(self._mask.shape[1], mask.shape[1])
        self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)])
        layers = [
            (old.keys, old.values, joined.keys, joined.values)
            for old, joined in zip(self._cache.layers, cache.layers, strict=True)
        ]
        self._cache = _growing_cache(layers, width)
        self._next_pos = torch.cat([self._next_pos, next_pos])
        self._logits = torch.cat([self._logits, logits])
        self._live = self._live + rows

    def _keep(self, keep: list[int]) -> None:
        """Keep the live rows at indices ``keep``; drop cache columns no kept row uses."""
        if len(keep) == len(self._live):
            return
        self._adapters_stale = True
        self._live = [self._live[k] for k in keep]
        if not keep:
            self._mask = self._next_pos = self._cache = self._logits = None
            return
        self._cache.batch_select_indices(torch.tensor(keep, device=self._backend.device))
        self._mask, self._next_pos = self._mask[keep], self._next_pos[keep]
        self._logits = self._logits[keep]
        first = int(self._mask.argmax(dim=1).min())  # the first real column of any row
        if first > 0:
            self._mask = self._mask[:, first:]
            for layer in self._cache.layers:
                layer.trim(first)


def _pad_left(mask: Any, width: int) -> Any:
    """``mask`` (B, T) with ``width - T`` zero columns in front."""
    return torch.nn.functional.pad(mask, (width - mask.shape[1], 0))


_SPARE = 64
"""Free columns a growing cache layer keeps after its last one: a buffer is copied once
per ``_SPARE`` decoding steps, not at every step."""


def _growing_cache(layers: list[tuple[Any, ...]], width: int) -> Any:
    """A ``DynamicCache`` of growing layers (:func:`_growing_layer`), one per entry of
    ``layers``: per layer, keys and values (B, H, T, D) of each group of rows in turn,
    e.g. ``(keys, values)`` or ``(old keys, old values, joined keys, joined values)``;
    the groups are stacked, each left-padded with zeros to ``width`` positions."""
    transformers: Any = require("transformers", "torch")
    cache = transformers.DynamicCache()
    cache.layers = [_growing_layer()(layer[0::2], layer[1::2], width) for layer in layers]
    return cache


@functools.cache
def _growing_layer() -> type:
    """The class of a cache layer whose keys and values are views of buffers with spare
    columns, ``[start, end)`` of the buffer's positions (built on first use: transformers
    is imported lazily). Its :meth:`update` writes the new positions in place."""
    cache_utils: Any = require("transformers.cache_utils", "torch")

    class GrowingLayer(cache_utils.DynamicLayer):  # type: ignore[misc]
        def __init__(self, keys: list[Any], values: list[Any], width: int) -> None:
            super().__init__()
            self._k = _stacked(keys, width)  # (B, H, width + _SPARE, D)
            self._v = _stacked(values, width)
            self._start, self._end = 0, width
            self.dtype, self.device = self._k.dtype, self._k.device
            self.is_initialized = True
            self._view()

        def _view(self) -> None:
            self.keys = self._k[:, :, self._start : self._end]
            self.values = self._v[:, :, self._start : self._end]

        def update(
            self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any
        ) -> tuple[Any, Any]:
            new = key_states.shape[-2]
            if self._end + new > self._k.shape[2]:  # full: a buffer with spare columns again
                width, spare = self._end - self._start, max(_SPARE, new)
                self._k = _stacked([self.keys], width, spare)
                self._v = _stacked([self.values], width, spare)
                self._start, self._end = 0, width
            self._k[:, :, self._end : self._end + new] = key_states
            self._v[:, :, self._end : self._end + new] = value_states
            self._end += new
            self._view()
            return self.keys, self.values

        def trim(self, first: int) -> None:
            """Drop the first ``first`` positions (no row uses them): no copy."""
            self._start += first
            self._view()

        def batch_select_indices(self, indices: Any) -> None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._view()

    return GrowingLayer


def _stacked(parts: list[Any], width: int, spare: int = _SPARE) -> Any:
    """``parts`` (each (B_i, H, T_i, D)) stacked along the batch, each right-aligned at
    ``width`` positions with zeros in front, in a buffer of ``width + spare`` positions
    (the spare ones uninitialised)."""
    first = parts[0]
    rows = sum(p.shape[0] for p in parts)
    out = first.new_empty((rows, first.shape[1], width + spare, first.shape[3]))
    row = 0
    for part in parts:
        b, t = part.shape[0], part.shape[2]
        out[row : row + b, :, : width - t] = 0  # padding the mask hides; finite, as before
        out[row : row + b, :, width - t : width] = part
        row += b
    return out
