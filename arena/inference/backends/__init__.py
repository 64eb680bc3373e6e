"""Inference backends behind one batch interface (list in, list out, same order).

Import a backend through :func:`load_backend` (``"transformers"``, ``"vllm"``,
``"openai"``): each module's heavy dependencies are imported only then.
"""

from __future__ import annotations

from parley.arena.inference.backends.base import (
    BACKENDS,
    Backend,
    BackendError,
    ChatTokenizer,
    RequestError,
    load_backend,
)

__all__ = [
    "Backend",
    "BackendError",
    "RequestError",
    "ChatTokenizer",
    "BACKENDS",
    "load_backend",
]
