"""A Hugging Face tokenizer behind the ``ChatTokenizer`` surface
(:class:`~parley.arena.inference.backends.base.ChatTokenizer`).

Every backend that knows its tokenizer locally (transformers, vLLM, an HTTP backend given a
tokenizer path) wraps it here, so agents encode chats the same way whichever backend serves
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parley.arena.inference.backends.base import BackendError
from parley.protocols.errors import require

__all__ = ["HFChatTokenizer", "load_tokenizer"]


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
