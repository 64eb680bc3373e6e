"""Minimal GRPO in one file: a tiny LM learns the referential listener from reward alone.

Read top to bottom, cleanrl-style: config -> scenario and tiny model -> rollouts -> group
advantages -> the clipped loss -> update -> log. It uses parley's scenario API
(``parley.scenarios.make``), its inference pool (``InferencePool`` over a
``TransformersBackend`` that shares the model being trained, so every update is live at the
next rollout) and the tiny model builder, and none of ``parley.arena.training``: the whole
update is in this file. The settings are the TRL recipe's (examples/trl-online.md), which
are known to learn: 4 objects, the listener answers a name under the choice constraint,
parley's scripted speaker (``CodeSpeaker``) sends the object's code.

    python examples/minimal_grpo.py                      # 40 updates of 64 episodes
    python examples/minimal_grpo.py --updates 2 --seeds 2 --group 4

One log line per update: ``update N success S loss L ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time

import msgspec
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from parley.agents.llm import parse_action
from parley.agents.scripted.collaboration import CodeSpeaker
from parley.arena.inference.backends.constraints import TokenMatcher, TokenVocab
from parley.arena.inference.backends.tokenizer import HFChatTokenizer
from parley.arena.inference.backends.transformers import TransformersBackend
from parley.arena.inference.models.tiny import build_tiny_model
from parley.arena.inference.pool import InferencePool, PoolConfig
from parley.protocols.messages import Constraint, GenerateRequest, Observation, SamplingParams
from parley.scenarios import make


# --- 1. config -------------------------------------------------------------------------------
@dataclasses.dataclass
class Args:
    scenario: str = "collaboration/referential-v1"
    """The game; the learner plays ``learner``, parley's scripted speaker the other seat."""
    learner: str = "listener"
    n_values: int = 4
    """Objects to tell apart (K = 4 candidates each episode: chance is 0.25)."""
    updates: int = 40
    seeds: int = 8
    """Prompts (episode seeds) per update."""
    group: int = 8
    """Episodes per seed: the GRPO group whose mean is each episode's baseline."""
    lr: float = 2.5e-4
    """At 5e-4 (two optimizer steps a batch, see ``epochs``) seed 0 collapsed onto three of the
    four names (success 0.5-0.88, every group uniform: no signal); 2.5e-4 held >= 0.95 from
    update 9."""
    clip: float = 0.2
    """PPO clip range of the importance ratio pi_theta / pi_old."""
    epochs: int = 2
    """Passes over each batch (the second one makes the ratio and the clip matter)."""
    max_tokens: int = 6
    temperature: float = 1.0
    seed: int = 0
    model_dir: str = ""
    """A model in Hugging Face format; empty: build parley's tiny random Llama."""
    target: float = 0.0
    """Stop once the mean success of the last 5 updates reaches it (0: run every update)."""


def scenario_kwargs(args: Args) -> dict[str, object]:
    return {"n_candidates": 4, "n_attributes": 1, "n_values": args.n_values, "vocab_size": 8,
            "message_length": 1, "answer": "name", "show_others": False}  # fmt: skip


# --- 2. rollouts: episodes through parley, the learner's turns through the pool ---------------
@dataclasses.dataclass
class Turn:
    """One decision of the learner: its exact prompt and generated ids."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # log pi_old of each generated token (the pool's, under the mask)
    constraint: Constraint | None
    group: int = 0
    reward: float = 0.0


async def play(args: Args, pool: InferencePool, tok: HFChatTokenizer, seed: int) -> list[Turn]:
    """One episode; every learner turn gets the episode's return as its reward."""
    env = make(args.scenario, **scenario_kwargs(args))
    speaker = CodeSpeaker()
    speaker.reset(seed)
    observations, infos = env.reset(seed=seed)
    turns: list[Turn] = []
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    while env.agents:
        actions = {}
        for seat in [s for s in env.agents if infos[s]["to_act"]]:
            if seat != args.learner:
                seen = Observation(agent=seat, text=observations[seat], info=infos[seat])
                actions[seat] = speaker.decide(seen)
                continue
            raw = infos[seat].get("constraint")
            constraint = None if raw is None else msgspec.convert(raw, Constraint)
            prompt = tok.encode_chat([{"role": "user", "content": observations[seat]}])
            request = GenerateRequest(prompt_token_ids=prompt, params=params, constraint=constraint)
            out = (await pool.generate(request)).completions[0]
            turns.append(Turn(prompt, list(out.token_ids), list(out.logprobs), constraint))
            actions[seat] = parse_action(out.text, constraint)
        observations, _, _, _, infos = env.step(actions)
    ret = sum(env.totals(args.learner).values())
    for turn in turns:
        turn.reward = ret
    return turns


# --- 3. group advantages: A = (r - mean of its group) / (std of its group + eps) --------------
def advantages(turns: list[Turn]) -> torch.Tensor:
    rewards = torch.tensor([t.reward for t in turns])  # (N,)
    groups = torch.tensor([t.group for t in turns])  # (N,)
    out = torch.zeros_like(rewards)
    for g in groups.unique():
        member = groups == g
        r = rewards[member]
        out[member] = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
    return out  # (N,); a group that all won or all lost gives 0: no signal


# --- 4. the clipped loss over each turn's generated tokens ------------------------------------
def legal_masks(turns: list[Turn], vocab: TokenVocab, t_max: int) -> torch.Tensor:
    """(N, T, V): the tokens the backend's constraint allowed at each generated position,
    rebuilt with the backend's own matcher (the pool sampled from that restricted softmax)."""
    mask = torch.ones(len(turns), t_max, vocab.size, dtype=torch.bool)
    for i, turn in enumerate(turns):
        if turn.constraint is None:
            continue
        matcher = TokenMatcher(vocab, turn.constraint)
        for t, token in enumerate(turn.token_ids):
            mask[i, t] = torch.from_numpy(matcher.allowed())
            matcher.advance(token)
    return mask


def token_logprobs(
    model: torch.nn.Module, turns: list[Turn], vocab: TokenVocab, temperature: float
) -> torch.Tensor:
    """(N, T) log pi_theta of each generated token (0 on padding), right-padded batch: the
    distribution the pool sampled from (logits / temperature, the constraint's mask)."""
    t_max = max(len(t.token_ids) for t in turns)
    rows = [t.prompt_ids + t.token_ids for t in turns]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # (N, L)
    attention = torch.zeros(len(rows), width, dtype=torch.long)  # (N, L)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
    logits = model(input_ids=ids, attention_mask=attention).logits / temperature  # (N, L, V)
    # The logits at position p predict token p + 1: gather each turn's generated span.
    picked = torch.zeros(len(turns), t_max, logits.shape[-1])  # (N, T, V)
    for i, t in enumerate(turns):
        start = len(t.prompt_ids) - 1
        picked[i, : len(t.token_ids)] = logits[i, start : start + len(t.token_ids)]
    picked = picked.masked_fill(~legal_masks(turns, vocab, t_max), float("-inf"))
    logp = torch.log_softmax(picked, dim=-1)  # (N, T, V)
    targets = torch.zeros(len(turns), t_max, dtype=torch.long)  # (N, T)
    for i, t in enumerate(turns):
        targets[i, : len(t.token_ids)] = torch.tensor(t.token_ids)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, T)
    return chosen.masked_fill(padding(turns, t_max), 0.0)


def padding(turns: list[Turn], t_max: int) -> torch.Tensor:
    lengths = torch.tensor([len(t.token_ids) for t in turns])  # (N,)
    return torch.arange(t_max)[None, :] >= lengths[:, None]  # (N, T)


def clipped_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, pad: torch.Tensor,
                 clip: float) -> torch.Tensor:  # fmt: skip
    """GRPO's objective: PPO's clipped surrogate per token, averaged over each turn's
    tokens, then over turns (logp, old, pad: (N, T); adv: (N,))."""
    ratio = torch.exp(logp - old)  # (N, T)
    surrogate = torch.minimum(ratio * adv[:, None], ratio.clamp(1 - clip, 1 + clip) * adv[:, None])
    keep = (~pad).float()
    per_turn = (surrogate * keep).sum(-1) / keep.sum(-1).clamp(min=1)  # (N,)
    return -per_turn.mean()


# --- 5. the loop: rollouts -> advantages -> clipped loss -> update -> log ---------------------
async def train(args: Args) -> tuple[torch.nn.Module, list[dict[str, float]]]:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # a tiny model: intra-op threads only wait for each other
    model_dir = args.model_dir or str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-")))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hf = AutoTokenizer.from_pretrained(model_dir)
    tok = HFChatTokenizer(hf)
    width = model.get_output_embeddings().weight.shape[0]
    vocab = TokenVocab(hf, width, -1 if tok.eos_token_id is None else tok.eos_token_id)
    backend = TransformersBackend(model, tok, seed=args.seed, prefix_cache_bytes=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)
    history: list[dict[str, float]] = []
    async with InferencePool({"default": backend}, PoolConfig(max_batch_size=256)) as pool:
        for update in range(1, args.updates + 1):
            started = time.perf_counter()
            seeds = [int(s) for s in rng.integers(2**31 - 1, size=args.seeds)]
            episodes = [play(args, pool, tok, s) for s in seeds for _ in range(args.group)]
            played = await asyncio.gather(*episodes)
            turns = []
            for k, episode in enumerate(played):
                for turn in episode:
                    turn.group = k // args.group  # the seed's group
                    turns.append(turn)
            success = float(np.mean([max(0.0, t.reward) for t in turns]))
            adv = advantages(turns)  # (N,)
            t_max = max(len(t.token_ids) for t in turns)
            old = torch.zeros(len(turns), t_max)  # (N, T)
            for i, t in enumerate(turns):
                old[i, : len(t.logprobs)] = torch.tensor(t.logprobs)
            pad = padding(turns, t_max)
            model.train()
            for _ in range(args.epochs):
                logp = token_logprobs(model, turns, vocab, args.temperature)  # (N, T)
                loss = clipped_loss(logp, old, adv, pad, args.clip)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            model.eval()  # the pool's backend decodes with this very module next update
            row = {"update": update, "success": success, "loss": float(loss.item()),
                   "episodes": len(played), "seconds": time.perf_counter() - started}  # fmt: skip
            history.append(row)
            print(f"update {update:3d} success {success:.3f} loss {row['loss']:+.4f} "
                  f"episodes {len(played)} {row['seconds']:.1f}s", flush=True)  # fmt: skip
            recent = [r["success"] for r in history[-5:]]
            if args.target and len(recent) == 5 and np.mean(recent) >= args.target:
                break
    return model, history


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Args):
        default = field.default
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(default),
                            default=default)  # fmt: skip
    args = Args(**vars(parser.parse_args(argv)))
    return asyncio.run(train(args))[1]


if __name__ == "__main__":
    main()
