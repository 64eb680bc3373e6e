"""Fixtures of the agent tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.arena.inference.backends.tokenizer import HFChatTokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> HFChatTokenizer:
    """The tiny model's tokenizer."""
    return load_tokenizer(str(tiny_model_dir))
