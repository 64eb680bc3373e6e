"""Models parley builds itself, so tests and demos run without downloads."""

from __future__ import annotations

from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

__all__ = ["TinyModelConfig", "build_tiny_model"]
