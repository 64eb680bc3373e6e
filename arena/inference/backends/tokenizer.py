"""Loading from Hugging Face: tokenizers behind the ``ChatTokenizer`` surface
(:class:`~parley.arena.inference.backends.base.ChatTokenizer`), causal LMs, and the hub probe.

Every backend that knows its tokenizer locally (transformers, vLLM, an HTTP backend given a
tokenizer path) wraps it here, so agents encode chats the same way whichever backend serves
them. :func:`load_causal_lm` is the one way the backends and the trainer load a model
(serialised: see its docstring); :func:`check_hub_model` fails fast on a name that can be
neither found locally nor fetched.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parley.arena.inference.backends.base import BackendError
from parley.protocols.errors import require

__all__ = ["HFChatTokenizer", "check_hub_model", "load_causal_lm", "load_tokenizer"]

_log = logging.getLogger(__name__)
_LOADING = threading.Lock()


class HFChatTokenizer:
    """Wraps a ``transformers`` tokenizer; ``hf`` is the wrapped object.

    A message's content is text, never control: :meth:`encode_chat` encodes what a
    message says with ordinary tokens even where it spells one of the tokenizer's added
    tokens (``<|im_end|>``, ``<|im_start|>system``, ...). Rendered through the template as
    is, such text became the real special tokens, so one seat's message could close the
    other seat's user turn and open a forged system turn in its prompt.
    """

    def __init__(self, hf: Any) -> None:
        self.hf = hf

    @property
    def eos_token_id(self) -> int | None:
        eos = self.hf.eos_token_id
        return None if eos is None else int(eos)

    @property
    def pad_token_id(self) -> int:
        """Padding id: the tokenizer's pad token, else its eos token, else 0."""
        for tok in (self.hf.pad_token_id, self.hf.eos_token_id):
            if tok is not None:
                return int(tok)
        return 0

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.hf.encode(text)]

    def encode_chat(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        if not getattr(self.hf, "chat_template", None):
            raise BackendError(
                "this tokenizer has no chat template; build prompts as text or token ids, "
                "or use a checkpoint whose tokenizer_config.json defines chat_template"
            )
        markers = self._markers
        if markers is not None and any(
            isinstance(m.get("content"), str) and markers.search(m["content"]) for m in messages
        ):
            return self._encode_chat_quoted(messages, markers, add_generation_prompt)
        out = self.hf.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=True
        )
        return _ids(out)

    @functools.cached_property
    def _markers(self) -> re.Pattern[str] | None:
        """A pattern matching the text of any added token (the longest where several
        start at one place), or None for a tokenizer without any."""
        added = getattr(self.hf, "added_tokens_decoder", None) or {}
        texts = {str(getattr(t, "content", t)) for t in added.values()}
        texts |= {str(t) for t in getattr(self.hf, "all_special_tokens", ())}
        texts.discard("")
        return _literal_trie(texts) if texts else None

    def _encode_chat_quoted(
        self,
        messages: Sequence[dict[str, str]],
        markers: re.Pattern[str],
        add_generation_prompt: bool,
    ) -> list[int]:
        """:meth:`encode_chat` of a chat whose contents spell added tokens: the template is
        rendered with a placeholder per content, its own text encoded as usual (its
        markers are the real tokens), each content with added tokens split into ordinary
        ones. A template that does not keep the placeholders verbatim gets the contents with
        every marker broken by a space instead (never the special tokens)."""
        nonce = secrets.token_hex(8)
        holders = [f"parley{nonce}content{i}end" for i in range(len(messages))]
        chat = [
            {**m, "content": holders[i]} if isinstance(m.get("content"), str) else dict(m)
            for i, m in enumerate(messages)
        ]
        text = self.hf.apply_chat_template(
            chat, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        used = [i for i, m in enumerate(chat) if m.get("content") == holders[i]]
        pieces = re.split("(" + "|".join(holders[i] for i in used) + ")", str(text))
        if [holders.index(p) for p in pieces[1::2]] != used:
            broken = [
                {**m, "content": markers.sub(lambda x: x[0][0] + " " + x[0][1:], m["content"])}
                if isinstance(m.get("content"), str)
                else dict(m)
                for m in messages
            ]
            out = self.hf.apply_chat_template(
                broken, add_generation_prompt=add_generation_prompt, tokenize=True
            )
            return _ids(out)
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2 == 0:  # the template's own text
                if piece:
                    ids += _ids(self.hf(piece, add_special_tokens=False)["input_ids"])
            else:
                ids += self.ordinary_ids(messages[holders.index(piece)]["content"])
        return ids

    @functools.cached_property
    def _added_ids(self) -> frozenset[int]:
        added = getattr(self.hf, "added_tokens_decoder", None) or {}
        return frozenset(int(i) for i in added)

    def ordinary_ids(self, text: str) -> list[int]:
        """``text`` as ordinary tokens only, also where it spells an added token, special or
        not (content, never control). ``split_special_tokens`` splits the spellings of
        special tokens only: an added token that is not special (Qwen3's ``<think>``,
        ``<tool_call>``) came out whole. Each spelling of one is then encoded as its first
        character and the rest apart, and a piece that still gives an added token,
        character by character; it decodes back to ``text``."""
        ids = _ids(self.hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        markers = self._markers
        if markers is None or self._added_ids.isdisjoint(ids):
            return ids
        pieces, start = [], 0
        for found in markers.finditer(text):
            if found.group():
                pieces += [text[start : found.start()], found.group()[:1], found.group()[1:]]
                start = found.end()
        pieces.append(text[start:])
        out: list[int] = []
        for piece in filter(None, pieces):
            part = _ids(
                self.hf(piece, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            )
            if not self._added_ids.isdisjoint(part):
                part = [
                    i
                    for char in piece
                    for i in _ids(
                        self.hf(char, add_special_tokens=False, split_special_tokens=True)[
                            "input_ids"
                        ]
                    )
                ]
            out += part
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=True))


def _literal_trie(words: set[str]) -> re.Pattern[str]:
    """A pattern matching any of ``words``, built as a trie (shared prefixes written once):
    one alternation of thousands of literals (a tokenizer with many reserved tokens) cost
    ~6 ms a search over a 4,000-character message, the trie ~15 us."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        group = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{group})?" if "" in node else group  # (greedy: the longest word)

    return re.compile(build(trie))


def _ids(out: Any) -> list[int]:
    """Token ids from what a tokenizer returned (transformers 5 returns a BatchEncoding
    where 4.x returned a plain list)."""
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(t) for t in ids]


def load_tokenizer(name_or_path: str, **options: Any) -> HFChatTokenizer:
    """Load a tokenizer by path or hub id (``AutoTokenizer``), padding on the left."""
    transformers: Any = require("transformers", "torch")
    if name_or_path.startswith((".", "/", "~")) and not Path(name_or_path).expanduser().exists():
        raise BackendError(
            f"no model directory at {name_or_path!r}; make one with `parley model tiny DIR` "
            "or pass an existing checkpoint directory"
        )
    check_hub_model(name_or_path)
    try:
        hf = transformers.AutoTokenizer.from_pretrained(name_or_path, **options)
    except (OSError, ValueError) as exc:  # no such directory, no files, not on the hub
        raise BackendError(
            f"cannot load a tokenizer from {name_or_path!r}: {str(exc).splitlines()[0]}. Pass "
            "a model directory (e.g. one made by `parley model tiny DIR`) or a hub id "
            "available offline"
        ) from exc
    hf.padding_side = "left"
    return HFChatTokenizer(hf)


def check_hub_model(name: str) -> None:
    """Fail fast on a model name that is neither a local directory nor reachable.

    Loading a hub id from a machine that cannot reach the hub spends a minute in Hugging
    Face's retries before failing. One probe without retries (a fraction of a second) says
    at once: a missing repository is a :class:`BackendError`; an unreachable hub with the
    model in the local cache switches this process to offline mode (``HF_HUB_OFFLINE``,
    inherited by engine subprocesses) and loads the cached copy; an unreachable hub without
    it is a :class:`BackendError` that says what to do.
    """
    if Path(name).expanduser().exists():
        return
    hub: Any = require("huggingface_hub", "torch")
    constants: Any = require("huggingface_hub.constants", "torch")
    errors: Any = require("huggingface_hub.errors", "torch")
    if constants.HF_HUB_OFFLINE:
        return  # the user chose offline mode: loading reads the cache only, without retries
    cached = isinstance(hub.try_to_load_from_cache(name, "config.json"), str)
    try:
        hub.model_info(name, timeout=10)
    except (errors.RepositoryNotFoundError, errors.GatedRepoError) as exc:
        if cached:
            return
        raise BackendError(
            f"no model {name!r} on the Hugging Face hub ({type(exc).__name__}), and no "
            "local directory of that name; check the id (or log in with `hf auth login` "
            "for a gated or private model), or pass a model directory"
        ) from exc
    except Exception as exc:  # any network failure: DNS, refused, TLS, proxy, timeout
        if not cached:
            raise BackendError(
                f"{name!r} is not a local directory and the Hugging Face hub cannot be "
                f"reached ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); pass a "
                "model directory (e.g. one made by `parley model tiny DIR`), or download the "
                "model where the hub is reachable and set HF_HUB_OFFLINE=1"
            ) from exc
        os.environ["HF_HUB_OFFLINE"] = "1"
        constants.HF_HUB_OFFLINE = True
        _log.warning("the Hugging Face hub cannot be reached: loading %s from the cache", name)


def load_causal_lm(name_or_path: str, **options: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained(name_or_path, **options)``, one load at a time.

    transformers 5 builds a model under process-wide state (a meta-device init context,
    tied-weight bookkeeping): three seats loading three checkpoints in worker threads at once
    failed with "Cannot copy out of meta tensor" or left ``lm_head`` uninitialised. Loads
    are serialised by a lock; they are I/O- and CPU-bound anyway.
    """
    transformers: Any = require("transformers", "torch")
    with _LOADING:
        return transformers.AutoModelForCausalLM.from_pretrained(name_or_path, **options)
