"""The allowed range of every request field, checked at the pool's door.

A request from the bus, the HTTP front or in-process code reaches a backend only if every
field is in range; otherwise :func:`check_request` raises :class:`RequestError` naming the
field and its range, and the pool answers ``Error(code="bad_request")`` (HTTP 400) without
touching the batch the request would have joined. Backends add their own checks (prompt
ids inside the vocabulary, prompt length against the context, constraints they can
enforce) in :meth:`~parley.arena.inference.backends.base.Backend.validate`.

=======================  ==============================================================
field                    allowed
=======================  ==============================================================
``prompt`` / ids         one of them non-empty; ids are integers (the backend checks the
                         vocabulary and the context)
``params.n``             1 ..= :data:`MAX_N`
``params.max_tokens``    1 ..= :data:`MAX_TOKENS` (clipped to the context by the backend)
``params.temperature``   0 (greedy) or :data:`MIN_TEMPERATURE` ..= :data:`MAX_TEMPERATURE`
``params.top_p``         (0, 1]
``params.seed``          none, or 0 ..= 2**63 - n (completion ``j`` uses ``seed + j``, and
                         every seed must fit a signed 64-bit integer)
``params.stop``          at most :data:`MAX_STOP` strings of 1 ..= :data:`MAX_STOP_CHARS`
                         characters
``params.top_logprobs``  0 ..= :data:`MAX_TOP_LOGPROBS`; above 0 only with ``logprobs``
``timeout``              0 (no limit of its own) or a finite number of seconds > 0
``constraint``           at most :data:`MAX_CHOICES` choices of at most
                         :data:`MAX_CONSTRAINT_CHARS` characters each; a pattern or schema
                         of at most :data:`MAX_CONSTRAINT_CHARS` characters
=======================  ==============================================================

Numbers must be numbers (``bool`` is not one) and finite: NaN passes every ``<``
comparison, so each check is written to fail on it.
"""

from __future__ import annotations

import math
from typing import Any

from parley.arena.inference.backends.errors import RequestError
from parley.protocols.messages import Constraint, GenerateRequest

__all__ = [
    "check_request",
    "MAX_TOP_LOGPROBS",
]

MAX_N = 128
"""Most completions per request (OpenAI's limit)."""
MAX_TOKENS = 2**31 - 1
"""Most new tokens a request may ask for (a 32-bit count; the context clips it further)."""
MIN_TEMPERATURE = 1e-5
"""Smallest non-zero temperature: below it logits / T overflows float32 (use 0: greedy)."""
MAX_TEMPERATURE = 100.0
"""Largest temperature (already indistinguishable from uniform sampling)."""
MAX_SEED = 2**63 - 1
"""Largest seed any completion may use (a signed 64-bit integer: torch and vLLM)."""
MAX_STOP = 32
"""Most stop strings per request."""
MAX_STOP_CHARS = 1024
"""Longest stop string, in characters."""
MAX_CHOICES = 4096
"""Most choices of a choice constraint."""
MAX_CONSTRAINT_CHARS = 65536
"""Longest choice, regex pattern or JSON schema text, in characters."""
MAX_TOP_LOGPROBS = 20
"""Most alternatives per generated token (OpenAI's and vLLM's limit)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_request(request: GenerateRequest) -> None:
    """Raise :class:`RequestError` if any field of ``request`` is out of range (table above)."""
    p = request.params
    ids = request.prompt_token_ids
    if not ids and not request.prompt:
        raise RequestError("prompt", "empty prompt: set prompt or prompt_token_ids")
    if not isinstance(request.prompt, str):
        raise RequestError("prompt", f"prompt must be a string, got {type(request.prompt)}")
    if not all(_is_int(t) and t >= 0 for t in ids):
        raise RequestError("prompt_token_ids", "prompt_token_ids must be integers >= 0")
    if not (_is_int(p.n) and 1 <= p.n <= MAX_N):
        raise RequestError("n", f"params.n must be an integer in [1, {MAX_N}], got {p.n!r}")
    if not (_is_int(p.max_tokens) and 1 <= p.max_tokens <= MAX_TOKENS):
        raise RequestError(
            "max_tokens",
            f"params.max_tokens must be an integer in [1, {MAX_TOKENS}], got {p.max_tokens!r}",
        )
    if not (
        _is_number(p.temperature)
        and (p.temperature == 0 or MIN_TEMPERATURE <= p.temperature <= MAX_TEMPERATURE)
    ):
        raise RequestError(
            "temperature",
            f"params.temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
            f"{MAX_TEMPERATURE:g}], got {p.temperature!r}",
        )
    if not (_is_number(p.top_p) and 0 < p.top_p <= 1):
        raise RequestError("top_p", f"params.top_p must be in (0, 1], got {p.top_p!r}")
    if p.seed is not None and not (_is_int(p.seed) and 0 <= p.seed <= MAX_SEED - (p.n - 1)):
        raise RequestError(
            "seed",
            f"params.seed must be an integer in [0, 2**63 - n] = [0, {MAX_SEED - (p.n - 1)}] "
            f"(completion j uses seed + j, which must fit a signed 64-bit integer), "
            f"got {p.seed!r}",
        )
    _check_stop(p.stop)
    if not isinstance(p.logprobs, bool):
        raise RequestError("logprobs", f"params.logprobs must be a bool, got {p.logprobs!r}")
    if not (_is_int(p.top_logprobs) and 0 <= p.top_logprobs <= MAX_TOP_LOGPROBS):
        raise RequestError(
            "top_logprobs",
            f"params.top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], "
            f"got {p.top_logprobs!r}",
        )
    if p.top_logprobs and not p.logprobs:
        raise RequestError("top_logprobs", "params.top_logprobs > 0 needs params.logprobs=true")
    if not (_is_number(request.timeout) and request.timeout >= 0):
        raise RequestError(
            "timeout",
            f"timeout must be 0 (none) or a finite number of seconds > 0, got {request.timeout!r}",
        )
    if request.constraint is not None:
        _check_constraint_size(request.constraint)


def _check_stop(stop: Any) -> None:
    if not isinstance(stop, list) or len(stop) > MAX_STOP:
        raise RequestError("stop", f"params.stop must be a list of at most {MAX_STOP} strings")
    for s in stop:
        if not isinstance(s, str) or not 1 <= len(s) <= MAX_STOP_CHARS:
            raise RequestError(
                "stop",
                f"each stop string must have 1 to {MAX_STOP_CHARS} characters, got {s!r:.80}",
            )


def _check_constraint_size(c: Constraint) -> None:
    if len(c.choices) > MAX_CHOICES:
        raise RequestError(
            "constraint", f"a choice constraint may list at most {MAX_CHOICES} choices"
        )
    texts = [*c.choices, c.pattern, c.json_schema]
    if any(not isinstance(t, str) or len(t) > MAX_CONSTRAINT_CHARS for t in texts):
        raise RequestError(
            "constraint",
            f"choices, pattern and json_schema must be strings of at most "
            f"{MAX_CONSTRAINT_CHARS} characters",
        )
