"""A backend for any OpenAI-compatible HTTP server (a vLLM server, parley's pool front, ...).

Speaks ``POST {base_url}/completions`` with an aiohttp client. Each parley request is one
HTTP request (``n`` completions inside it); a batch is sent concurrently (at most
``max_concurrency`` in flight) and the server batches them - servers such as vLLM do
continuous batching, hence ``continuous_batching = True``.

Request body: ``model``, ``prompt`` (token ids when the request has them, else text),
``max_tokens``, ``temperature``, ``top_p``, ``n``, ``stop``, ``seed``, ``logprobs: 1``,
and the vLLM extensions ``return_token_ids`` / ``return_tokens_as_token_ids`` (exact token
ids back) and ``structured_outputs`` (``{"choice"|"regex"|"json": ...}``) for constraints.
A server that ignores the extensions still works for play: token ids then come from the
local tokenizer re-encoding the text (approximate; say ``tokenizer=`` to have one), and
constraints are not enforced by the server. Logprobs are kept only with the sampled ids, one
each: beside re-encoded ids (other ids, often another count) or with a null among them, a
completion has none, and a trainer refuses it rather than score it against wrong ones.

Failure handling: every request is bounded by ``timeout`` seconds (``connect_timeout``
to connect; a request's own ``timeout`` wins when set), counted in the time this process
ran (a stall of it is not the server's timeout). 429, 5xx, connection errors and
timeouts are retried up to ``max_retries`` times with exponential backoff (doubling from
``backoff`` seconds, capped at ``max_backoff``, honouring ``Retry-After``), then raise a
retryable :class:`BackendError`. Other 4xx answers raise at once with the server's message.

Weights cannot be pushed through the OpenAI API: ``update_weights`` POSTs
``{"policy", "version", "path"}`` to ``update_url`` when one is configured (a convention
parley's pool front may implement) and raises otherwise.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from parley.arena.inference.backends.base import Backend, BackendError
from parley.arena.inference.backends.tokenizer import HFChatTokenizer, load_tokenizer
from parley.arena.inference.patience import patient_wait_for
from parley.protocols.messages import (
    Completion,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    WeightUpdate,
)

__all__ = ["OpenAIBackend"]

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class OpenAIBackend(Backend):
    """Completions from an OpenAI-compatible server at ``base_url`` (ending in ``/v1``)."""

    kind = "openai"
    continuous_batching = True

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        model: str,
        *,
        tokenizer: HFChatTokenizer | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_concurrency: int = 64,
        max_context: int = 0,
        update_url: str | None = None,
    ) -> None:
        super().__init__()
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._tokenizer = tokenizer
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._slots = asyncio.Semaphore(max_concurrency)
        self._max_context = max_context
        self.update_url = update_url

    @classmethod
    async def create(
        cls,
        model: str,
        *,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        tokenizer: str | None = None,
        check_model: bool = True,
        **options: Any,
    ) -> OpenAIBackend:
        """Connect to ``base_url`` serving ``model`` (the server's model name).

        ``api_key`` defaults to ``$OPENAI_API_KEY``. ``tokenizer``: a path or hub id for
        the model's tokenizer (default: ``model`` when it is a local directory).
        ``check_model``: ask ``/models`` that the model is served (and read its context
        length, ``max_model_len``, when the server says). Other ``options`` are the
        constructor's keywords (timeouts, retries, ``max_concurrency``, ``update_url``).
        """
        if tokenizer is None and await asyncio.to_thread(Path(model).is_dir):
            tokenizer = model
        tok = await asyncio.to_thread(load_tokenizer, tokenizer) if tokenizer else None
        session = aiohttp.ClientSession()
        backend = cls(
            session,
            base_url,
            model,
            tokenizer=tok,
            api_key=api_key or os.environ.get("OPENAI_API_KEY"),
            **options,
        )
        if check_model:
            try:
                await backend._check_model()
            except BaseException:
                await session.close()
                raise
        return backend

    # --- Backend surface ---------------------------------------------------------------

    @property
    def tokenizer(self) -> HFChatTokenizer:
        if self._tokenizer is None:
            raise BackendError(
                "the openai backend has no tokenizer: pass tokenizer=PATH_OR_HUB_ID "
                "(the served model's tokenizer) to encode chats locally"
            )
        return self._tokenizer

    @property
    def max_context(self) -> int:
        if self._max_context:
            return self._max_context
        if self._tokenizer is not None:
            return int(min(self._tokenizer.hf.model_max_length, 1 << 30))
        return 1 << 30

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        for request in requests:
            self.validate(request)
        version = self.policy_version
        return list(await asyncio.gather(*(self._one(r, version) for r in requests)))

    async def update_weights(self, update: WeightUpdate) -> None:
        if not self.update_url:
            raise BackendError(
                "an OpenAI-compatible server cannot receive weights through the OpenAI "
                "API; reload the server, or give the backend update_url= of an endpoint "
                "that accepts {policy, version, path}"
            )
        if not update.path:
            raise BackendError("over HTTP, weight updates must name a path the server can read")
        body = {"policy": update.policy, "version": update.version, "path": update.path}
        await self._post(self.update_url, body, self.timeout)
        self.policy_version = update.version

    async def close(self) -> None:
        await self.session.close()

    # --- machinery ---------------------------------------------------------------------

    async def _check_model(self) -> None:
        listing = await self._call("GET", f"{self.base_url}/models", None, self.timeout)
        served = {m.get("id"): m for m in listing.get("data", []) if isinstance(m, dict)}
        if served and self.model not in served:
            raise BackendError(
                f"{self.base_url} does not serve {self.model!r}; it serves: "
                f"{', '.join(sorted(map(str, served)))}"
            )
        length = served.get(self.model, {}).get("max_model_len")
        if not self._max_context and isinstance(length, int):
            self._max_context = length

    def _body(self, request: GenerateRequest) -> dict[str, Any]:
        p = request.params
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.prompt_token_ids) or request.prompt,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "n": p.n,
            "return_token_ids": True,
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        if p.logprobs:
            body["logprobs"] = max(1, p.top_logprobs)
            body["return_tokens_as_token_ids"] = True
        c = request.constraint
        if c is not None:
            value = {"choice": c.choices, "regex": c.pattern, "json": c.json_schema}[c.type]
            body["structured_outputs"] = {c.type: value}
        return body

    async def _one(self, request: GenerateRequest, version: int) -> GenerateResult:
        timeout = request.timeout or self.timeout
        async with self._slots:
            reply = await self._post(f"{self.base_url}/completions", self._body(request), timeout)
        choices = sorted(reply.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != request.params.n:
            raise BackendError(
                f"the server returned {len(choices)} choices for n={request.params.n}"
            )
        prompt_ids = list(request.prompt_token_ids) or _ints(
            choices[0].get("prompt_token_ids") or reply.get("prompt_token_ids")
        )
        if not prompt_ids and self._tokenizer is not None:
            prompt_ids = self._tokenizer.encode(request.prompt)
        return GenerateResult(
            policy=request.policy,
            policy_version=version,
            prompt_token_ids=prompt_ids,
            completions=[self._completion(c, request.params.top_logprobs) for c in choices],
        )

    def _completion(self, choice: dict[str, Any], top: int = 0) -> Completion:
        text = str(choice.get("text", ""))
        lp = choice.get("logprobs") or {}
        token_ids = _ints(choice.get("token_ids"))
        tokens = lp.get("tokens") or []
        if not token_ids and tokens and all(str(t).startswith("token_id:") for t in tokens):
            token_ids = [int(str(t).removeprefix("token_id:")) for t in tokens]
        raw = list(lp.get("token_logprobs") or [])
        # Logprobs belong to the sampled ids, one each: with ids re-encoded here (other ids,
        # often another count) or a null among them they would be wrong, so none are kept
        # (the trainer then refuses the decision instead of scoring it against them).
        exact = bool(token_ids) and len(raw) == len(token_ids) and None not in raw
        if not token_ids and self._tokenizer is not None:
            token_ids = self._tokenizer.encode(text)  # approximate: the server gave no ids
        logprobs = [float(x) for x in raw] if exact else []
        c = Completion(
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=_FINISH.get(choice.get("finish_reason"), "error"),
        )
        if top:
            for alternatives in lp.get("top_logprobs") or []:
                best = sorted((alternatives or {}).items(), key=lambda kv: -kv[1])[:top]
                if not all(str(t).startswith("token_id:") for t, _ in best):
                    raise BackendError(
                        "the server's top_logprobs are not spelled token_id:N (it ignores "
                        "return_tokens_as_token_ids), so their token ids are unknown; "
                        "ask for top_logprobs=0 from this server"
                    )
                c.top_token_ids.append([int(str(t).removeprefix("token_id:")) for t, _ in best])
                c.top_logprobs.append([float(v) for _, v in best])
        return c

    async def _post(self, url: str, body: dict[str, Any], seconds: float) -> dict[str, Any]:
        return await self._call("POST", url, body, seconds)

    async def _call(
        self, method: str, url: str, body: dict[str, Any] | None, seconds: float
    ) -> dict[str, Any]:
        """One HTTP exchange, each attempt bounded by ``seconds``, with retries; the JSON.

        The bound is patient (:func:`~parley.arena.inference.patience.patient_wait_for`):
        an answer that came while this process stood still is read before the bound is
        judged (aiohttp's own ``total`` and ``sock_read`` timers fired first on resuming,
        and the attempt was lost to a timeout). Connecting keeps aiohttp's bound."""
        limits = aiohttp.ClientTimeout(total=None, connect=min(self.connect_timeout, seconds))

        async def attempt() -> dict[str, Any] | tuple[str, float]:
            """The JSON, or a retryable problem and how long to wait before retrying."""
            async with self.session.request(
                method, url, json=body, headers=self._headers, timeout=limits
            ) as resp:
                if resp.status < 400:
                    data = await resp.json(content_type=None)
                    if not isinstance(data, dict):
                        raise BackendError(f"{url} answered with non-object JSON")
                    return data
                detail = (await resp.text())[:500]
                if resp.status not in _RETRY_STATUS:
                    raise BackendError(f"{method} {url} failed with HTTP {resp.status}: {detail}")
                return f"HTTP {resp.status}: {detail}", _retry_after(
                    resp.headers.get("Retry-After"), delay
                )

        delay = self.backoff
        for tried in range(self.max_retries + 1):
            last = tried == self.max_retries
            try:
                outcome = await patient_wait_for(attempt(), seconds)
                if isinstance(outcome, dict):
                    return outcome
                problem, wait = outcome
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                wait = delay
            except aiohttp.ContentTypeError as exc:
                raise BackendError(f"{url} did not answer with JSON: {exc}") from exc
            if last:
                raise BackendError(
                    f"{method} {url} failed after {self.max_retries + 1} attempts "
                    f"(last: {problem}); is the server up and not overloaded?",
                    retryable=True,
                )
            await asyncio.sleep(min(wait, self.max_backoff))
            delay = min(delay * 2, self.max_backoff)
        raise AssertionError("unreachable: the loop returns or raises")


def _retry_after(header: str | None, default: float) -> float:
    try:
        return max(float(header), 0.0) if header else default
    except ValueError:
        return default


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values] if isinstance(values, list) else []
