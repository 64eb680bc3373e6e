"""The inference backend contract: one batch interface over vLLM, transformers and HTTP.

A :class:`Backend` serves one policy (one model, one set of weights). The inference pool
collects :class:`~parley.protocols.messages.GenerateRequest` messages from every agent and
hands them to :meth:`Backend.generate` in batches; the backend returns one
:class:`~parley.protocols.messages.GenerateResult` per request, in the same order
(list in, list out, same order).

Request semantics shared by every backend:

- The prompt is ``prompt_token_ids`` when non-empty, otherwise ``prompt`` text encoded with
  the tokenizer's defaults. Chat prompts are built with :meth:`ChatTokenizer.encode_chat`.
- ``params.temperature == 0`` is greedy decoding; ``params.n`` completions per request;
  ``params.seed`` makes a request reproducible on its own (completion ``j`` of a request
  with seed ``s`` uses seed ``s + j``), whatever else is in the batch.
- ``params.stop``: generation ends when the text contains a stop string; the text is cut
  before the stop string, the token ids keep the token that completed it (what the model
  actually produced, which is what a trainer needs).
- An end-of-sequence token ends a completion with ``finish_reason="stop"`` and is kept in
  ``token_ids`` (and its logprob in ``logprobs``) but not in ``text``; reaching
  ``max_tokens`` gives ``"length"``.
- ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the distribution it was
  sampled from (after the constraint mask, temperature and top-p; greedy rows use the
  temperature-1 distribution, so a greedy token's logprob is the row's maximum).
- ``params.top_logprobs = k`` > 0 adds, per generated token, the ``k`` most likely tokens
  of that same distribution and their logprobs (``Completion.top_token_ids`` /
  ``top_logprobs``, most likely first). Tokens the constraint or top-p exclude have
  probability 0 there and are never listed, so a list may hold fewer than ``k``.
- ``constraint`` restricts the output (choice / regex / JSON schema); see
  :mod:`parley.arena.inference.backends.constraints` for what each backend supports.

Invalid requests (a field out of range, an empty prompt, a prompt longer than the context,
a malformed or unsatisfiable constraint) are rejected by :meth:`Backend.validate` with a
:class:`RequestError` that names the field and says what to change
(:mod:`~parley.arena.inference.backends.limits` lists every range); the pool calls it on
receipt, so one bad request never reaches a batch, and if a batch fails anyway the pool
retries its members one by one, so one request never fails another.
"""

from __future__ import annotations

import asyncio
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from parley.arena.inference.backends.constraints import check_constraint
from parley.arena.inference.backends.errors import BackendError, RequestError
from parley.arena.inference.backends.limits import check_request
from parley.protocols.errors import ConfigError
from parley.protocols.messages import (
    Completion,
    Constraint,
    GenerateRequest,
    GenerateResult,
    WeightUpdate,
)

__all__ = [
    "Backend",
    "BackendError",
    "RequestError",
    "ChatTokenizer",
    "BACKENDS",
    "load_backend",
    "TokenSink",
]

TokenSink = Callable[[int, Completion], None]
"""Receives a completion's tokens while it is generated: ``sink(j, delta)`` with the
completion's index ``j`` in its request and a :class:`Completion` holding only the new
``token_ids`` / ``logprobs`` / ``top_*`` (``text`` empty). Called on the event loop; the
deltas of completion ``j`` join to its final ``token_ids`` unless the backend had to run
the request again (an engine restart), which the receiver must check."""


@runtime_checkable
class ChatTokenizer(Protocol):
    """The tokenizer surface agents and the pool use (a Hugging Face tokenizer wrapper)."""

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token id, if the tokenizer has one."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` exactly as a text prompt is encoded (tokenizer defaults)."""
        ...

    def encode_chat(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a chat (``[{"role": ..., "content": ...}]``) via the chat template."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        ...


class Backend(ABC):
    """One policy behind a batch interface. Subclasses override the abstract methods.

    ``policy_version`` starts at 0 and is set by :meth:`update_weights` to the update's
    ``version``; every result carries the version of the weights that produced it.
    ``continuous_batching`` tells the pool whether the backend schedules concurrent
    ``generate`` calls itself (vLLM): then the pool may submit small batches without
    waiting; otherwise calls are serialised and the pool should gather large batches.

    Each concrete backend also provides ``async classmethod create(model, **options)``,
    the loader :func:`load_backend` calls (loading is slow, hence a coroutine factory
    that runs blocking work off the event loop, rather than ``__init__``).
    """

    kind: str = ""
    """The name :func:`load_backend` knows this backend by."""

    continuous_batching: bool = False

    streams_tokens: bool = False
    """Whether :meth:`generate` accepts ``sinks`` (one :data:`TokenSink` or None per
    request) and feeds them tokens as they are generated; the pool passes sinks only to
    backends that do."""

    supports_adapters: bool = False
    """Whether :meth:`add_adapter` can serve LoRA adapters on this backend's base model
    (requests of different adapters then share batches)."""

    def __init__(self) -> None:
        self.policy_version: int = 0
        self.dtype: str = ""
        """The dtype the weights compute in (``"float32"``, ...); empty when unknown (HTTP).
        Generation and training must agree on it, or recorded logprobs are off-policy."""
        self.failure: str = ""
        """Set (to the reason) when the backend can serve no request any more, e.g. its
        engine process died and could not be restarted. The pool then answers every
        request ``backend_failed`` with it at once, and ``parley serve`` exits."""

    @property
    @abstractmethod
    def tokenizer(self) -> ChatTokenizer:
        """The policy's tokenizer; raises :class:`BackendError` if the backend has none."""

    @property
    @abstractmethod
    def max_context(self) -> int:
        """Longest prompt + completion, in tokens, the model accepts."""

    @abstractmethod
    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        """Complete every request; one result per request, in request order.

        A request whose ``policy`` names one of :attr:`adapters` decodes with that adapter
        (and its result carries ``version_of(policy)``); any other request uses the base.

        Backends with :attr:`streams_tokens` also take ``sinks=`` (keyword, a sequence
        parallel to ``requests`` of :data:`TokenSink` or None).

        Raises :class:`BackendError` when the batch cannot be served at all; requests that
        pass :meth:`validate` never make the batch fail on their own.
        """

    @abstractmethod
    async def update_weights(self, update: WeightUpdate) -> None:
        """Load new weights (``update.path`` or ``update.tensors``), then set
        ``policy_version = update.version``. Generations already running finish on the
        old weights and report the old version.

        When ``update.policy`` names one of :attr:`adapters`, only that adapter's tensors
        change and only ``version_of(update.policy)`` is set (see :meth:`add_adapter`)."""

    async def close(self) -> None:
        """Release the model, engine processes and connections. Idempotent."""

    # --- adapters (per-seat LoRA; defaults for backends without adapter support) ------

    @property
    def adapters(self) -> dict[str, int]:
        """Adapter name -> the version of its weights (empty without adapters)."""
        return {}

    def version_of(self, policy: str) -> int:
        """The weights version serving ``policy``: its adapter's version when ``policy``
        is an adapter of this backend, otherwise ``policy_version`` (the base model)."""
        return self.adapters.get(policy, self.policy_version)

    async def add_adapter(self, policy: str, path: str) -> None:
        """Load the PEFT adapter directory ``path`` (``adapter_config.json`` +
        ``adapter_model.safetensors``) and serve it under the name ``policy``, version 0.

        From then on a request whose ``policy`` is ``policy`` decodes with the adapter
        (batched with requests of other adapters and of the base), and a
        :class:`WeightUpdate` whose ``policy`` is ``policy`` replaces only that adapter's
        tensors (``update.tensors`` named as ``peft.get_peft_model_state_dict`` names them,
        or ``update.path``: such a .safetensors file or an adapter directory), bumping only
        ``version_of(policy)``.

        Raises :class:`~parley.protocols.errors.ConfigError` when the backend serves no
        adapters (this default), when the adapter does not fit the base model (another
        base, rank above the backend's limit, unknown target modules), or when ``policy``
        is taken; the backend then serves exactly what it served before.
        """
        raise ConfigError(
            f"the {self.kind or type(self).__name__} backend cannot serve LoRA adapters "
            f"(asked to load {path!r} as {policy!r}); use the transformers or vllm backend"
        )

    def validate(self, request: GenerateRequest) -> None:
        """Raise :class:`BackendError` (not retryable) if ``request`` cannot be served.

        The default checks every field's range
        (:func:`~parley.arena.inference.backends.limits.check_request`) and the constraint
        (:meth:`check_constraint`), raising :class:`RequestError` naming the field;
        backends add their own limits (vocabulary, context).
        """
        check_request(request)
        if request.constraint is not None:
            try:
                self.check_constraint(request.constraint)
            except RequestError:
                raise
            except BackendError as exc:
                raise RequestError("constraint", str(exc)) from exc

    def check_prompt(self, request: GenerateRequest, vocab_size: int) -> None:
        """Raise :class:`RequestError` when the prompt (``prompt_token_ids``, else ``prompt``
        encoded by :attr:`tokenizer`) holds a token outside ``[0, vocab_size)`` or leaves no
        room in :attr:`max_context` for one new token: the limits a backend that tokenizes
        locally adds in its :meth:`validate`."""
        ids = request.prompt_token_ids or self.tokenizer.encode(request.prompt)
        if not all(0 <= t < vocab_size for t in ids):
            raise RequestError(
                "prompt_token_ids", f"prompt_token_ids outside the vocabulary [0, {vocab_size})"
            )
        if len(ids) >= self.max_context:
            raise RequestError(
                "prompt",
                f"prompt of {len(ids)} tokens does not fit the context of {self.max_context} "
                "(prompt + at least one new token); shorten the prompt",
            )

    def check_constraint(self, constraint: Constraint) -> None:
        """Raise :class:`BackendError` if this backend cannot enforce ``constraint``.

        The default accepts what :mod:`parley.arena.inference.backends.constraints` compiles.
        """
        check_constraint(constraint)

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


BACKENDS: dict[str, tuple[str, str]] = {
    "transformers": ("parley.arena.inference.backends.transformers:TransformersBackend", "torch"),
    "vllm": ("parley.arena.inference.backends.vllm:VLLMBackend", "vllm"),
    "openai": ("parley.arena.inference.backends.openai_http:OpenAIBackend", "core"),
}
"""Backend kind -> (``"module:Class"``, the pip extra its dependencies come with)."""


async def load_backend(kind: str, model: str, **options: Any) -> Backend:
    """Create and start a backend of ``kind`` serving ``model`` (a path, hub id or URL).

    ``options`` are the backend class's keyword arguments (e.g. ``device``, ``dtype`` for
    transformers; ``base_url`` for openai). The backend's module is imported only here, so
    a missing optional dependency raises
    :class:`~parley.protocols.errors.MissingDependency` naming the extra to install.
    """
    if kind not in BACKENDS:
        raise ConfigError(f"unknown backend {kind!r}; choose one of: {', '.join(BACKENDS)}")
    target, _extra = BACKENDS[kind]
    if kind != "openai":
        # A hub id that cannot be loaded fails here in a second, before the backend's
        # import (vLLM's takes 10-30 s) and a minute of Hugging Face's retries.
        from parley.arena.inference.backends.tokenizer import check_hub_model

        await asyncio.to_thread(check_hub_model, model)
    module_name, class_name = target.split(":")
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name)
    backend: Backend = await cls.create(model, **options)
    return backend
