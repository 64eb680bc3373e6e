"""Reading the fields of OpenAI requests for the HTTP front: types, ranges, and the
fields the pool cannot apply (refused unless at their neutral value). Every failure is a
:class:`BadRequest` naming the field, answered 400 by the front."""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from parley.arena.inference.backends.limits import MAX_TOP_LOGPROBS
from parley.protocols.messages import Constraint

__all__ = [
    "BadRequest",
    "as_float",
    "as_int",
    "chat_message",
    "check_unsupported",
    "constraint_of",
    "json_body",
    "model_of",
    "prompts_of",
    "stream_asked",
    "want_logprobs",
]

Json = dict[str, Any]


class BadRequest(Exception):
    """A request the front refuses before it reaches the pool."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def stream_asked(body: Json) -> bool:
    """Whether the body asks for server-sent events (``stream``, ``stream_options``)."""
    stream = body.get("stream")
    stream = False if stream is None else as_bool(stream, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise BadRequest("stream_options needs stream=true", "stream_options")
        if not isinstance(options, dict) or not isinstance(
            options.get("include_usage", False), bool
        ):
            raise BadRequest(
                "stream_options must be an object like {include_usage: true}", "stream_options"
            )
    return stream


def check_unsupported(body: Json, *, chat: bool) -> None:
    """Refuse OpenAI / vLLM sampling fields the pool cannot apply, unless they are at the
    value that changes nothing (a harness sending ``frequency_penalty: 0`` still works);
    each is range-checked first, so a malformed value gets the precise message."""
    for name, lo, hi, neutral in _NEUTRAL_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        number = as_float(value, name)
        if not lo <= number <= hi:
            raise BadRequest(f"{name} must be in [{lo:g}, {hi:g}], got {value!r}", name)
        if number not in neutral:
            raise BadRequest(
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
            raise BadRequest(
                "logit_bias must map token ids (strings of digits) to numbers in [-100, 100]",
                "logit_bias",
            )
        if bias:
            raise BadRequest("logit_bias is not supported by the pool; send {}", "logit_bias")
    top = body.get("top_logprobs")
    if top is not None:
        if not chat:
            raise BadRequest("top_logprobs is a chat field; use logprobs here", "top_logprobs")
        if not 0 <= as_int(top, "top_logprobs") <= MAX_TOP_LOGPROBS:
            raise BadRequest(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", "top_logprobs"
            )
        if top > 0 and not want_logprobs(body, chat):
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    if not chat and body.get("logprobs") is not None:
        logprobs = as_int(body["logprobs"], "logprobs")
        if not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise BadRequest(
                f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {logprobs}", "logprobs"
            )


def want_logprobs(body: Json, chat: bool) -> bool:
    """Whether the answer carries logprobs (chat: ``logprobs: true``; completions: any
    ``logprobs`` count)."""
    asked = body.get("logprobs")
    if not chat:
        return asked is not None
    return False if asked is None else as_bool(asked, "logprobs")


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


async def json_body(request: web.Request) -> Json:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    except RecursionError:  # "[" * 200_000: a 500 and a traceback per request before
        raise BadRequest("the body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def model_of(body: Json) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required: one of the ids GET /v1/models lists", "model")
    return model


def as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {value!r}", name)
    return value


def as_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {value!r}", name)
    return value


def as_float(value: Any, name: str) -> float:
    if not _is_finite(value):
        raise BadRequest(f"{name} must be a finite number, got {value!r:.80}", name)
    return float(value)


def chat_message(message: Any, i: int) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest(f"messages[{i}] must be an object with a role", "messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or text parts", "messages")
    role = "system" if message["role"] == "developer" else message["role"]
    return {"role": role, "content": content}


MAX_PROMPTS = 128
"""Most prompts one ``/v1/completions`` call may list (1,100 had filled the pool's queue,
been answered 429 at once, and still run, 190,110 tokens for nobody)."""


def prompts_of(prompt: Any) -> list[str | list[int]]:
    """OpenAI's four prompt shapes as a list of text or token-id prompts."""
    if isinstance(prompt, str) and prompt:
        return [prompt]
    if (
        isinstance(prompt, list)
        and len(prompt) > MAX_PROMPTS
        and not all(isinstance(t, int) for t in prompt)
    ):
        raise BadRequest(
            f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}; send several requests",
            "prompt",
        )
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) and p for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise BadRequest(
        "prompt must be a non-empty string, list of strings, list of token ids, or list of "
        "token-id lists",
        "prompt",
    )


def constraint_of(body: Json, *, chat: bool) -> Constraint | None:
    """A constraint from vLLM's structured-output fields or a json_schema response_format."""
    given = body.get("structured_outputs")
    if given is not None and not isinstance(given, dict):
        raise BadRequest(
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
            raise BadRequest(
                "response_format must be {type: text} or {type: json_schema, json_schema: "
                "{schema: ...}} (chat only); json_object mode is not supported",
                "response_format",
            )
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise BadRequest(
                    "response_format.json_schema.schema must be a JSON schema object",
                    "response_format",
                )
            fields["json"] = spec["schema"]
    if not fields:
        return None
    if len(fields) > 1:
        raise BadRequest(f"give one constraint, got {sorted(fields)}", "structured_outputs")
    ((kind, value),) = fields.items()
    if kind == "choice" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return Constraint(type="choice", choices=value)
    if kind == "regex" and isinstance(value, str):
        return Constraint(type="regex", pattern=value)
    if kind == "json":
        schema = value if isinstance(value, str) else json.dumps(value)
        return Constraint(type="json", json_schema=schema)
    raise BadRequest(f"unsupported constraint {kind}={value!r}", "structured_outputs")
