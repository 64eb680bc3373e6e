"""Poisoned weights for both backends' tests: what a diverged trainer update looks like.

Each case poisons ONE tensor among good ones (NaN, +inf, -inf, or the tensor scaled by
1e8: finite, far past any trained weight), so a check that looks at the first tensor only,
or at finiteness only, lets some case through.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CASES: dict[str, tuple[float | None, str]] = {
    "NaN": (float("nan"), "NaN"),
    "inf": (float("inf"), "infinite"),
    "-inf": (float("-inf"), "infinite"),
    "huge": (None, "above the limit"),  # None: the tensor times 1e8
}
"""case -> (the value filling the poisoned tensor, a phrase the refusal must contain)."""


def poisoned(tensors: dict[str, np.ndarray], name: str) -> dict[str, tuple[dict, str]]:
    """case -> (``tensors`` with ``name`` poisoned, the phrase its refusal must contain)."""
    out = {}
    for case, (fill, phrase) in CASES.items():
        good = np.asarray(tensors[name])
        bad = good * np.float32(1e8) if fill is None else np.full_like(good, fill)
        out[case] = ({**tensors, name: bad.astype(good.dtype)}, phrase)
    return out


def write_adapter(src: Path, dst: Path, tensors: dict[str, np.ndarray]) -> Path:
    """A PEFT adapter directory at ``dst``: ``src``'s config with ``tensors``."""
    from safetensors.numpy import save_file

    dst.mkdir(parents=True)
    config = json.loads((src / "adapter_config.json").read_text())
    (dst / "adapter_config.json").write_text(json.dumps(config))
    save_file(dict(tensors), str(dst / "adapter_model.safetensors"))
    return dst


async def push_poison(
    backend: Any, adapter: Path, swap: str, base: str, hidden: int, tmp: Path
) -> None:
    """Push every case at ``backend`` and require each refused naming the tensor: the
    adapter ``adapter`` poisoned, as a new adapter (ConfigError) and as a hot swap of
    adapter policy ``swap`` (inline and as a directory; BackendError), and the base's
    final norm poisoned as a full-weight update of policy ``base`` (inline and as a file;
    ``hidden`` is its size)."""
    from safetensors.numpy import save_file

    from parley.arena.inference.backends.errors import BackendError
    from parley.protocols.errors import ConfigError
    from parley.protocols.messages import WeightUpdate
    from tests.arena.inference.lora_util import adapter_tensors

    good = adapter_tensors(adapter)
    name = sorted(good)[-1]  # the last tensor: every tensor is checked, not the first
    for case, (tensors, phrase) in poisoned(good, name).items():
        bad_dir = write_adapter(adapter, tmp / case, tensors)
        with pytest.raises(ConfigError, match=phrase) as err:
            await backend.add_adapter("mallory", str(bad_dir))
        assert name in str(err.value), case
        for update in (
            WeightUpdate(policy=swap, version=7, tensors=tensors),
            WeightUpdate(policy=swap, version=7, path=str(bad_dir)),
        ):
            with pytest.raises(BackendError, match=phrase):
                await backend.update_weights(update)
    norm = {"model.norm.weight": np.ones(hidden, "f4")}
    for case, (tensors, phrase) in poisoned(norm, "model.norm.weight").items():
        file = tmp / f"{case}.safetensors"
        save_file(tensors, str(file))
        for update in (
            WeightUpdate(policy=base, version=1, tensors=tensors),
            WeightUpdate(policy=base, version=1, path=str(file)),
        ):
            with pytest.raises(BackendError, match=phrase):
                await backend.update_weights(update)
