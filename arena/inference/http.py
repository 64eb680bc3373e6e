"""An OpenAI-compatible HTTP front for the inference pool (aiohttp server).

Outside harnesses (the ``openai`` client, evaluation tools, another parley arena through the
``openai`` backend) use the pool as if it were an OpenAI server; their requests are batched
with every other request the pool serves. Each policy of the pool is a model.

Endpoints
---------
``GET /v1/models``
    The pool's policies (``id``) with their current ``policy_version``, ``backend`` kind
    and ``dtype`` (the dtype the weights compute in; training in another dtype makes the
    recorded logprobs off-policy). A LoRA adapter served on a base (``parley serve
    --adapter``) is a model of its own whose ``parent`` is the base's policy (``null`` for
    bases), and ``"model": NAME`` runs it; its ``policy_version`` is the adapter's.
``POST /v1/chat/completions``
    ``model``, ``messages`` (string content or text parts), ``max_tokens`` /
    ``max_completion_tokens``, ``temperature``, ``top_p``, ``n``, ``stop``, ``seed``,
    ``logprobs`` (bool) with ``top_logprobs`` (0-20 alternatives per token, each
    ``{token, logprob, bytes}``). The prompt is the model's chat template with the
    generation prompt.
``POST /v1/completions``
    ``prompt`` (a string, a list of strings, a list of token ids or a list of those), and
    the sampling fields above; ``logprobs`` (an int, 0-20) turns on ``tokens`` /
    ``token_logprobs`` / ``text_offset`` and ``top_logprobs`` (that many alternatives per
    token, ``{token: logprob}``). Choices are ordered prompt by prompt, ``n`` each.
``POST /v1/score`` (parley extension)
    ``{"model", "texts": [str, ...], "prompt": str}``: a reward model's score of ``prompt +
    text`` for each text (``model`` names a reward model the pool serves, not a policy),
    batched with the other score requests; answered ``{"object": "list", "model", "data":
    [{"object": "score", "index", "score"}, ...], "policy_version"}`` in the texts' order.
``POST /v1/weights`` (parley extension)
    ``{"policy", "version", "path"}``: load new weights for a policy (a trainer's hook;
    the ``openai`` backend's ``update_url``).

Extensions accepted as in vLLM: ``return_token_ids`` (each choice gets ``token_ids`` and the
response ``prompt_token_ids``), ``return_tokens_as_token_ids`` (logprob tokens are spelled
``token_id:N``), constraints as ``structured_outputs: {"choice"|"regex"|"json": ...}``,
``guided_choice`` / ``guided_regex`` / ``guided_json``, or (chat) a ``response_format`` of
type ``json_schema``. Every response also carries ``policy_version``.

Top logprobs are the most likely tokens of the distribution each token was drawn from
(after a constraint, temperature and top-p), so under a constraint only tokens it allows
are listed, and a list may be shorter than asked.

``stream: true`` answers with server-sent events in OpenAI's chunk shapes, one chunk per
token, sent as the tokens are generated (transformers: after each decoding step of the
batch the request is in; vLLM: after each engine step; the ``openai`` backend: at the
end), see :mod:`~parley.arena.inference.http_stream`; ``stream_options.include_usage``
adds the usage chunk. Text that could still change (a split character, the start of a stop
string) waits for the next chunk. An error found before the first token is an ordinary
error response; one after it is an ``{"error": ...}`` event that ends the stream.

Not supported (answered 400): ``echo``, ``tools``, ``best_of`` > ``n``, ``logit_bias``,
``top_k``, penalties and ``min_p``/``min_tokens`` other than their neutral values. Every
field's range is checked before the request reaches the pool
(:mod:`~parley.arena.inference.backends.limits`); a 400 names the field in ``param``.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 bad
request, 404 unknown model, 429 pool overloaded (clients should back off and retry; the
``openai`` client does by itself), 504 pool timeout, 503 pool closed, 500 backend failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from parley.arena.inference.http_fields import (
    BadRequest,
    as_float,
    as_int,
    chat_message,
    check_unsupported,
    constraint_of,
    json_body,
    model_of,
    prompts_of,
    stream_asked,
    want_logprobs,
)
from parley.arena.inference.http_guard import (
    ConnectionLimits,
    guard,
    http_is_loopback,
    serve_guarded,
)
from parley.arena.inference.http_stream import EventStream, logprobs_json
from parley.arena.inference.pool import InferencePool, PoolError
from parley.protocols.messages import (
    MAX_LIST_ITEMS,
    Completion,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    ScoreRequest,
    WeightUpdate,
)

__all__ = ["serve_http"]

T = TypeVar("T")

_log = logging.getLogger(__name__)

_STATUS = {
    "bad_request": (400, "invalid_request_error"),
    "unknown_policy": (404, "invalid_request_error"),
    "stale_weights": (409, "invalid_request_error"),
    "overloaded": (429, "rate_limit_error"),
    "timeout": (504, "timeout_error"),
    "closed": (503, "server_error"),
    "cancelled": (503, "server_error"),
    "backend_failed": (500, "server_error"),
}

Json = dict[str, Any]


def _error(
    status: int, message: str, kind: str, code: str, param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class OpenAIFront:
    """The HTTP application over ``pool``; ``request_timeout`` bounds each generation."""

    def __init__(
        self, pool: InferencePool, *, request_timeout: float = 300.0, loopback_only: bool = True
    ) -> None:
        self.pool = pool
        self.request_timeout = request_timeout
        self.created = int(time.time())
        # JSON-only POST (CSRF); loopback Host headers when bound to loopback (DNS rebinding)
        self.app = web.Application(middlewares=[guard(loopback_only=loopback_only), self._errors])
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/chat/completions", self.chat_completions)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/score", self.score)
        self.app.router.add_post("/v1/weights", self.weights)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure leaves in OpenAI's error shape."""
        try:
            return await handler(request)
        except BadRequest as exc:
            return _error(400, exc.message, "invalid_request_error", "bad_request", exc.param)
        except PoolError as exc:
            status, kind = _STATUS.get(exc.code, (500, "server_error"))
            code = "model_not_found" if exc.code == "unknown_policy" else exc.code
            return _error(status, exc.message, kind, code, exc.param)
        except web.HTTPException as exc:
            return _error(exc.status, exc.reason or "", "invalid_request_error", str(exc.status))
        except Exception as exc:  # a bug must still answer in OpenAI's shape, and say so
            _log.exception("internal error on %s", request.path)
            message = f"internal error: {type(exc).__name__}: {exc}"
            return _error(500, message, "server_error", "internal_error")

    # --- endpoints --------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        policies = self.pool.policies
        bases = {  # backend -> the policy its plain base serves under
            id(self.pool.backend(name)): name
            for name in policies
            if name not in self.pool.backend(name).adapters
        }
        data = []
        for name, version in policies.items():
            backend = self.pool.backend(name)
            adapter = name in backend.adapters
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "parley",
                    "policy_version": version,
                    "backend": backend.kind,
                    "dtype": backend.dtype or None,
                    # As vLLM's server lists LoRA adapters: the base model they run on.
                    "parent": bases.get(id(backend)) if adapter else None,
                }
            )
        return web.json_response({"object": "list", "data": data})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        model = model_of(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", "messages")
        chat = [chat_message(m, i) for i, m in enumerate(messages)]
        tokenizer = self.pool.tokenizer(model)
        try:
            prompt_ids = tokenizer.encode_chat(chat)
        except Exception as exc:  # jinja errors of the model's own template: the input's fault
            raise BadRequest(
                f"the model's chat template cannot render these messages: {exc}", "messages"
            ) from exc
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        gen = self._request(model, body, prompt_ids=prompt_ids, max_tokens=limit, chat=True)
        return await self._answer(request, body, model, [gen], chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        model = model_of(body)
        if body.get("echo"):
            raise BadRequest("echo is not supported", "echo")
        prompts = prompts_of(body.get("prompt"))
        limit = body.get("max_tokens", 16)  # OpenAI's default for completions
        requests = [
            self._request(model, body, prompt_ids=p, max_tokens=limit)
            if isinstance(p, list)
            else self._request(model, body, prompt=p, max_tokens=limit)
            for p in prompts
        ]
        return await self._answer(request, body, model, requests, chat=False)

    async def score(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        model = model_of(body)
        texts, prompt = body.get("texts"), body.get("prompt", "")
        if not isinstance(texts, list) or not texts or len(texts) > MAX_LIST_ITEMS:
            raise BadRequest(f"texts must be a list of 1 to {MAX_LIST_ITEMS} strings", "texts")
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest("texts must hold strings only", "texts")
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string", "prompt")
        asked = ScoreRequest(model=model, prompt=prompt, texts=texts, timeout=self.request_timeout)
        result = await self.pool.score(asked)
        data = [{"object": "score", "index": i, "score": s} for i, s in enumerate(result.scores)]
        answer = {"object": "list", "model": model, "data": data}
        return web.json_response({**answer, "policy_version": result.version})

    async def weights(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        try:
            update = WeightUpdate(
                policy=str(body["policy"]), version=int(body["version"]), path=str(body["path"])
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # (version Infinity)
            raise BadRequest(f"need policy, version and path: {exc}") from None
        version = await self.pool.update_weights(update)
        return web.json_response({"policy": update.policy, "policy_version": version})

    # --- pieces -----------------------------------------------------------------------

    async def _answer(
        self,
        request: web.Request,
        body: Json,
        model: str,
        requests: Sequence[GenerateRequest],
        *,
        chat: bool,
    ) -> web.StreamResponse:
        """Run ``requests`` (choices in order, ``n`` each) and answer with JSON, or with
        server-sent events streamed as the tokens come when the body asked ``stream``."""
        if not stream_asked(body):
            results = await _all_or_none(self._generate(r, chat=chat) for r in requests)
            _check_finished(results)
            return web.json_response(self._body(model, body, results, chat=chat))
        queue: asyncio.Queue[tuple[int, Completion]] = asyncio.Queue()

        def sink(base: int) -> Callable[[int, Completion], None]:
            return lambda j, delta: queue.put_nowait((base + j, delta))

        n = requests[0].params.n
        work = asyncio.ensure_future(
            _all_or_none(
                self._generate(r, chat=chat, on_tokens=sink(i * n)) for i, r in enumerate(requests)
            )
        )
        stream: EventStream | None = None
        try:
            while True:  # tokens until the work is done and every token is sent
                token = asyncio.ensure_future(queue.get())
                waits: set[asyncio.Future[Any]] = {work, token}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if not token.done():
                    token.cancel()
                    break
                if stream is None:
                    stream = await self._event_stream(request, body, model, requests, chat)
                await stream.add(*token.result())
            try:
                results = work.result()
                _check_finished(results)
            except PoolError as exc:
                if stream is None:
                    raise  # nothing sent yet: an ordinary error response
                error = {"message": exc.message, "type": _STATUS.get(exc.code, ("", ""))[1]}
                await stream.fail({**error, "code": exc.code, "param": exc.param})
                return stream.response
            except Exception as exc:  # a bug: the started stream must still end, and say so
                if stream is None:
                    raise
                _log.exception("internal error on %s", request.path)
                message = f"internal error: {type(exc).__name__}: {exc}"
                await stream.fail(
                    {"message": message, "type": "server_error", "code": "internal_error"}
                )
                return stream.response
            out = self._body(model, body, results, chat=chat)
            if stream is None:
                stream = await self._event_stream(request, body, model, requests, chat)
            if not await stream.finish(out["choices"], [c for r in results for c in r.completions]):
                return stream.response  # ended with an error event: nothing more to write
            if (body.get("stream_options") or {}).get("include_usage"):
                await stream.usage(out["usage"])
            await stream.done()
            return stream.response
        except ConnectionResetError:  # the client went away; its requests are cancelled
            assert stream is not None  # only writes to a started stream raise it
            return stream.response
        finally:
            if not work.done():
                work.cancel()

    async def _event_stream(
        self,
        request: web.Request,
        body: Json,
        model: str,
        requests: Sequence[GenerateRequest],
        chat: bool,
    ) -> EventStream:
        version = self.pool.policies[model]
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": f"parley-v{version}",
        }
        stream = EventStream(
            request,
            head,
            chat=chat,
            decode=self.pool.tokenizer(model).decode,
            spell=self._speller(model, body),
            stop=requests[0].params.stop,
            logprobs=want_logprobs(body, chat),
        )
        await stream.start()
        return stream

    def _body(self, model: str, body: Json, results: Sequence[GenerateResult], chat: bool) -> Json:
        """The non-streamed response body of ``results``."""
        spell = self._speller(model, body)
        with_logprobs = want_logprobs(body, chat)
        choices: list[Json] = []
        for c in (c for r in results for c in r.completions):
            choice: Json = {"index": len(choices), "finish_reason": _finish(c), "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            if with_logprobs:
                choice["logprobs"] = logprobs_json(spell, c, chat=chat)
            choices.append(self._with_ids(choice, c, body))
        return self._envelope(
            "chat.completion" if chat else "text_completion", model, choices, results, body
        )

    async def _generate(
        self,
        request: GenerateRequest,
        *,
        chat: bool,
        on_tokens: Callable[[int, Completion], None] | None = None,
    ) -> GenerateResult:
        """The pool's answer; a bad prompt is blamed on the HTTP field that made it."""
        try:
            return await self.pool.generate(request, on_tokens=on_tokens)
        except PoolError as exc:
            if exc.param in ("prompt", "prompt_token_ids"):
                exc.param = "messages" if chat else "prompt"
            raise

    def _request(
        self,
        model: str,
        body: Json,
        *,
        prompt: str = "",
        prompt_ids: Sequence[int] = (),
        max_tokens: Any = None,
        chat: bool = False,
    ) -> GenerateRequest:
        if body.get("tools"):
            raise BadRequest("tools are not supported by the pool front", "tools")
        stream_asked(body)  # checked before the work, not after it
        check_unsupported(body, chat=chat)
        n = as_int(body.get("n", 1), "n")
        if as_int(body.get("best_of") or n, "best_of") != n:
            raise BadRequest("best_of other than n is not supported", "best_of")
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("stop must be a string or a list of strings", "stop")
        seed = body.get("seed")
        top = body.get("top_logprobs") if chat else body.get("logprobs")
        params = SamplingParams(
            temperature=as_float(body.get("temperature", 1.0), "temperature"),
            top_p=as_float(body.get("top_p", 1.0), "top_p"),
            max_tokens=as_int(max_tokens if max_tokens is not None else 256, "max_tokens"),
            stop=stop,
            n=n,
            seed=None if seed is None else as_int(seed, "seed"),
            logprobs=True,
            top_logprobs=top or 0,  # range-checked by _check_unsupported
        )
        return GenerateRequest(
            policy=model,
            prompt=prompt,
            prompt_token_ids=list(prompt_ids),
            params=params,
            constraint=constraint_of(body, chat=chat),
            timeout=self.request_timeout,
        )

    def _speller(self, model: str, body: Json) -> Callable[[int], str]:
        """How token ids are written in logprobs: their text, or ``token_id:N``."""
        if body.get("return_tokens_as_token_ids"):
            return lambda t: f"token_id:{t}"
        decode = self.pool.tokenizer(model).decode
        return lambda t: decode([t])

    @staticmethod
    def _with_ids(choice: Json, c: Completion, body: Json) -> Json:
        if body.get("return_token_ids"):
            choice["token_ids"] = list(c.token_ids)
        return choice

    @staticmethod
    def _envelope(
        kind: str, model: str, choices: list[Json], results: Sequence[GenerateResult], body: Json
    ) -> Json:
        prompt_tokens = sum(len(r.prompt_token_ids) for r in results)
        completion_tokens = sum(len(c.token_ids) for r in results for c in r.completions)
        out: Json = {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "policy_version": min(r.policy_version for r in results),
            "system_fingerprint": f"parley-v{min(r.policy_version for r in results)}",
        }
        if body.get("return_token_ids"):
            if len(results) == 1:
                out["prompt_token_ids"] = list(results[0].prompt_token_ids)
            for choice, (r, _) in zip(choices, _per_choice(results), strict=True):
                choice["prompt_token_ids"] = list(r.prompt_token_ids)
        return out


def _per_choice(results: Sequence[GenerateResult]) -> list[tuple[GenerateResult, Completion]]:
    return [(r, c) for r in results for c in r.completions]


def _finish(c: Completion) -> str:
    """OpenAI's finish reason; only called on completions :func:`_check_finished` passed."""
    return "length" if c.finish_reason == "length" else "stop"


async def _all_or_none(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every result, or the first error with the other calls cancelled (``gather`` lets them
    run on: a request refused ``overloaded`` left its 1,024 siblings generating)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _check_finished(results: Sequence[GenerateResult]) -> None:
    """A completion that ended in an error is an error response, never ``"stop"``."""
    for r in results:
        for c in r.completions:
            if c.finish_reason not in ("stop", "length"):
                raise PoolError(
                    "backend_failed",
                    f"a completion ended with {c.finish_reason!r} after {len(c.token_ids)} "
                    "tokens (e.g. a constraint that no token could continue); nothing was "
                    "returned",
                )


async def serve_http(
    pool: InferencePool,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ConnectionLimits | None = None,
    **options: Any,
) -> tuple[web.AppRunner, str]:
    """Start the front on ``host:port`` (0 picks a port); returns the runner (call
    ``await runner.cleanup()`` to stop) and the base URL, ``http://host:port/v1``.
    ``limits``: connections held at once and the time to send headers (see
    :class:`~parley.arena.inference.http_guard.ConnectionLimits`; default: from the
    process's file descriptor limit, 10 s)."""
    front = OpenAIFront(pool, loopback_only=http_is_loopback(host, port), **options)
    runner = web.AppRunner(front.app, access_log=None)
    await runner.setup()
    bound = await serve_guarded(runner, host, port, limits)
    return runner, f"http://{host}:{bound}/v1"
