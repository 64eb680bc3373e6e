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

The running batch's keys and values live in buffers with spare columns and spare rows
(:func:`_growing_cache`): a decoding step writes its one new column in place, where
transformers' ``DynamicCache`` would copy the whole cache (``torch.cat``) at every step
and layer; trimming unused columns moves a view's start; joining rows are written into
free rows after the live ones, and a leaving row's place is taken by the last live row
(one row copied, not the batch). The live rows' order changes, not what each row
computes: the values the model reads are the same, so are its outputs.

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
        tokens = tokens[self._keep(keep)]
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
            self._cache = _growing_cache(layers, backend.max_batch_rows)
            self._logits = logits
        else:
            self._stack(new, mask, next_pos, cache, logits)
        self.stats.max_rows = max(self.stats.max_rows, len(self._live))

    def _stack(self, rows: list[Row], mask: Any, next_pos: Any, cache: Any, logits: Any) -> None:
        """Append ``rows`` (their own mask, positions, cache, logits) to the running batch,
        both left-padded to the wider one."""
        width = max(self._mask.shape[1], mask.shape[1])
        self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)])
        for old, joined in zip(self._cache.layers, cache.layers, strict=True):
            old.join(joined.keys, joined.values)
        self._next_pos = torch.cat([self._next_pos, next_pos])
        self._logits = torch.cat([self._logits, logits])
        self._live = self._live + rows

    def _keep(self, keep: list[int]) -> list[int]:
        """Keep the live rows at indices ``keep`` (ascending); drop cache columns no kept row
        uses. Returns the kept rows' new order, as indices of the old rows: a dropped row's
        place goes to the last kept row (so the cache moves one row per dropped row)."""
        if len(keep) == len(self._live):
            return keep
        self._adapters_stale = True
        if not keep:
            self._live = []
            self._mask = self._next_pos = self._cache = self._logits = None
            return []
        order, holes, tails = _swap_order(keep)
        for layer in self._cache.layers:
            layer.move(holes, tails, len(keep))
        self._live = [self._live[k] for k in order]
        self._mask, self._next_pos = self._mask[order], self._next_pos[order]
        self._logits = self._logits[order]
        first = int(self._mask.argmax(dim=1).min())  # the first real column of any row
        if first > 0:
            self._mask = self._mask[:, first:]
            for layer in self._cache.layers:
                layer.trim(first)
        return order


def _swap_order(keep: list[int]) -> tuple[list[int], list[int], list[int]]:
    """For kept row indices ``keep`` (ascending): the new order (old index of each new
    row), and the rows that move, from ``tails`` (kept, past the new end) into ``holes``
    (dropped, before it)."""
    n, kept = len(keep), set(keep)
    holes = [i for i in range(n) if i not in kept]
    tails = [k for k in keep if k >= n]
    order = list(range(n))
    for hole, tail in zip(holes, tails, strict=True):
        order[hole] = tail
    return order, holes, tails


def _pad_left(mask: Any, width: int) -> Any:
    """``mask`` (B, T) with ``width - T`` zero columns in front."""
    return torch.nn.functional.pad(mask, (width - mask.shape[1], 0))


_SPARE = 64
"""Free columns a growing cache layer keeps after its last one: a buffer is copied once
per ``_SPARE`` decoding steps, not at every step."""


def _growing_cache(layers: list[tuple[Any, Any]], max_rows: int) -> Any:
    """A ``DynamicCache`` of growing layers (:func:`_growing_layer`), one per entry of
    ``layers``, the (keys, values) (B, H, T, D) of its first rows; more rows join later,
    up to ``max_rows`` live (the spare rows of a buffer)."""
    transformers: Any = require("transformers", "torch")
    cache = transformers.DynamicCache()
    cache.layers = [_growing_layer()(keys, values, max_rows) for keys, values in layers]
    return cache


@functools.cache
def _growing_layer() -> type:
    """The class of a cache layer whose keys and values are views of buffers with spare
    rows and columns: rows ``[0, rows)``, positions ``[start, end)`` of the buffer (built on
    first use: transformers is imported lazily). :meth:`update` writes the new positions
    in place, :meth:`join` writes new rows into spare ones, :meth:`move` fills the places
    of dropped rows with rows from the end. Buffers start zeroed and only ever receive
    keys and values, so a position the mask hides holds a finite value (a stale one, a
    zero) that it multiplies by 0."""
    cache_utils: Any = require("transformers.cache_utils", "torch")

    class GrowingLayer(cache_utils.DynamicLayer):  # type: ignore[misc]
        def __init__(self, keys: Any, values: Any, max_rows: int) -> None:
            super().__init__()
            self._max_rows = max(max_rows, keys.shape[0])
            self._k, self._v = keys[:0], values[:0]  # (0, H, 0, D): no rows yet
            self._rows = self._start = self._end = 0
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self._view()
            self.join(keys, values)

        def _view(self) -> None:
            self.keys = self._k[: self._rows, :, self._start : self._end]
            self.values = self._v[: self._rows, :, self._start : self._end]

        def _reallocate(self, rows: int, front: int, spare: int = _SPARE) -> None:
            """New zeroed buffers of ``rows`` rows holding the live view at ``front``."""
            width = self._end - self._start
            shape = (rows, self._k.shape[1], front + width + spare, self._k.shape[3])
            k, v = self._k.new_zeros(shape), self._v.new_zeros(shape)
            k[: self._rows, :, front : front + width] = self.keys
            v[: self._rows, :, front : front + width] = self.values
            self._k, self._v = k, v
            self._start, self._end = front, front + width

        def update(
            self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any
        ) -> tuple[Any, Any]:
            new = key_states.shape[-2]
            if self._end + new > self._k.shape[2]:  # full: spare columns again
                self._reallocate(self._k.shape[0], 0, max(_SPARE, new))
            self._k[: self._rows, :, self._end : self._end + new] = key_states
            self._v[: self._rows, :, self._end : self._end + new] = value_states
            self._end += new
            self._view()
            return self.keys, self.values

        def join(self, keys: Any, values: Any) -> None:
            """Add rows (B, H, T, D) after the live ones, their last position at the live
            ones' last; the narrower side gets masked positions in front."""
            rows, width = keys.shape[0], keys.shape[2]
            wider = max(0, width - (self._end - self._start))
            total = self._rows + rows
            if total > self._k.shape[0] or self._start < wider:
                room = max(self._k.shape[0], min(2 * total, self._max_rows), total)
                self._reallocate(room, wider)
            self._start -= wider
            first = self._end - width
            self._k[self._rows : total, :, self._start : first] = 0
            self._v[self._rows : total, :, self._start : first] = 0
            self._k[self._rows : total, :, first : self._end] = keys
            self._v[self._rows : total, :, first : self._end] = values
            self._rows = total
            self._view()

        def move(self, holes: list[int], tails: list[int], rows: int) -> None:
            """Keep ``rows`` rows: rows ``tails`` take the places ``holes``."""
            if holes:
                to = torch.tensor(holes, device=self._k.device)
                src = torch.tensor(tails, device=self._k.device)
                live = slice(self._start, self._end)
                self._k[to, :, live] = self._k[src, :, live]
                self._v[to, :, live] = self._v[src, :, live]
            self._rows = rows
            self._view()

        def trim(self, first: int) -> None:
            """Drop the first ``first`` positions (no row uses them): no copy."""
            self._start += first
            self._view()

        def batch_select_indices(self, indices: Any) -> None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._rows = len(indices)
            self._view()

    return GrowingLayer
