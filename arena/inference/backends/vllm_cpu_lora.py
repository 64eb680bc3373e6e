"""Grouped LoRA ops for vLLM's CPU engine: one matmul per adapter, not one copy per token.

vLLM's CPU LoRA path (``vllm.lora.punica_wrapper.punica_cpu``, over
``vllm.lora.ops.torch_ops``) computes each LoRA layer by gathering every token's adapter
matrix (``weights[indices]``: a (tokens, out, rank) copy per layer per step) and one
einsum. A prefill of 1,000 tokens through a 1024-wide layer copies ~65 MB per op, so 4
adapters ran at 0.2x the plain model's tokens/s on the "small" bench model (hidden 512)
and 0.5-0.8x on the tiny one. It also reads the "no adapter" index -1 of base tokens as
the last slot (vllm-project/vllm#48421), which :mod:`~parley.arena.inference.backends.vllm_lora`
works around by keeping that slot empty.

With them, ``parley bench pool --backend vllm --model-size small`` measured
``multi_adapter_ratio_vs_single`` 0.73 (was 0.20); on the tiny model (hidden 128) the
step is bound by per-op overhead and stays near 0.46-0.8 on this loaded 2-core machine.
Per op (one thread, 6 slots, rank 16): 1,000 tokens x 1024 wide 76 ms -> 2.6 ms, 32
tokens x 1024 wide 0.55 -> 0.24 ms.

These replacements give the same results (row ``t`` is ``weights[indices[t]] @ x[t]``,
zero where ``indices[t] < 0``) with one matmul per adapter present in the batch. They are
installed inside vLLM's worker processes, explicitly, by the backend: the engine is
started with ``worker_extension_cls`` = :class:`GroupedLoRAOps` (CPU + LoRA only) and the
backend calls its :meth:`~GroupedLoRAOps.parley_group_lora_ops` through
``collective_rpc`` once the engine is up. Nothing changes on GPU (triton kernels).
"""

from __future__ import annotations

from typing import Any

__all__ = ["GroupedLoRAOps"]

WORKER_EXTENSION = "parley.arena.inference.backends.vllm_cpu_lora.GroupedLoRAOps"


def _grouped(inputs: Any, weights: Any, indices: Any, dtype: Any) -> Any:
    """(T, out): row t = weights[indices[t]] @ inputs[t]; zero where indices[t] < 0."""
    import torch

    w = weights.squeeze(1) if weights.dim() == 4 else weights  # (slots, out, in)
    x = inputs.to(dtype)  # (T, in)
    out = torch.zeros(x.shape[0], w.shape[1], dtype=dtype, device=x.device)
    for slot in torch.unique(indices).tolist():
        if slot < 0:  # base-model tokens: no adapter
            continue
        rows = (indices == slot).nonzero(as_tuple=True)[0]
        out[rows] = x[rows] @ w[slot].to(dtype).T
    return out


def bgmv_shrink(
    inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
    scaling: float = 1.0,
) -> None:  # fmt: skip
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
    add_inputs: bool = True,
) -> None:  # fmt: skip
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]  # vLLM's own rule: one output row broadcasts
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model padding
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
    slice_offset: int, slice_size: int, add_inputs: bool = True,
) -> None:  # fmt: skip
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


class GroupedLoRAOps:
    """A vLLM worker extension: ``collective_rpc("parley_group_lora_ops")`` swaps the CPU
    punica ops of the worker's process for the grouped ones above."""

    def parley_group_lora_ops(self) -> bool:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu

        # lora_ops' sgmv_* call its bgmv_* by their module-level names; punica_cpu imported
        # both sets by name. Replace the names in both modules.
        for module in (lora_ops, punica_cpu):
            module.bgmv_shrink = bgmv_shrink  # type: ignore[attr-defined]
            module.bgmv_expand = bgmv_expand  # type: ignore[attr-defined]
            module.bgmv_expand_slice = bgmv_expand_slice  # type: ignore[attr-defined]
        return True

    def parley_lora_ops(self) -> str:
        """The module whose ops this worker's CPU LoRA layers call (for checks)."""
        from vllm.lora.punica_wrapper import punica_cpu

        return str(punica_cpu.bgmv_shrink.__module__)  # type: ignore[attr-defined]
