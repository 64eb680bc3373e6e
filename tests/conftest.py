"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama + tokenizer (``parley model tiny``), built once per test session."""
    pytest.importorskip("torch")
    from parley.arena.inference.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_rm_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a seeded, untrained score head, saved as a reward model
    (untrained is enough where tests compare paths and scores, not quality)."""
    torch = pytest.importorskip("torch")
    from parley.arena.inference.backends.scorer import load_reward_model

    out = tmp_path_factory.mktemp("rm") / "tiny-rm"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, tokenizer = load_reward_model(tiny_model_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray of 2 CPUs (no dashboard) for the module's tests, shut down after them;
    a private one even where a cluster runs on this machine (``ray start``), which a bare
    ``ray.init`` would join."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
