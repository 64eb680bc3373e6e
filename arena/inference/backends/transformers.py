"""The Hugging Face transformers backend: batched decoding with torch, any causal LM.

Loads a checkpoint by path or hub id with ``AutoModelForCausalLM`` / ``AutoTokenizer``
(exactly as a real model) and decodes with its own loop over the KV cache rather than
``model.generate``, because every row of a batch has its own sampling parameters
(temperature, top-p, seed, max tokens, stop strings) and its own constraint:

- prompts are LEFT-padded; the attention mask hides the padding and position ids count
  only real tokens, so a prompt decodes the same alone or in a padded batch;
- each step: constraint masks (:mod:`~parley.arena.inference.backends.constraints`:
  llguidance, the engine of vLLM's ``guidance`` backend, so both backends take one regex
  dialect and give one verdict), then
  temperature, then top-p, then one draw per row from the row's own ``torch.Generator``
  (seeded by the request), so a seeded request is reproducible whatever shares its batch;
- rows that finish leave the batch (their KV-cache rows are dropped), so a long row does
  not make short ones pay for forward passes;
- prefix reuse (:mod:`~parley.arena.inference.backends.prefix_cache`): each request
  prefills only the tokens past the longest prefix it shares with a recent sequence (its
  own previous turn, usually), whose keys and values are kept under a byte budget;
- ``top_logprobs = k`` lists the ``k`` largest entries of the distribution the token was
  drawn from (after the constraint mask, temperature and top-p): under a constraint the
  alternatives are the tokens the constraint allows at that step, renormalised as the
  sampled token's logprob is, and masked tokens (probability 0) are never listed;
- with ``sinks`` (HTTP streaming) each row's new token goes to its sink after every
  decoding step (handed to the event loop thread-safely), while the batch keeps decoding.

With ``batching="continuous"``, requests of every call join and leave one running batch
at each decoding step instead
(:mod:`~parley.arena.inference.backends.transformers_sched`), with the same tokens and
logprobs as a static batch.

Generation runs in one dedicated worker thread under a lock: the event loop stays free,
weight updates happen between batches, and torch always computes on the same OS thread
(each new thread would start another OpenMP team, whose warm-up and spinning cost
seconds on a small, busy CPU). Cancelling a ``generate`` call
stops its decoding loop at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from parley.arena.inference.backends.base import Backend, BackendError, RequestError, TokenSink
from parley.arena.inference.backends.constraints import TokenMatcher, TokenVocab
from parley.arena.inference.backends.cpu_attention import prepare_cpu_attention
from parley.arena.inference.backends.lora import LoraAdapters
from parley.arena.inference.backends.prefix_cache import (
    PrefixCache,
    batch_prefill,
    row_kv,
    supported,
)
from parley.arena.inference.backends.tokenizer import (
    HFChatTokenizer,
    load_causal_lm,
    load_tokenizer,
)
from parley.arena.inference.backends.transformers_sampling import Row, sample
from parley.arena.inference.backends.transformers_sched import ContinuousScheduler, Job
from parley.arena.inference.backends.weight_checks import WEIGHT_LIMIT
from parley.protocols.errors import ConfigError, require
from parley.protocols.messages import (
    Completion,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)

torch: Any = require("torch", "torch")

__all__ = ["TransformersBackend"]


class _Cancelled(Exception):
    """Raised inside the decoding thread when the awaiting coroutine was cancelled."""


class TransformersBackend(Backend):
    """A causal LM from ``transformers`` decoding batches on one device.

    Construct with :meth:`create` (loads by path or hub id) or directly from a loaded
    ``model`` and tokenizer (e.g. a trainer sharing its model in-process).
    ``max_batch_rows`` caps the rows (requests x n) decoded together; larger batches are
    split. ``seed`` seeds the draws of requests that carry no seed of their own.
    ``num_threads``: torch intra-op threads of the decoding thread only (the setting is
    per thread, so the rest of the process keeps its own); default 1 for models under
    50 M parameters on the CPU, torch's default otherwise.

    LoRA adapters (:meth:`add_adapter`, :mod:`~parley.arena.inference.backends.lora`):
    requests of every adapter and of the base decode together; ``max_lora_rank`` is the
    largest rank accepted. Adding one modifies ``model`` in place (peft wraps its layers).

    ``batching``: ``"static"`` (a ``generate`` call decodes its requests to their end;
    calls run one after the other) or ``"continuous"`` (requests of every call join and
    leave one running batch at each decoding step,
    :mod:`~parley.arena.inference.backends.transformers_sched`).

    ``prefix_cache_bytes``: the KV bytes kept for prefix reuse (0 turns it off; models
    with sliding-window or recurrent layers never use it); ``prefix_cache.stats`` counts
    prompt and prefilled tokens.
    """

    kind = "transformers"
    streams_tokens = True
    supports_adapters = True

    def __init__(
        self,
        model: Any,
        tokenizer: HFChatTokenizer,
        *,
        max_batch_rows: int = 256,
        seed: int = 0,
        num_threads: int | None = None,
        max_lora_rank: int = 64,
        weight_limit: float = WEIGHT_LIMIT,
        prefix_cache_bytes: int = 256 << 20,
        batching: str = "static",
    ) -> None:
        super().__init__()
        self.model = model.eval()
        self._step_mask_4d = prepare_cpu_attention(model)
        self._lora = LoraAdapters(model, max_rank=max_lora_rank, weight_limit=weight_limit)
        if num_threads is None:
            # Small models gain nothing from intra-op parallelism and lose a lot to it on
            # a busy CPU (threads wait for each other at every op); big ones need it.
            size = sum(p.numel() for p in model.parameters())
            small = size < 50_000_000 and _on_cpu(model)
            num_threads = 1 if small else torch.get_num_threads()
        self.num_threads = num_threads
        self._tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self._rng = np.random.default_rng(seed)
        self._lock = asyncio.Lock()
        self._executor = _torch_thread(num_threads)
        self._closed = False
        self.device = next(model.parameters()).device
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        width = int(model.get_output_embeddings().weight.shape[0])
        eos = tokenizer.eos_token_id
        self._eos: set[int] = set() if eos is None else {eos}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if gen_eos is not None:
            self._eos |= set(gen_eos) if isinstance(gen_eos, list) else {int(gen_eos)}
        self._vocab = TokenVocab(tokenizer.hf, width, -1 if eos is None else eos)
        self._context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        # transformers >= 5.20 renamed the forward argument `past_key_values` to `cache`.
        forward_args = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self.prefix_cache = PrefixCache(prefix_cache_bytes if supported(model) else 0)
        if batching not in ("static", "continuous"):
            raise ConfigError(f"batching is 'static' or 'continuous', got {batching!r}")
        self.batching = batching
        self._sched = ContinuousScheduler(self) if batching == "continuous" else None
        # The pool then submits each request on its own call (no waiting to fill a batch).
        self.continuous_batching = self._sched is not None
        # Work counters: model forward passes, and rows x attended positions over them.
        self.forward_passes = 0
        self.attended_slots = 0

    @classmethod
    async def create(
        cls,
        model: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_rows: int = 256,
        seed: int = 0,
        num_threads: int | None = None,
        tokenizer: str | None = None,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        max_lora_rank: int = 64,
        weight_limit: float = WEIGHT_LIMIT,
        prefix_cache_bytes: int = 256 << 20,
        batching: str = "static",
    ) -> TransformersBackend:
        """Load ``model`` (path or hub id) onto ``device``.

        ``dtype``: a torch dtype name, by default ``"float32"``, the dtype parley's trainers
        compute in, so recorded logprobs are the trainer's on every device; ``"auto"`` is
        float32 on CPU and the checkpoint's dtype elsewhere (faster on a GPU, but its
        logprobs then differ from a float32 trainer's). ``tokenizer``: a different path/id
        for the tokenizer. ``weight_limit``: the largest magnitude an adapter or weight
        update may hold (:mod:`~parley.arena.inference.backends.weight_checks`).
        """
        require("transformers", "torch")  # the install hint, before the worker thread

        def load() -> TransformersBackend:
            tok = load_tokenizer(tokenizer or model, trust_remote_code=trust_remote_code)
            if dtype == "auto":
                torch_dtype = torch.float32 if device == "cpu" else "auto"
            else:
                torch_dtype = getattr(torch, dtype)
            kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
            if attn_implementation:
                kwargs["attn_implementation"] = attn_implementation
            try:
                hf_model = load_causal_lm(model, **kwargs)
            except OSError as exc:
                raise BackendError(
                    f"cannot load model {model!r}: {exc}. Pass a directory with config.json "
                    "and weights (e.g. one made by `parley model tiny DIR`) or a hub id "
                    "available offline"
                ) from exc
            return cls(
                hf_model.to(device),
                tok,
                max_batch_rows=max_batch_rows,
                seed=seed,
                num_threads=num_threads,
                max_lora_rank=max_lora_rank,
                weight_limit=weight_limit,
                prefix_cache_bytes=prefix_cache_bytes,
                batching=batching,
            )

        backend = await asyncio.to_thread(load)
        # Warm up on the decoding thread itself: its first forward passes pay the set-up.
        await asyncio.get_running_loop().run_in_executor(backend._executor, backend._warm_up)
        return backend

    # --- Backend surface ---------------------------------------------------------------

    @property
    def tokenizer(self) -> HFChatTokenizer:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._context

    def validate(self, request: GenerateRequest) -> None:
        super().validate(request)
        self.check_prompt(request, self._vocab.size)
        if request.constraint is not None:
            if self._vocab.eos_id < 0:
                raise RequestError("constraint", "constraints need a tokenizer with an eos token")
            # Refuses (ConstraintError, a RequestError) a constraint that is invalid, over
            # the engine's work limits, or that allows no first token of this vocabulary:
            # the same verdict at any load (the engine counts work, not time).
            TokenMatcher(self._vocab, request.constraint)

    async def generate(
        self,
        requests: Sequence[GenerateRequest],
        *,
        sinks: Sequence[TokenSink | None] | None = None,
    ) -> list[GenerateResult]:
        if self._closed:
            raise BackendError("the backend is closed")
        for request in requests:
            self.validate(request)
        if not requests:
            return []
        loop = asyncio.get_running_loop()
        safe = [None if k is None else _threadsafe(loop, k) for k in sinks or ()]
        if self._sched is not None:
            job = Job(list(requests), safe, loop.create_future(), loop)
            if self._sched.submit(job):
                loop.run_in_executor(self._executor, self._sched.run)
            try:
                return await job.future
            finally:
                job.cancelled.set()  # a no-op once answered; else its rows leave the batch
        async with self._lock:
            versions = [self.version_of(r.policy) for r in requests]
            cancel = threading.Event()
            work = loop.run_in_executor(
                self._executor, self._generate_sync, list(requests), cancel, safe
            )
            try:
                prompts, rows = await asyncio.shield(work)
            except asyncio.CancelledError:
                cancel.set()
                # The thread stops at its next step; keep the lock until it has.
                await asyncio.wait([work])
                if not work.cancelled():
                    work.exception()  # retrieved: it is the expected _Cancelled
                raise
        return self._results(requests, prompts, rows, versions)

    @property
    def adapters(self) -> dict[str, int]:
        return dict(self._lora.versions)

    @contextlib.asynccontextmanager
    async def _between_steps(self) -> AsyncIterator[None]:
        """Hold the backend for a weight change: static calls wait for the running batch;
        the continuous scheduler admits nothing and its loop ends with the live rows (on
        the old weights) before the change, queued after it on the torch thread, runs."""
        async with self._lock:
            if self._sched is not None:
                self._sched.drain()
            try:
                yield
            finally:
                if self._sched is not None and self._sched.resume():
                    asyncio.get_running_loop().run_in_executor(self._executor, self._sched.run)

    async def add_adapter(self, policy: str, path: str) -> None:
        async with self._between_steps():
            if self._closed:
                raise BackendError("the backend is closed")
            run = asyncio.get_running_loop().run_in_executor
            await run(self._executor, self._lora.add, policy, path)
            await run(self._executor, self.prefix_cache.clear, policy)  # base-computed until now

    async def update_weights(self, update: WeightUpdate) -> None:
        async with self._between_steps():
            run = asyncio.get_running_loop().run_in_executor
            # Cached keys and values were computed by the old weights: the base's are under
            # every adapter too. Cleared on the decoding thread, the cache's only user.
            stale = update.policy if update.policy in self._lora.versions else None
            await run(self._executor, self.prefix_cache.clear, stale)
            if update.policy in self._lora.versions:
                await run(self._executor, self._lora.update, update.policy, update)
                self._lora.versions[update.policy] = update.version
            else:
                await run(self._executor, self._load_weights, update)
                self.policy_version = update.version

    async def close(self) -> None:
        if self._sched is not None:
            self._sched.close()  # answers waiting jobs; live rows finish on the thread
            # The thread runs tasks in order: this one once the scheduler's loop has ended.
            await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)
        async with self._lock:
            self._closed = True
            self.model = None
            self._lora = LoraAdapters(None)  # drops the adapters and the base they hold
            self._executor.shutdown(wait=False)

    # --- weights -----------------------------------------------------------------------

    def _load_weights(self, update: WeightUpdate) -> None:
        if update.path:
            safetensors: Any = require("safetensors.torch", "torch")
            path = Path(update.path)
            files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
            if not files or not all(f.is_file() for f in files):
                raise BackendError(f"no safetensors weights at {update.path}")
            state: dict[str, Any] = {}
            for f in files:
                state.update(safetensors.load_file(str(f)))
        else:
            state = {k: torch.from_numpy(np.asarray(v)) for k, v in update.tensors.items()}
        self._lora.load_base(state)  # checks every name, shape and value before copying

    # --- decoding ----------------------------------------------------------------------

    def _warm_up(self) -> None:
        """Decode two short padded rows once: torch's first forward pays seconds of lazy
        kernel set-up, which would otherwise land on the first real request. The constraint
        engine's view of the vocabulary is built here too (about a second for 150k tokens),
        rather than on the event loop at the first constrained request."""
        if self._vocab.eos_id >= 0:
            _ = self._vocab.ll
        request = GenerateRequest(
            prompt_token_ids=[self._tokenizer.pad_token_id] * 2,
            params=SamplingParams(temperature=0, max_tokens=2, n=2, seed=0),
        )
        self._generate_sync([request], threading.Event())
        self.prefix_cache.clear()
        self.prefix_cache.reset_stats()

    def _prompt_ids(self, request: GenerateRequest) -> list[int]:
        if request.prompt_token_ids:
            return list(request.prompt_token_ids)
        ids = self._tokenizer.encode(request.prompt)
        if len(ids) >= self._context:
            raise BackendError(f"prompt of {len(ids)} tokens exceeds the context {self._context}")
        return [int(t) for t in ids]

    def _generate_sync(
        self,
        requests: list[GenerateRequest],
        cancel: threading.Event,
        sinks: Sequence[Callable[[int, Completion], None] | None] = (),
    ) -> tuple[list[list[int]], list[Row]]:
        prompts, rows = self._make_rows(requests, sinks)
        try:
            with torch.inference_mode():
                for start in range(0, len(rows), self.max_batch_rows):
                    self._decode(rows[start : start + self.max_batch_rows], cancel)
        finally:
            self._lora.set_rows([])  # any other forward of the model is the base's
        return prompts, rows

    def _make_rows(
        self,
        requests: Sequence[GenerateRequest],
        sinks: Sequence[Callable[[int, Completion], None] | None] = (),
    ) -> tuple[list[list[int]], list[Row]]:
        """The prompt ids of ``requests`` and their rows (``n`` per request, in order), each
        with its own generator (seeded by the request, or by the backend's ``seed``) and
        constraint matcher (raises :class:`ConstraintError` for a constraint it refuses)."""
        prompts = [self._prompt_ids(r) for r in requests]
        rows: list[Row] = []
        for i, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
            p = request.params
            for j in range(p.n):
                seed = p.seed + j if p.seed is not None else int(self._rng.integers(2**62))
                rows.append(
                    Row(
                        request=i,
                        prompt=prompt,
                        params=p,
                        generator=torch.Generator().manual_seed(seed),
                        matcher=None
                        if request.constraint is None
                        else TokenMatcher(self._vocab, request.constraint),
                        max_tokens=min(p.max_tokens, self._context - len(prompt)),
                        index=j,
                        sink=sinks[i] if i < len(sinks) else None,
                        policy=request.policy,
                    )
                )
        return prompts, rows

    def _decode(self, rows: list[Row], cancel: threading.Event) -> None:
        """Decode ``rows`` together until each one finishes; fills their fields."""
        mask, next_pos, cache, logits = self._prefill(rows)
        live = list(rows)
        while True:
            if cancel.is_set():
                raise _Cancelled
            tokens, logprobs, tops = sample(logits, live)
            keep: list[int] = []
            for k, row in enumerate(live):
                self._append(row, int(tokens[k]), float(logprobs[k]), tops[k])
                if row.finish is None:
                    keep.append(k)
                else:
                    self._store_prefix(row, cache, k, mask[k])
            if not keep:
                return
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, next_pos, tokens = mask[keep], next_pos[keep], tokens[keep]
                live = [live[k] for k in keep]
                self._lora.set_rows([r.policy for r in live])
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype)], dim=1)
            logits = self._forward(tokens.view(-1, 1), mask, next_pos, cache)
            next_pos = next_pos + 1

    def _prefill(self, rows: list[Row]) -> tuple[Any, Any, Any, Any]:
        """Look up each row's cached prefix and run the rest of its prompt: returns the
        attention mask (B, T), the next position ids (B, 1), the KV cache and the logits of
        each row's first token (B, V). Leaves the adapters set for ``rows``."""
        hits = [self.prefix_cache.lookup(r.policy, r.prompt) for r in rows]
        for row, (entry, _) in zip(rows, hits, strict=True):
            row.hit = entry
        prompts = [r.prompt for r in rows]
        ids, mask, positions, cache = batch_prefill(prompts, hits, self._tokenizer.pad_token_id)
        self._lora.set_rows([r.policy for r in rows])
        logits = self._forward(ids, mask, positions, cache)
        return mask, positions[:, -1:] + 1, cache, logits

    def _store_prefix(self, row: Row, cache: Any, k: int, mask_row: Any) -> None:
        """Keep the keys and values of finished ``row`` (batch row ``k`` of ``cache``) for
        prefix reuse: one entry per request, from its first completion."""
        if row.index == 0 and self.prefix_cache.budget:
            fed = (row.prompt + row.tokens)[: int(mask_row.sum())]
            self.prefix_cache.store(row.policy, fed, row_kv(cache, k, mask_row), row.hit)

    def _forward(self, ids: Any, mask: Any, positions: Any, cache: Any) -> Any:
        """One model step; returns the last position's logits as float32, (B, V)."""
        self.forward_passes += 1
        self.attended_slots += int(mask.numel())  # padding included: work done, not useful
        if ids.shape[1] == 1 and self._step_mask_4d:
            mask = mask[:, None, None, :].bool()
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=True,
            **{self._cache_arg: cache},
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def _append(
        self, row: Row, token: int, logprob: float, top: tuple[list[int], list[float]] | None
    ) -> None:
        """Record one token of ``row`` and decide whether the row is finished."""
        if not np.isfinite(logprob):
            # Only a constraint with no allowed token gets here (every logit masked).
            row.finish = "error"
            return
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if top is not None:
            row.top_ids.append(top[0])
            row.top_logprobs.append(top[1])
        if row.sink is not None:
            delta = Completion(text="", token_ids=[token], logprobs=[logprob])
            if top is not None:
                delta.top_token_ids, delta.top_logprobs = [top[0]], [top[1]]
            row.sink(row.index, delta)
        if row.matcher is not None:
            row.matcher.advance(token)
        if token in self._eos:
            row.finish = "stop"
            return
        if row.params.stop:
            text = self._tokenizer.decode(row.tokens)
            cut = min((i for i in (text.find(s) for s in row.params.stop) if i >= 0), default=-1)
            if cut >= 0:
                row.text = text[:cut]
                row.finish = "stop"
                return
        if len(row.tokens) >= row.max_tokens:
            row.finish = "length"

    def _results(
        self,
        requests: Sequence[GenerateRequest],
        prompts: list[list[int]],
        rows: list[Row],
        versions: list[int],
    ) -> list[GenerateResult]:
        completions: list[list[Completion]] = [[] for _ in requests]
        for row in rows:
            text = row.text if row.text is not None else self._tokenizer.decode(row.tokens)
            completions[row.request].append(
                Completion(
                    text=text,
                    token_ids=row.tokens,
                    logprobs=row.logprobs if row.params.logprobs else [],
                    finish_reason=row.finish or "error",
                    top_token_ids=row.top_ids,
                    top_logprobs=row.top_logprobs,
                )
            )
        return [
            GenerateResult(
                policy=r.policy,
                policy_version=version,
                prompt_token_ids=prompt,
                completions=c,
            )
            for r, prompt, c, version in zip(requests, prompts, completions, versions, strict=True)
        ]


def _on_cpu(model: Any) -> bool:
    """Whether ``model``'s parameters live on the CPU."""
    return bool(next(model.parameters()).device.type == "cpu")


def _torch_thread(num_threads: int) -> ThreadPoolExecutor:
    """The one thread a backend runs torch on, with its own intra-op thread count."""
    return ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix="parley-torch",
        initializer=torch.set_num_threads,
        initargs=(num_threads,),
    )


def _threadsafe(loop: asyncio.AbstractEventLoop, sink: TokenSink) -> TokenSink:
    """``sink`` called on ``loop`` from the decoding thread."""

    def send(index: int, delta: Completion) -> None:
        loop.call_soon_threadsafe(sink, index, delta)

    return send
