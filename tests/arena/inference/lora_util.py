"""PEFT LoRA adapters on the tiny model, built by tests (nothing can be downloaded)."""

from __future__ import annotations

from pathlib import Path

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of the tiny Llama: what a LoRA fine-tune of a chat model targets."""


def make_adapter(base: Path, out: Path, *, rank: int = 8, seed: int = 0) -> Path:
    """Save a LoRA adapter of ``base`` with random A and B (peft's default B = 0 would
    leave the output unchanged) into ``out``; the same seed gives the same adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS), init_lora_weights=False
    )
    torch.manual_seed(seed)
    get_peft_model(model, config).save_pretrained(out)
    return out


def adapter_tensors(path: Path) -> dict[str, object]:
    """The adapter's tensors as numpy arrays, named as a WeightUpdate carries them."""
    from safetensors.numpy import load_file

    return dict(load_file(str(path / "adapter_model.safetensors")))


def reference_greedy(
    base: Path, adapter: Path | None, prompt: list[int], n: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs from a plain float32 peft forward pass."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    ids = list(prompt)
    logprobs: list[float] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            logp = torch.log_softmax(logits, -1)
            token = int(logp.argmax())
            ids.append(token)
            logprobs.append(float(logp[token]))
    return ids[len(prompt) :], logprobs
