"""Seats loading different checkpoints at once each get their own weights, whole.

``parley run --agents llm:A,llm:B,llm:C`` starts three backends concurrently, each loading in
a worker thread; transformers 5's ``from_pretrained`` is not thread-safe, and three
concurrent loads failed ("Cannot copy out of meta tensor") or left ``lm_head`` freshly
initialised (the tied weights missed).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch

from parley.arena.inference.backends import load_backend
from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("three-checkpoints")
    return [build_tiny_model(root / f"m{seed}", TinyModelConfig(seed=seed)) for seed in (1, 2, 3)]


def _weights(backend: object) -> dict[str, torch.Tensor]:
    model = backend.model  # type: ignore[attr-defined]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


async def test_three_checkpoints_loaded_at_once_are_each_whole(checkpoints: list[Path]) -> None:
    alone = []
    for path in checkpoints:  # one after the other: the reference
        backend = await load_backend("transformers", str(path))
        alone.append(_weights(backend))
        await backend.close()
    for _ in range(3):  # the race did not show on every try
        together = await asyncio.gather(
            *(load_backend("transformers", str(path)) for path in checkpoints)
        )
        try:
            for backend, reference in zip(together, alone, strict=True):
                got = _weights(backend)
                assert got.keys() == reference.keys()
                for name, tensor in reference.items():
                    assert torch.equal(got[name], tensor), name
        finally:
            for backend in together:
                await backend.close()
