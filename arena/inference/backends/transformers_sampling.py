"""Rows and sampling of the transformers backend: one decoding step's draw for a batch.

Shared by the static loop (:mod:`~parley.arena.inference.backends.transformers`) and the
continuous scheduler (:mod:`~parley.arena.inference.backends.transformers_sched`), so
both pick every token the same way: constraint mask, temperature, top-p, then one draw
per row from the row's own ``torch.Generator``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from parley.arena.inference.backends.constraints import TokenMatcher
from parley.protocols.errors import require
from parley.protocols.messages import Completion, FinishReason, SamplingParams

torch: Any = require("torch", "torch")

__all__ = ["Row", "sample"]


@dataclasses.dataclass(eq=False)
class Row:
    """One completion being decoded (a request with ``n`` > 1 has ``n`` rows)."""

    request: int
    prompt: list[int]
    params: SamplingParams
    generator: Any  # torch.Generator
    matcher: TokenMatcher | None
    max_tokens: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_ids: list[list[int]] = dataclasses.field(default_factory=list)
    top_logprobs: list[list[float]] = dataclasses.field(default_factory=list)
    text: str | None = None  # set when a stop string cut the text
    finish: FinishReason | None = None
    index: int = 0  # which of the request's n completions
    policy: str = ""  # the request's policy: an adapter's name, or the base
    sink: Callable[[int, Completion], None] | None = None  # thread-safe (HTTP streaming)
    hit: Any = None  # the prefix-cache entry the row reused (a CacheEntry), if any
    job: Any = None  # the continuous scheduler's Job the row belongs to


def sample(
    logits: Any, rows: list[Row]
) -> tuple[Any, Any, list[tuple[list[int], list[float]] | None]]:
    """Pick one token per row; returns (tokens (B,), their logprobs (B,), per row the
    top-k (ids, logprobs) of the same distribution or None) on the CPU.

    Order: constraint mask, temperature, top-p, draw. Greedy rows (temperature 0)
    take the argmax of the masked temperature-1 distribution.
    """
    logits = logits.cpu()
    for k, row in enumerate(rows):
        if row.matcher is not None:
            allowed = torch.from_numpy(row.matcher.allowed())
            logits[k].masked_fill_(~allowed, float("-inf"))
    temps = torch.tensor([r.params.temperature for r in rows], dtype=logits.dtype)
    greedy = temps == 0
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    top_p = torch.tensor([r.params.top_p for r in rows], dtype=logits.dtype)
    nucleus = (top_p < 1) & ~greedy
    if nucleus.any():
        logp[nucleus] = top_p_filter(logp[nucleus], top_p[nucleus])
    tokens = logp.argmax(dim=-1)
    sampled = (~greedy).nonzero().flatten().tolist()
    if sampled:
        u = torch.cat([torch.rand(1, generator=rows[k].generator) for k in sampled])
        cdf = logp[sampled].exp().cumsum(dim=-1)  # (S, V)
        # right=True: the first token whose cdf exceeds u, which has probability > 0.
        picks = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
        tokens[sampled] = picks.flatten().clamp(max=logits.shape[-1] - 1)
    return tokens, logp.gather(1, tokens[:, None]).flatten(), top_k(logp, rows)


def top_k(logp: Any, rows: list[Row]) -> list[tuple[list[int], list[float]] | None]:
    """Per row, the ``params.top_logprobs`` most likely (ids, logprobs) of ``logp`` (B, V),
    most likely first, without tokens of probability 0 (masked); None where not asked."""
    asked = [r.params.top_logprobs if r.params.logprobs else 0 for r in rows]
    if not any(asked):
        return [None] * len(rows)
    values, ids = logp.topk(min(max(asked), logp.shape[-1]), dim=-1)  # (B, k), sorted
    tops: list[tuple[list[int], list[float]] | None] = []
    for k, want in enumerate(asked):
        if not want:
            tops.append(None)
            continue
        keep = torch.isfinite(values[k, :want])
        tops.append((ids[k, :want][keep].tolist(), values[k, :want][keep].tolist()))
    return tops


def top_p_filter(logp: Any, top_p: Any) -> Any:
    """Keep each row's smallest set of tokens with probability >= top_p; renormalise.

    ``logp`` (R, V) log-probabilities, ``top_p`` (R,). The most likely token always stays.
    """
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()  # mass above each token
    drop_sorted = before >= top_p[:, None]
    drop_sorted[:, 0] = False  # even when top_p rounds to 0 in float32 (1e-320)
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    logp = logp.masked_fill(drop, float("-inf"))
    return logp - torch.logsumexp(logp, dim=-1, keepdim=True)
