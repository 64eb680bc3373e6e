"""Loading from Hugging Face: tokenizers behind the ``ChatTokenizer`` surface
(:class:`~parley.arena.inference.backends.base.ChatTokenizer`), causal LMs, and the hub probe.

Every backend that knows its tokenizer locally (transformers, vLLM, an HTTP backend given a
tokenizer path) wraps it here, so agents encode chats the same way whichever backend serves
them. :func:`load_causal_lm` is the one way the backends and the trainer load a model
(serialised: see its docstring); :func:`check_hub_model` fails fast on a name that can be
neither found locally nor fetched.
"""

from __future__ import annotations

import logging
import os
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
    """Wraps a ``transformers`` tokenizer; ``hf`` is the wrapped object."""

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
        out = self.hf.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=True
        )
        # transformers 5 returns a BatchEncoding here, 4.x a plain list.
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(t) for t in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=True))


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
