"""Prefix reuse for the transformers backend: keep the KV cache of recent sequences and
prefill only the tokens a new prompt adds to the longest cached prefix.

An LLM agent re-sends its whole history every turn, so without reuse an episode's prefill
grows with the square of its length. The backend stores, after each request, the keys and
values of its prompt plus its first completion (every token fed to the model); the next
turn's prompt usually extends them, and only the new tail is prefilled.

Contract (correctness never depends on a client):

- Entries are keyed by **token ids** (and the policy whose weights computed them), never by
  a session id: a lookup takes the longest common prefix of the prompt with any entry, so a
  prompt that extends, shortens or diverges from a cached sequence reuses exactly the
  tokens that agree and prefills the rest. The result equals a full recompute up to float
  rounding (the tests hold logprobs within 1e-5).
- At least one prompt token is always prefilled (its logits start the completion).
- Any weight change clears the entries it affects (:meth:`PrefixCache.clear`).
- Bounded by ``budget_bytes`` of KV tensors, evicted least-recently-used, in two segments
  (segmented LRU). A new entry enters *probation*; an entry whose prefix served a later
  request, and the entry that continues it, are *protected* (at most 3/4 of the budget;
  the least recent protected entry is demoted to probation beyond that). Cost cap per
  request: one entry per request, of at most 1/4 of the budget (a longer sequence is not
  stored). So a client that floods one-off prompts only churns the probation quarter and
  cannot evict the caches of sessions that reuse theirs; only other reused sessions, by
  being more recent, can. There is no per-client quota because the backend does not see
  clients (requests carry no identity), only token ids.
- An episode's entries are not dropped at its end by a signal (requests carry no session):
  each turn's entry replaces the previous turn's (which is its prefix), so a session holds
  one entry, and a finished one ages out of the LRU.

Only models whose every layer attends to the full context take part (``supported``):
sliding-window or recurrent layers keep state that a padded prefix layout would change.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from parley.protocols.errors import require

torch: Any = require("torch", "torch")

__all__ = ["CacheEntry", "PrefixCache", "supported", "batch_prefill", "row_kv"]

_PROTECTED_SHARE = 0.75
_ENTRY_SHARE = 0.25


@dataclasses.dataclass(eq=False)
class CacheEntry:
    """The keys and values of ``ids`` under ``policy``: per layer (keys, values), each
    (H, T, D) on the model's device."""

    policy: str
    ids: np.ndarray  # (T,) int64
    kv: list[tuple[Any, Any]]
    nbytes: int
    protected: bool = False


@dataclasses.dataclass
class PrefixStats:
    """Counters since the backend started (or the last :meth:`PrefixCache.reset_stats`)."""

    prompt_tokens: int = 0
    """Prompt tokens of every decoded row."""
    prefilled_tokens: int = 0
    """Prompt tokens run through the model (the rest came from the cache)."""
    stored: int = 0
    evicted: int = 0
    refused: int = 0
    """Sequences not stored because they exceed the per-request cap."""

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens taken from the cache."""
        return 1 - self.prefilled_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PrefixCache:
    """Token-id-keyed KV entries under a byte budget (segmented LRU; see the module doc).

    Used from the backend's one decoding thread only (no locking). ``budget_bytes`` 0
    disables it: lookups miss and nothing is stored.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = max(0, int(budget_bytes))
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # LRU first
        self.stats = PrefixStats()

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, policy: str, prompt: Sequence[int]) -> tuple[CacheEntry | None, int]:
        """The entry sharing the longest prefix with ``prompt`` and how many tokens of it to
        reuse (at most ``len(prompt) - 1``); ``(None, 0)`` when nothing agrees. A hit makes
        the entry most recent and protected. Counted in :attr:`stats` (one decoded row)."""
        ids = np.asarray(prompt, dtype=np.int64)
        best, best_len = None, 0
        for entry in self._entries.values():
            if entry.policy != policy:
                continue
            n = min(len(entry.ids), len(ids))
            differ = np.flatnonzero(entry.ids[:n] != ids[:n])
            common = int(differ[0]) if len(differ) else n
            if common > best_len:
                best, best_len = entry, common
        reuse = max(0, min(best_len, len(ids) - 1))
        self.stats.prompt_tokens += len(ids)
        self.stats.prefilled_tokens += len(ids) - reuse
        if best is None or reuse <= 0:
            return None, 0
        self._touch(best, protect=True)
        return best, reuse

    def store(
        self, policy: str, ids: Sequence[int], kv: list[tuple[Any, Any]], hit: CacheEntry | None
    ) -> None:
        """Keep ``kv`` (per layer (keys, values), (H, T, D)) for ``ids``. ``hit`` is the
        entry the request reused: when it is a prefix of ``ids`` it is replaced (the
        session moved on) and the new entry is protected."""
        if self.budget <= 0 or not ids:
            return
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.budget * _ENTRY_SHARE:
            self.stats.refused += 1
            return
        arr = np.asarray(ids, dtype=np.int64)
        continues = (
            hit is not None
            and id(hit) in self._entries
            and len(hit.ids) <= len(arr)
            and bool(np.array_equal(hit.ids, arr[: len(hit.ids)]))
        )
        if continues and hit is not None:
            del self._entries[id(hit)]
        entry = CacheEntry(policy, arr, kv, nbytes)
        self._entries[id(entry)] = entry
        self.stats.stored += 1
        self._touch(entry, protect=continues)
        self._evict()

    def clear(self, policy: str | None = None) -> None:
        """Drop every entry (``policy`` None: after a base-weights change) or ``policy``'s
        (its adapter changed)."""
        for key, entry in list(self._entries.items()):
            if policy is None or entry.policy == policy:
                del self._entries[key]

    def reset_stats(self) -> None:
        self.stats = PrefixStats()

    def _touch(self, entry: CacheEntry, *, protect: bool) -> None:
        entry.protected = entry.protected or protect
        self._entries.move_to_end(id(entry))

    def _evict(self) -> None:
        protected = [e for e in self._entries.values() if e.protected]  # LRU first
        size = sum(e.nbytes for e in protected)
        for e in protected:
            if size <= self.budget * _PROTECTED_SHARE:
                break
            e.protected = False  # demoted: probation, keeping its recency
            size -= e.nbytes
        total = self.nbytes
        # Probation first: by the caps above, the protected entries alone always fit.
        for pass_protected in (False, True):
            for key, e in list(self._entries.items()):
                if total <= self.budget:
                    return
                if e.protected == pass_protected:
                    del self._entries[key]
                    total -= e.nbytes
                    self.stats.evicted += 1


def supported(model: Any) -> bool:
    """Whether prefix reuse is exact for ``model``: every layer is full attention."""
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if config is not None else None
    if text is None:
        return False
    types = getattr(text, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return getattr(text, "sliding_window", None) is None


def batch_prefill(
    prompts: Sequence[Sequence[int]], hits: Sequence[tuple[CacheEntry | None, int]], pad: int
) -> tuple[Any, Any, Any, Any]:
    """The first forward's inputs for rows with cached prefixes of different lengths.

    Row ``k`` reuses ``hits[k] = (entry, c_k)``: the first ``c_k`` positions of the
    entry. Layout per row, C = max c_k, S = max suffix: ``[pad * (C - c_k), cached c_k,
    pad * (S - s_k), suffix s_k]``; the attention mask hides both pads and position ids
    count only real tokens, so each row computes exactly as alone and unpadded. Returns
    (suffix ids (B, S), mask (B, C + S), suffix positions (B, S), DynamicCache of C).
    """
    transformers: Any = require("transformers", "torch")
    cached = [c for _, c in hits]
    width_c = max(cached)
    width_s = max(len(p) - c for p, c in zip(prompts, cached, strict=True))
    ids = torch.full((len(prompts), width_s), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width_c + width_s), dtype=torch.long)
    for k, (prompt, c) in enumerate(zip(prompts, cached, strict=True)):
        suffix = prompt[c:]
        ids[k, width_s - len(suffix) :] = torch.tensor(suffix)
        mask[k, width_c - c : width_c] = 1
        mask[k, width_c + width_s - len(suffix) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, width_c:]  # (B, S)
    cache = transformers.DynamicCache()
    if width_c:
        template = next(e for e, c in hits if e is not None and c > 0).kv
        layers = []
        for layer, (k0, v0) in enumerate(template):
            keys = k0.new_zeros((len(prompts), k0.shape[0], width_c, k0.shape[2]))
            values = v0.new_zeros((len(prompts), v0.shape[0], width_c, v0.shape[2]))
            for k, (entry, c) in enumerate(hits):
                if entry is not None and c > 0:
                    keys[k, :, width_c - c :] = entry.kv[layer][0][:, :c]
                    values[k, :, width_c - c :] = entry.kv[layer][1][:, :c]
            layers.append((keys, values))
        cache = transformers.DynamicCache(ddp_cache_data=layers)
    return ids, mask, positions, cache


def row_kv(cache: Any, row: int, mask_row: Any) -> list[tuple[Any, Any]]:
    """Copies of row ``row``'s keys and values at its real positions (``mask_row`` == 1),
    per layer, each (H, T, D)."""
    keep = mask_row.nonzero().flatten().to(cache.layers[0].keys.device)
    return [
        (layer.keys[row].index_select(1, keep), layer.values[row].index_select(1, keep))
        for layer in cache.layers
    ]
