"""Checks of weights before a backend serves them: one bad tensor must not reach the model.

Every backend runs these on every LoRA adapter (at start-up and by hot swap) and every
full-weight update BEFORE anything changes, so a diverged trainer update is refused with
the name of the bad tensor and every policy keeps serving what it served:

- non-finite values (NaN, ±inf): measured on vLLM (CPU), an adapter of NaN was accepted
  and its requests then decoded token 0 with NaN logprobs; the issue reported the base
  itself so corrupted;
- values of magnitude above a limit (the tensor's L∞ norm, :data:`WEIGHT_LIMIT` unless the
  backend was created with another ``weight_limit``): finite in float32 yet far beyond
  what any trained weight holds, and products of two such values overflow to inf inside
  the forward pass (1e20 · 1e20 > float32's 3.4e38), with the same effect as NaN.

Integer tensors (buffers such as position ids) are not bounded. Files are read one tensor
at a time (safetensors maps them), so checking a checkpoint holds one tensor in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from parley.arena.inference.backends.errors import BackendError
from parley.protocols.errors import require
from parley.protocols.messages import WeightUpdate

__all__ = ["WEIGHT_LIMIT", "check_weights", "check_weight_files"]

WEIGHT_LIMIT = 1e4
"""Largest magnitude a served weight may hold. Trained transformer weights (embeddings,
projections, norm scales, LoRA factors) lie within a few hundred; a value past 1e4 is a
diverged or corrupted update. Backends take ``weight_limit`` to change it."""


def check_weights(tensors: Mapping[str, Any], what: str, *, limit: float = WEIGHT_LIMIT) -> None:
    """Raise :class:`BackendError` naming the first tensor of ``tensors`` (name -> numpy
    array or torch tensor) that holds NaN, an infinite value or a value of magnitude above
    ``limit``; ``what`` says what is checked (``"update of adapter 'a'"``)."""
    for name, tensor in tensors.items():
        _check_one(name, tensor, what, limit)


def check_weight_files(files: Iterable[Path], what: str, *, limit: float = WEIGHT_LIMIT) -> None:
    """:func:`check_weights` over every tensor of the ``.safetensors`` ``files``, one
    tensor in memory at a time. A file that cannot be read is a :class:`BackendError`."""
    safetensors: Any = require("safetensors", "torch")
    for file in files:
        try:
            with safetensors.safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    _check_one(name, f.get_tensor(name), f"{what} ({file.name})", limit)
        except (OSError, safetensors.SafetensorError) as exc:
            raise BackendError(f"{what}: cannot read {file}: {exc}") from exc


def _check_one(name: str, tensor: Any, what: str, limit: float) -> None:
    torch: Any = require("torch", "torch")
    t = tensor if isinstance(tensor, torch.Tensor) else torch.as_tensor(tensor)
    if not t.is_floating_point() or t.numel() == 0:
        return
    # One pass over the tensor: aminmax propagates NaN, and ±inf shows as an extreme.
    low, high = (float(v) for v in torch.aminmax(t.detach()))
    largest = max(-low, high)
    if largest != largest:  # NaN is the only value unequal to itself
        raise BackendError(
            f"{what}: tensor {name!r} holds NaN values; nothing was changed (a diverged "
            "update? check the trainer's loss and learning rate, then send finite weights)"
        )
    if largest == float("inf"):
        raise BackendError(
            f"{what}: tensor {name!r} holds infinite values; nothing was changed (a "
            "diverged update? check the trainer's loss and learning rate)"
        )
    if largest > limit:
        raise BackendError(
            f"{what}: tensor {name!r} holds a value of magnitude {largest:.3g}, above the "
            f"limit {limit:g} on served weights; nothing was changed (a diverged update? "
            "if such weights are meant, create the backend with a larger weight_limit)"
        )


def stage_weights(update: WeightUpdate, tmp: Path, limit: float) -> str:
    """The directory of safetensors to reload from: ``update.path`` itself when it is a
    directory, else ``tmp`` holding a link to the file or the inline tensors; every tensor
    in it checked (finite, magnitude at most ``limit``). A directory is checked in place,
    not copied (a checkpoint may be many GB): one rewritten between the check and the
    reload is read as it is then."""
    if update.path:
        path = Path(update.path)
        if not path.exists():
            raise BackendError(f"no weights at {update.path}")
        if not path.is_dir():
            (tmp / path.name).symlink_to(path.resolve())
            path = tmp
    elif update.tensors:
        safetensors: Any = require("safetensors.numpy", "torch")
        arrays = {k: v.copy() for k, v in update.tensors.items()}
        safetensors.save_file(arrays, str(tmp / "model.safetensors"))
        path = tmp
    else:
        raise BackendError("weight update carries no tensors: set path or tensors")
    check_weight_files(sorted(path.glob("*.safetensors")), "weight update", limit=limit)
    return str(path)
