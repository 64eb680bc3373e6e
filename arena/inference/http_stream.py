"""Server-sent events for the OpenAI-compatible front (``stream: true``).

The pool batches whole completions, so a streamed response is sent once its completions
are done: one chunk per generated token (OpenAI's ``chat.completion.chunk`` /
``text_completion`` chunk shapes, with that token's logprob when asked), then a chunk with
the ``finish_reason``, an optional usage chunk (``stream_options.include_usage``) and
``data: [DONE]``. Clients that consume streams (chat UIs, evaluation tools, the ``openai``
client's ``stream=True``) work unchanged; the first byte arrives when the completion is
complete, not earlier. Errors are found before the stream starts and answered as ordinary
JSON errors with their status.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from parley.protocols.messages import Completion

__all__ = ["stream_response", "token_pieces"]

Json = dict[str, Any]

MAX_INCREMENTAL = 2048
"""Completions longer than this (in tokens) are streamed as one text chunk (decoding every
prefix costs quadratic time)."""


def token_pieces(decode: Any, token_ids: Sequence[int], text: str) -> list[str]:
    """The text each token adds, so that the pieces join to exactly ``text``.

    ``decode`` maps ids to text (special tokens skipped); ``text`` is the completion's
    final text, which a stop string may have cut. Characters split across tokens land on
    the token that completes them.
    """
    n = len(token_ids)
    if n == 0:
        return []
    if n > MAX_INCREMENTAL:
        return [text] + [""] * (n - 1)
    ends = [min(len(decode(token_ids[: k + 1]).rstrip("\ufffd")), len(text)) for k in range(n)]
    ends[-1] = len(text)
    pieces, at = [], 0
    for end in ends:
        end = max(end, at)
        pieces.append(text[at:end])
        at = end
    return pieces


def _sse(data: Json | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def stream_response(
    request: web.Request,
    response: Json,
    completions: Sequence[Completion],
    decode: Any,
    *,
    include_usage: bool = False,
) -> web.StreamResponse:
    """Send ``response`` (a complete non-streamed body, ``chat.completion`` or
    ``text_completion``) as server-sent chunks; ``completions`` are its choices' completions
    in order."""
    chat = response["object"] == "chat.completion"
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    stream = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await stream.prepare(request)

    async def send(choice: Json) -> None:
        await stream.write(_sse({**head, "choices": [choice]}))

    for choice, c in zip(response["choices"], completions, strict=True):
        i = choice["index"]
        text = choice["message"]["content"] if chat else choice["text"]
        logprobs = choice.get("logprobs")
        if chat:
            await send({"index": i, "delta": {"role": "assistant", "content": ""}})
        for k, piece in enumerate(token_pieces(decode, c.token_ids, text)):
            out: Json = {"index": i, "logprobs": None, "finish_reason": None}
            if chat:
                out["delta"] = {"content": piece}
                if logprobs:
                    out["logprobs"] = {"content": logprobs["content"][k : k + 1]}
            else:
                out["text"] = piece
                if logprobs:
                    out["logprobs"] = {key: v[k : k + 1] for key, v in logprobs.items()}
            await send(out)
        last: Json = {"index": i, "logprobs": None, "finish_reason": choice["finish_reason"]}
        if chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        for extra in ("token_ids", "prompt_token_ids"):
            if extra in choice:
                last[extra] = choice[extra]
        await send(last)
    if include_usage:
        await stream.write(_sse({**head, "choices": [], "usage": response["usage"]}))
    await stream.write(_sse("[DONE]"))
    await stream.write_eof()
    return stream
