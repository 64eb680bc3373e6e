"""An OpenAI-compatible HTTP front for the inference pool (aiohttp server).

Outside harnesses (the ``openai`` client, evaluation tools, another parley arena through the
``openai`` backend) use the pool as if it were an OpenAI server; their requests are batched
with every other request the pool serves. Each policy of the pool is a model.

Endpoints
---------
``GET /v1/models``
    The pool's policies (``id``) with their current ``policy_version``, ``backend`` kind
    and ``dtype`` (the dtype the weights compute in; training in another dtype makes the
    recorded logprobs off-policy).
``POST /v1/chat/completions``
    ``model``, ``messages`` (string content or text parts), ``max_tokens`` /
    ``max_completion_tokens``, ``temperature``, ``top_p``, ``n``, ``stop``, ``seed``,
    ``logprobs`` (bool; ``top_logprobs`` lists stay empty: the pool keeps only the sampled
    token's logprob). The prompt is the model's chat template with the generation prompt.
``POST /v1/completions``
    ``prompt`` (a string, a list of strings, a list of token ids or a list of those), and
    the sampling fields above; ``logprobs`` (an int) turns on ``tokens`` /
    ``token_logprobs`` / ``text_offset``. Choices are ordered prompt by prompt, ``n`` each.
``POST /v1/weights`` (parley extension)
    ``{"policy", "version", "path"}``: load new weights for a policy (a trainer's hook;
    the ``openai`` backend's ``update_url``).

Extensions accepted as in vLLM: ``return_token_ids`` (each choice gets ``token_ids`` and the
response ``prompt_token_ids``), ``return_tokens_as_token_ids`` (logprob tokens are spelled
``token_id:N``), constraints as ``structured_outputs: {"choice"|"regex"|"json": ...}``,
``guided_choice`` / ``guided_regex`` / ``guided_json``, or (chat) a ``response_format`` of
type ``json_schema``. Every response also carries ``policy_version``.

``stream: true`` answers with server-sent events in OpenAI's chunk shapes
(:mod:`~parley.arena.inference.http_stream`; sent once the pool has the completion, one
chunk per token), ``stream_options.include_usage`` adds the usage chunk.

Not supported (answered 400): ``echo``, ``tools``, ``best_of`` > ``n``, ``top_logprobs``
> 0 (the pool keeps the sampled token's logprob only), ``logit_bias``, ``top_k``,
penalties and ``min_p``/``min_tokens`` other than their neutral values. Every field's
range is checked before the request reaches the pool
(:mod:`~parley.arena.inference.backends.limits`); a 400 names the field in ``param``.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 bad
request, 404 unknown model, 429 pool overloaded (clients should back off and retry; the
``openai`` client does by itself), 504 pool timeout, 503 pool closed, 500 backend failure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from parley.arena.inference.http_stream import stream_response
from parley.arena.inference.pool import InferencePool, PoolError
from parley.protocols.messages import (
    Completion,
    Constraint,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdate,
)

__all__ = ["OpenAIFront", "serve_http"]

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


class _BadRequest(Exception):
    """A request the front refuses before it reaches the pool."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _error(
    status: int, message: str, kind: str, code: str, param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class OpenAIFront:
    """The HTTP application over ``pool``; ``request_timeout`` bounds each generation."""

    def __init__(self, pool: InferencePool, *, request_timeout: float = 300.0) -> None:
        self.pool = pool
        self.request_timeout = request_timeout
        self.created = int(time.time())
        self.app = web.Application(middlewares=[self._errors])
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/chat/completions", self.chat_completions)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/weights", self.weights)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure leaves in OpenAI's error shape."""
        try:
            return await handler(request)
        except _BadRequest as exc:
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
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "parley",
                "policy_version": version,
                "backend": self.pool.backend(name).kind,
                "dtype": self.pool.backend(name).dtype or None,
            }
            for name, version in self.pool.policies.items()
        ]
        return web.json_response({"object": "list", "data": data})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        model = _model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("messages must be a non-empty list", "messages")
        chat = [_chat_message(m, i) for i, m in enumerate(messages)]
        tokenizer = self.pool.tokenizer(model)
        try:
            prompt_ids = tokenizer.encode_chat(chat)
        except Exception as exc:  # jinja errors of the model's own template: the input's fault
            raise _BadRequest(
                f"the model's chat template cannot render these messages: {exc}", "messages"
            ) from exc
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        gen = self._request(model, body, prompt_ids=prompt_ids, max_tokens=limit, chat=True)
        result = await self._generate(gen, chat=True)
        _check_finished([result])
        asked = body.get("logprobs")
        want_logprobs = False if asked is None else _bool(asked, "logprobs")
        choices: list[Json] = []
        for i, c in enumerate(result.completions):
            choice: Json = {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": _finish(c),
                "logprobs": None,
            }
            if want_logprobs:
                tokens = self._tokens(model, c.token_ids, body)
                choice["logprobs"] = {
                    "content": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, c.logprobs, strict=False)
                    ]
                }
            choices.append(self._with_ids(choice, c, body))
        out = self._envelope("chat.completion", model, choices, [result], body)
        return await self._respond(request, body, out, result.completions, model)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        model = _model(body)
        if body.get("echo"):
            raise _BadRequest("echo is not supported", "echo")
        prompts = _prompts(body.get("prompt"))
        limit = body.get("max_tokens", 16)  # OpenAI's default for completions
        requests = [
            self._request(model, body, prompt_ids=p, max_tokens=limit)
            if isinstance(p, list)
            else self._request(model, body, prompt=p, max_tokens=limit)
            for p in prompts
        ]
        results = await asyncio.gather(*(self._generate(r, chat=False) for r in requests))
        _check_finished(results)
        want_logprobs = body.get("logprobs") is not None
        choices: list[Json] = []
        for result in results:
            for c in result.completions:
                choice: Json = {
                    "index": len(choices),
                    "text": c.text,
                    "finish_reason": _finish(c),
                    "logprobs": None,
                }
                if want_logprobs:
                    tokens = self._tokens(model, c.token_ids, body)
                    offsets, at = [], 0
                    for t in tokens:
                        offsets.append(at)
                        at += len(t)
                    choice["logprobs"] = {
                        "tokens": tokens,
                        "token_logprobs": list(c.logprobs),
                        "top_logprobs": [{} for _ in tokens],
                        "text_offset": offsets,
                    }
                choices.append(self._with_ids(choice, c, body))
        out = self._envelope("text_completion", model, choices, results, body)
        completions = [c for r in results for c in r.completions]
        return await self._respond(request, body, out, completions, model)

    async def weights(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        try:
            update = WeightUpdate(
                policy=str(body["policy"]), version=int(body["version"]), path=str(body["path"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise _BadRequest(f"need policy, version and path: {exc}") from None
        version = await self.pool.update_weights(update)
        return web.json_response({"policy": update.policy, "policy_version": version})

    # --- pieces -----------------------------------------------------------------------

    async def _respond(
        self,
        request: web.Request,
        body: Json,
        out: Json,
        completions: Sequence[Completion],
        model: str,
    ) -> web.StreamResponse:
        """``out`` as JSON, or as server-sent events when the body asked ``stream``."""
        if not _stream(body):
            return web.json_response(out)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        decode = self.pool.tokenizer(model).decode
        return await stream_response(request, out, completions, decode, include_usage=usage)

    async def _generate(self, request: GenerateRequest, *, chat: bool) -> GenerateResult:
        """The pool's answer; a bad prompt is blamed on the HTTP field that made it."""
        try:
            return await self.pool.generate(request)
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
            raise _BadRequest("tools are not supported by the pool front", "tools")
        _stream(body)  # checked before the work, not after it
        _check_unsupported(body, chat=chat)
        n = _int(body.get("n", 1), "n")
        if _int(body.get("best_of") or n, "best_of") != n:
            raise _BadRequest("best_of other than n is not supported", "best_of")
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _BadRequest("stop must be a string or a list of strings", "stop")
        seed = body.get("seed")
        params = SamplingParams(
            temperature=_float(body.get("temperature", 1.0), "temperature"),
            top_p=_float(body.get("top_p", 1.0), "top_p"),
            max_tokens=_int(max_tokens if max_tokens is not None else 256, "max_tokens"),
            stop=stop,
            n=n,
            seed=None if seed is None else _int(seed, "seed"),
            logprobs=True,
        )
        return GenerateRequest(
            policy=model,
            prompt=prompt,
            prompt_token_ids=list(prompt_ids),
            params=params,
            constraint=_constraint(body, chat=chat),
            timeout=self.request_timeout,
        )

    def _tokens(self, model: str, ids: Sequence[int], body: Json) -> list[str]:
        if body.get("return_tokens_as_token_ids"):
            return [f"token_id:{t}" for t in ids]
        tok = self.pool.tokenizer(model)
        return [tok.decode([t]) for t in ids]

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


def _stream(body: Json) -> bool:
    """Whether the body asks for server-sent events (``stream``, ``stream_options``)."""
    stream = body.get("stream")
    stream = False if stream is None else _bool(stream, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise _BadRequest("stream_options needs stream=true", "stream_options")
        if not isinstance(options, dict) or not isinstance(
            options.get("include_usage", False), bool
        ):
            raise _BadRequest(
                "stream_options must be an object like {include_usage: true}", "stream_options"
            )
    return stream


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


def _check_unsupported(body: Json, *, chat: bool) -> None:
    """Refuse OpenAI / vLLM sampling fields the pool cannot apply, unless they are at the
    value that changes nothing (a harness sending ``frequency_penalty: 0`` still works);
    each is range-checked first, so a malformed value gets the precise message."""
    for name, lo, hi, neutral in _NEUTRAL_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        number = _float(value, name)
        if not lo <= number <= hi:
            raise _BadRequest(f"{name} must be in [{lo:g}, {hi:g}], got {value!r}", name)
        if number not in neutral:
            raise _BadRequest(
                f"{name} is not supported by the pool; leave it out or send "
                f"{' or '.join(f'{v:g}' for v in neutral)}",
                name,
            )
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(
            isinstance(k, str) and k.isdigit() and _is_finite(v) and -100 <= v <= 100
            for k, v in bias.items()
        ):
            raise _BadRequest(
                "logit_bias must map token ids (strings of digits) to numbers in [-100, 100]",
                "logit_bias",
            )
        if bias:
            raise _BadRequest("logit_bias is not supported by the pool; send {}", "logit_bias")
    top = body.get("top_logprobs")
    if top is not None:
        if not chat:
            raise _BadRequest("top_logprobs is a chat field; use logprobs here", "top_logprobs")
        if not 0 <= _int(top, "top_logprobs") <= 20:
            raise _BadRequest(f"top_logprobs must be in [0, 20], got {top}", "top_logprobs")
        if top > 0:
            raise _BadRequest(
                "top_logprobs > 0 is not supported: the pool returns the sampled token's "
                "logprob only (logprobs=true, top_logprobs=0)",
                "top_logprobs",
            )
    if not chat and body.get("logprobs") is not None:
        logprobs = _int(body["logprobs"], "logprobs")
        if not 0 <= logprobs <= 5:
            raise _BadRequest(f"logprobs must be in [0, 5], got {logprobs}", "logprobs")


_NEUTRAL_FIELDS: tuple[tuple[str, float, float, tuple[float, ...]], ...] = (
    # (field, lowest, highest, values that change nothing): OpenAI's and vLLM's ranges.
    ("top_k", -1, 1 << 31, (-1, 0)),
    ("presence_penalty", -2, 2, (0,)),
    ("frequency_penalty", -2, 2, (0,)),
    ("repetition_penalty", 0.01, 100, (1,)),
    ("min_p", 0, 1, (0,)),
    ("min_tokens", 0, 1 << 31, (0,)),
)


def _is_finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range (JSON has no bound on integers)
        return False


async def _json_body(request: web.Request) -> Json:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    return body


def _model(body: Json) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _BadRequest("model is required: one of the ids GET /v1/models lists", "model")
    return model


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadRequest(f"{name} must be an integer, got {value!r}", name)
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise _BadRequest(f"{name} must be true or false, got {value!r}", name)
    return value


def _float(value: Any, name: str) -> float:
    if not _is_finite(value):
        raise _BadRequest(f"{name} must be a finite number, got {value!r:.80}", name)
    return float(value)


def _chat_message(message: Any, i: int) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _BadRequest(f"messages[{i}] must be an object with a role", "messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    if not isinstance(content, str):
        raise _BadRequest(f"messages[{i}].content must be a string or text parts", "messages")
    role = "system" if message["role"] == "developer" else message["role"]
    return {"role": role, "content": content}


def _prompts(prompt: Any) -> list[str | list[int]]:
    """OpenAI's four prompt shapes as a list of text or token-id prompts."""
    if isinstance(prompt, str) and prompt:
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) and p for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise _BadRequest(
        "prompt must be a non-empty string, list of strings, list of token ids, or list of "
        "token-id lists",
        "prompt",
    )


def _constraint(body: Json, *, chat: bool) -> Constraint | None:
    """A constraint from vLLM's structured-output fields or a json_schema response_format."""
    given = body.get("structured_outputs")
    if given is not None and not isinstance(given, dict):
        raise _BadRequest(
            "structured_outputs must be an object: {choice | regex | json: ...}",
            "structured_outputs",
        )
    fields: Json = {k: v for k, v in (given or {}).items() if v is not None}
    for key in ("choice", "regex", "json"):
        if body.get(f"guided_{key}") is not None:
            fields[key] = body[f"guided_{key}"]
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if not chat or kind not in ("text", "json_schema"):
            raise _BadRequest(
                "response_format must be {type: text} or {type: json_schema, json_schema: "
                "{schema: ...}} (chat only); json_object mode is not supported",
                "response_format",
            )
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise _BadRequest(
                    "response_format.json_schema.schema must be a JSON schema object",
                    "response_format",
                )
            fields["json"] = spec["schema"]
    if not fields:
        return None
    if len(fields) > 1:
        raise _BadRequest(f"give one constraint, got {sorted(fields)}", "structured_outputs")
    ((kind, value),) = fields.items()
    if kind == "choice" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return Constraint(type="choice", choices=value)
    if kind == "regex" and isinstance(value, str):
        return Constraint(type="regex", pattern=value)
    if kind == "json":
        schema = value if isinstance(value, str) else json.dumps(value)
        return Constraint(type="json", json_schema=schema)
    raise _BadRequest(f"unsupported constraint {kind}={value!r}", "structured_outputs")


async def serve_http(
    pool: InferencePool, host: str = "127.0.0.1", port: int = 0, **options: Any
) -> tuple[web.AppRunner, str]:
    """Start the front on ``host:port`` (0 picks a port); returns the runner (call
    ``await runner.cleanup()`` to stop) and the base URL, ``http://host:port/v1``."""
    front = OpenAIFront(pool, **options)
    runner = web.AppRunner(front.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, f"http://{host}:{bound}/v1"
