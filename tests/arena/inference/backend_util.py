"""What the backend tests send: a chat prompt's token ids and a request of them."""

from __future__ import annotations

from parley.arena.inference.backends import Backend
from parley.protocols.messages import GenerateRequest, SamplingParams


def chat(backend: Backend, text: str) -> list[int]:
    """Token ids of ``text`` as one user message, through the backend's chat template."""
    return backend.tokenizer.encode_chat([{"role": "user", "content": text}])


def request(ids: list[int], **params: object) -> GenerateRequest:
    """A request of the prompt ``ids`` with these sampling parameters."""
    return GenerateRequest(prompt_token_ids=ids, params=SamplingParams(**params))  # type: ignore[arg-type]
