"""Server-sent events for the OpenAI-compatible front (``stream: true``), and the logprob
shapes both endpoints answer with.

Tokens leave as they are generated: the front gives the pool a token sink
(:meth:`~parley.arena.inference.pool.InferencePool.generate` ``on_tokens``), backends that
stream (transformers after each decoding step of its batch, vLLM after each engine step)
feed it, and :class:`EventStream` sends one chunk per token (OpenAI's
``chat.completion.chunk`` / ``text_completion`` chunk shapes, with that token's logprob and
top alternatives when asked). When the completion is done the tokens not sent yet follow
(all of them, for a backend that does not stream: the ``openai`` HTTP backend), then a
chunk with the ``finish_reason``, an optional usage chunk
(``stream_options.include_usage``) and ``data: [DONE]``.

Text is sent only once it is final: a piece is held back while it ends in an incomplete
character or could be the start of a stop string (the stop string itself is never sent),
so the pieces always join to the non-streamed ``text``. Errors found before the first
token (bad requests, unknown model, an overloaded pool) are ordinary JSON error responses
with their status; an error after the stream has started is sent as an event
``{"error": {...}}`` (the ``openai`` client raises ``APIError`` on it) before ``[DONE]``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from parley.protocols.messages import Completion

__all__ = ["EventStream", "logprobs_json"]

_log = logging.getLogger(__name__)

Json = dict[str, Any]
Spell = Callable[[int], str]
"""How a token id is written in logprobs (its text, or ``token_id:N``)."""

MAX_INCREMENTAL = 2048
"""Completions longer than this (in tokens) send the rest of their text in the last token's
chunk (decoding every prefix costs quadratic time)."""


def logprobs_json(
    spell: Spell, c: Completion, lo: int = 0, hi: int | None = None, *, chat: bool, at: int = 0
) -> Json:
    """The ``logprobs`` object of tokens ``lo:hi`` of ``c``: chat's ``{"content": [...]}``
    (``top_logprobs`` as ``[{token, logprob, bytes}]``) or completions' ``{tokens,
    token_logprobs, top_logprobs: [{token: logprob}], text_offset}`` counting from ``at``."""
    ids = c.token_ids[lo:hi]
    tokens = [spell(t) for t in ids]
    alternatives = [
        list(zip(top_ids, top_lps, strict=True))
        for top_ids, top_lps in zip(c.top_token_ids[lo:hi], c.top_logprobs[lo:hi], strict=True)
    ] or [[] for _ in ids]
    logprobs = list(c.logprobs[lo:hi])
    if chat:
        return {
            "content": [
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": list(t.encode()),
                    "top_logprobs": [
                        {"token": s, "logprob": v, "bytes": list(s.encode())}
                        for s, v in ((spell(i), v) for i, v in alts)
                    ],
                }
                for t, lp, alts in zip(tokens, logprobs, alternatives, strict=False)
            ]
        }
    offsets = []
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": [{spell(i): v for i, v in alts} for alts in alternatives],
        "text_offset": offsets,
    }


def token_pieces(
    decode: Any, token_ids: Sequence[int], text: str, start: int = 0, at: int = 0
) -> list[str]:
    """The text each token from ``start`` on adds, so that the pieces join to ``text[at:]``.

    ``decode`` maps ids to text (special tokens skipped); ``text`` is the completion's
    final text, which a stop string may have cut; ``at`` characters of it were sent
    already with tokens before ``start``. Characters split across tokens land on the token
    that completes them.
    """
    n = len(token_ids)
    if n <= start:
        return []
    if n > MAX_INCREMENTAL:
        return [""] * (n - start - 1) + [text[at:]]
    ends = [
        min(len(decode(token_ids[: k + 1]).rstrip("\ufffd")), len(text)) for k in range(start, n)
    ]
    ends[-1] = len(text)
    pieces = []
    for end in ends:
        end = max(end, at)
        pieces.append(text[at:end])
        at = end
    return pieces


def _sse(data: Json | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


class EventStream:
    """One streamed response: :meth:`start`, tokens as they come (:meth:`add`), then
    :meth:`finish` (or :meth:`fail`).

    ``head`` holds the chunks' ``id``, ``created``, ``model``, ``system_fingerprint``;
    ``stop`` the request's stop strings (text that could start one is held back);
    ``logprobs`` whether chunks carry logprobs; ``spell`` writes token ids for them.
    """

    def __init__(
        self,
        request: web.Request,
        head: Json,
        *,
        chat: bool,
        decode: Callable[[Sequence[int]], str],
        spell: Spell,
        stop: Sequence[str] = (),
        logprobs: bool = False,
    ) -> None:
        self.request = request
        self.chat = chat
        self.head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        self.decode = decode
        self.spell = spell
        self.stop = list(stop)
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.logprobs = logprobs
        self.response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        self.sent_ids: dict[int, list[int]] = {}  # choice index -> token ids sent
        self.sent_text: dict[int, str] = {}  # choice index -> text sent
        self.offset: dict[int, int] = {}  # completions' text_offset of the next token

    async def start(self) -> None:
        await self.response.prepare(self.request)

    async def add(self, index: int, delta: Completion) -> None:
        """Send the new tokens of choice ``index`` (one chunk each), with the text that is
        final so far."""
        for k in range(len(delta.token_ids)):
            ids = self.sent_ids.get(index, []) + delta.token_ids[k : k + 1]
            sent = self.sent_text.get(index, "")
            text = self._final_so_far(ids)
            piece = text[len(sent) :] if text.startswith(sent) else ""
            await self._token(index, piece, delta, k)

    async def finish(self, choices: Sequence[Json], completions: Sequence[Completion]) -> bool:
        """Send what is left of each choice (``choices`` of the non-streamed body, with
        their ``completions``) and the finish chunks. True: the caller ends the stream
        (usage, ``done``); False: the stream was ended with an error event, write no more."""
        for choice, c in zip(choices, completions, strict=True):
            i = choice["index"]
            ids, sent = self.sent_ids.get(i, []), self.sent_text.get(i, "")
            text = choice["message"]["content"] if self.chat else choice["text"]
            if c.token_ids[: len(ids)] != ids:
                # Only a request that had to run again (an engine restart) gets here.
                message = "the completion was regenerated after part of it was streamed"
                await self.fail({"message": message, "type": "server_error", "code": "retry"})
                return False
            if not text.startswith(sent):  # a detokenizer that rewrites earlier text
                _log.warning("streamed text %r is not a prefix of the final %r", sent, text)
            pieces = token_pieces(self.decode, c.token_ids, text, len(ids), len(sent))
            for k, piece in enumerate(pieces, start=len(ids)):
                await self._token(i, piece, c, k)
            if i not in self.sent_ids:  # no token at all: still announce the role
                await self._role(i)
            last: Json = {"index": i, "logprobs": None, "finish_reason": choice["finish_reason"]}
            if self.chat:
                last["delta"] = {}
            else:
                last["text"] = ""
            for extra in ("token_ids", "prompt_token_ids"):
                if extra in choice:
                    last[extra] = choice[extra]
            await self._send({**self.head, "choices": [last]})
        return True

    async def usage(self, usage: Json) -> None:
        await self._send({**self.head, "choices": [], "usage": usage})

    async def done(self) -> None:
        await self.response.write(_sse("[DONE]"))
        await self.response.write_eof()

    async def fail(self, error: Json) -> None:
        """Report an error inside the started stream and end it."""
        await self._send({"error": {"param": None, **error}})
        await self.done()

    # --- pieces -----------------------------------------------------------------------

    def _final_so_far(self, ids: list[int]) -> str:
        """The text of ``ids`` that no later token can change: without a trailing
        incomplete character, cut at a stop string, or short of one that may be starting."""
        if len(ids) > MAX_INCREMENTAL:
            return ""  # the rest goes with the final chunk
        text = self.decode(ids).rstrip("\ufffd")
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            return text[: min(cuts)]
        return text[: len(text) - self.hold]

    async def _role(self, index: int) -> None:
        self.sent_ids.setdefault(index, [])
        if self.chat:
            delta = {"role": "assistant", "content": ""}
            await self._send({**self.head, "choices": [{"index": index, "delta": delta}]})

    async def _token(self, index: int, piece: str, c: Completion, k: int) -> None:
        """One chunk for token ``k`` of ``c`` (a delta or the whole completion)."""
        if index not in self.sent_ids:
            await self._role(index)
        self.sent_ids[index].append(c.token_ids[k])
        self.sent_text[index] = self.sent_text.get(index, "") + piece
        out: Json = {"index": index, "logprobs": None, "finish_reason": None}
        if self.chat:
            out["delta"] = {"content": piece}
        else:
            out["text"] = piece
        if self.logprobs and k < len(c.logprobs):
            at = self.offset.get(index, 0)
            out["logprobs"] = logprobs_json(self.spell, c, k, k + 1, chat=self.chat, at=at)
            self.offset[index] = at + len(self.spell(c.token_ids[k]))
        await self._send({**self.head, "choices": [out]})

    async def _send(self, data: Json) -> None:
        await self.response.write(_sse(data))
