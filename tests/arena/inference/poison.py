"""Poisoned weights for both backends' tests: what a diverged trainer update looks like.

Each case poisons ONE tensor among good ones (NaN, +inf, -inf, or the tensor scaled by
1e8: finite, far past any trained weight), so a check that looks at the first tensor only,
or at finiteness only, lets some case through.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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
