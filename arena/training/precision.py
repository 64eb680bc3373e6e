"""Mixed precision for the trainer (``precision: fp32 | bf16 | fp16`` in a training config).

- ``fp32``: everything in float32 (the default; exact on every device).
- ``bf16`` / ``fp16``: the master weights, the optimizer state and the gradients stay
  float32; forward passes run under ``torch.autocast`` in the half dtype (matrix products
  in half, softmax and reductions in float32). ``fp16`` adds a ``GradScaler`` (its small
  exponent range underflows gradients otherwise); ``bf16`` needs none.

The pool then serves the policy in the same half dtype, so the logprobs recorded at
generation and the trainer's agree up to the rounding of the two code paths; the trainer
measures what is left as ``logp_gap`` (see :mod:`parley.arena.training.pg`).

:func:`check_precision` refuses, with a :class:`ConfigError` saying what to use instead, a
precision the device cannot autocast to (it runs a tiny product under autocast and checks
the result's dtype, rather than trusting a table that goes stale with torch versions).
"""

from __future__ import annotations

import contextlib
from typing import Any

from parley.protocols.errors import ConfigError, require

__all__ = ["PRECISIONS", "autocast", "check_precision", "grad_scaler", "torch_dtype"]

PRECISIONS: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Config name -> the torch dtype name forward passes compute in."""


def torch_dtype(precision: str) -> Any:
    """The torch dtype of ``precision`` (:class:`ConfigError` for an unknown name)."""
    torch: Any = require("torch", "train")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: choose one of {sorted(PRECISIONS)}")
    return getattr(torch, PRECISIONS[precision])


def check_precision(precision: str, device: str = "cpu") -> None:
    """Raise :class:`ConfigError` unless forward passes on ``device`` can run in
    ``precision`` (``fp32`` always can)."""
    torch: Any = require("torch", "train")
    dtype = torch_dtype(precision)
    if precision == "fp32":
        return
    kind = torch.device(device).type
    if not torch.amp.is_autocast_available(kind):
        raise ConfigError(f"precision {precision}: torch has no autocast on {kind}; use fp32")
    if kind == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError("precision bf16: this GPU has no bfloat16 support; use fp16 or fp32")
    try:
        a = torch.ones((2, 2), device=device)
        with torch.autocast(kind, dtype=dtype):
            got = torch.mm(a, a).dtype
    except RuntimeError as exc:
        raise ConfigError(f"precision {precision} on {device}: {exc}; use fp32") from None
    if got != dtype:
        raise ConfigError(
            f"precision {precision}: autocast on {kind} computes in {got}, not {dtype}; "
            "use fp32 (or a precision this device supports)"
        )


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast block of ``precision`` on ``device_type`` (nothing for fp32)."""
    torch: Any = require("torch", "train")
    if precision == "fp32":
        return contextlib.nullcontext()
    block: contextlib.AbstractContextManager[Any] = torch.autocast(
        device_type, dtype=torch_dtype(precision)
    )
    return block


def grad_scaler(precision: str, device_type: str) -> Any:
    """A ``torch.amp.GradScaler`` for fp16, else None."""
    torch: Any = require("torch", "train")
    return torch.amp.GradScaler(device_type) if precision == "fp16" else None
