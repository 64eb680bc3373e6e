"""A short LoRA training run on vLLM: two adapters on one base learn by REINFORCE, every
update hot-swapped into the serving engine (``scripts/gpu_check.sh`` runs it on a GPU).

Two policies, ``left`` and ``right``, are LoRA adapters of one freshly built model, served
together by one vLLM engine (:class:`~parley.arena.inference.backends.vllm.VLLMBackend`,
multi-LoRA) and trained by a torch/peft copy of the same model on ``--device``. Each
update: both policies sample ``--batch`` completions of ``--max-tokens`` tokens in one
engine (their requests batched together); the reward of a completion is the share of its
tokens in the policy's half of the vocabulary (``left``: the lower ids, ``right``: the
upper; about 0.5 at the start); REINFORCE
with the batch mean as baseline on the logprobs of the trainer's forward pass; then only
the adapter's tensors are sent to the engine (``WeightUpdate(policy, version, tensors)``),
which swaps that adapter alone. The base is never trained; its output must not change.

Prints one JSON object: per policy the mean reward of the first update and of the last five,
the seconds per update, the seconds each weight sync took, and the generated tokens/s.

    python scripts/gpu_lora_train.py --device cuda --updates 30        # on a GPU
    python scripts/gpu_lora_train.py --device cpu --size tiny --updates 3   # a CPU dry run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = {  # TinyModelConfig fields; "small" is what `parley bench pool --model-size small` builds
    "tiny": {},
    "small": {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "intermediate_size": 1024},
}
POLICIES = {"left": 0, "right": 1}  # policy -> the half of the vocabulary its reward counts


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", default="cuda", help="the trainer's torch device")
    p.add_argument("--size", choices=sorted(SIZES), default="small", help="model built")
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--batch", type=int, default=32, help="completions per policy per update")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--rank", type=int, default=8)
    # 3e-3 did not move the tiny model's reward in 20 updates on CPU; 3e-2 took one policy
    # from 0.49 to 0.95 in 12 (batch 16).
    p.add_argument("--lr", type=float, default=2e-2)
    return p.parse_args()


def _build(root: Path, size: str, rank: int, device: str) -> tuple[Path, dict[str, Any]]:
    """The base model and one peft model per policy (adapter saved as version 0)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from parley.arena.inference.models.tiny import TinyModelConfig, build_tiny_model

    base = build_tiny_model(root / "base", TinyModelConfig(**SIZES[size]))
    models = {}
    for i, name in enumerate(POLICIES):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
        peft_model = get_peft_model(model, config).to(device)
        peft_model.save_pretrained(str(root / name))
        models[name] = peft_model
    return base, models


def _logprobs(model: Any, prompt: list[int], completions: list[list[int]], device: str) -> Any:
    """(B,) summed logprobs of each completion under ``model`` (right-padded batch)."""
    import torch

    width = max(len(c) for c in completions)
    ids = torch.zeros(len(completions), len(prompt) + width, dtype=torch.long)
    mask = torch.zeros(len(completions), width)
    for i, c in enumerate(completions):
        ids[i, : len(prompt) + len(c)] = torch.tensor(prompt + c)
        mask[i, : len(c)] = 1
    ids, mask = ids.to(device), mask.to(device)
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1].float()  # (B, T, V)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, len(prompt) :, None])[..., 0]
    return (logp * mask).sum(-1)  # (B,)


async def _train(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import torch
    from peft import get_peft_model_state_dict

    from parley.arena.inference.backends import load_backend
    from parley.protocols.messages import GenerateRequest, SamplingParams, WeightUpdate

    base, models = await asyncio.to_thread(_build, root, args.size, args.rank, args.device)
    # On a GPU the engine shares the device with the trainer: a third of its memory.
    engine_args = {"gpu_memory_utilization": 0.3} if args.device.startswith("cuda") else {}
    backend = await load_backend(
        "vllm",
        str(base),
        max_model_len=256,
        max_loras=len(POLICIES),
        max_lora_rank=args.rank,
        engine_args=engine_args,
    )
    try:
        for name in POLICIES:
            await backend.add_adapter(name, str(root / name))
        prompt = backend.tokenizer.encode_chat([{"role": "user", "content": "say it"}])
        optims = {n: torch.optim.Adam(m.parameters(), lr=args.lr) for n, m in models.items()}
        half = len(backend.tokenizer) // 2  # type: ignore[arg-type]  # (HFChatTokenizer)
        plain = GenerateRequest(prompt_token_ids=prompt, params=SamplingParams(temperature=0))
        (base_before,) = await backend.generate([plain])
        rewards: dict[str, list[float]] = {n: [] for n in POLICIES}
        update_s, sync_s, tokens, gen_s = [], [], 0, 0.0
        for version in range(1, args.updates + 1):
            start = time.perf_counter()
            batch = [
                GenerateRequest(policy=n, prompt_token_ids=prompt,
                                params=SamplingParams(max_tokens=args.max_tokens,
                                                      seed=version * 1000 + j))
                for n in POLICIES
                for j in range(args.batch)
            ]  # fmt: skip
            results = await backend.generate(batch)
            gen_s += time.perf_counter() - start
            for name, side in POLICIES.items():
                done = [list(r.completions[0].token_ids) for r in results if r.policy == name]
                tokens += sum(len(c) for c in done)
                hits = [sum((t >= half) == bool(side) for t in c) for c in done]
                reward = torch.tensor([h / max(1, len(c)) for h, c in zip(hits, done, strict=True)])
                rewards[name].append(float(reward.mean()))
                logp = _logprobs(models[name], prompt, done, args.device)
                loss = -((reward.to(args.device) - reward.mean().to(args.device)) * logp).mean()
                optims[name].zero_grad()
                loss.backward()
                optims[name].step()
                state = get_peft_model_state_dict(models[name])
                tensors = {k: v.detach().float().cpu().numpy() for k, v in state.items()}
                t0 = time.perf_counter()
                await backend.update_weights(WeightUpdate(policy=name, version=version,
                                                          tensors=tensors))  # fmt: skip
                sync_s.append(time.perf_counter() - t0)
            update_s.append(time.perf_counter() - start)
        (base_after,) = await backend.generate([plain])
        return {
            "model": args.size,
            "device": args.device,
            "updates": args.updates,
            "reward_first": {n: round(r[0], 3) for n, r in rewards.items()},
            "reward_last": {n: round(statistics.mean(r[-5:]), 3) for n, r in rewards.items()},
            "seconds_per_update": round(statistics.median(update_s), 3),
            "weight_sync_s_median": round(statistics.median(sync_s), 4),
            "generated_tokens_per_s": round(tokens / gen_s, 1),
            "versions": backend.adapters,
            "base_unchanged": base_before.completions[0].token_ids
            == base_after.completions[0].token_ids,
        }
    finally:
        await backend.close()


def main() -> None:
    args = _args()
    with tempfile.TemporaryDirectory(prefix="parley-gpu-lora-") as tmp:
        print(json.dumps(asyncio.run(_train(args, Path(tmp)))))


if __name__ == "__main__":
    main()
