"""Policy-gradient training of LLM agents from their own generated tokens.

One update, in the order it happens (cf. ``cleanrl/ppo.py``)::

    samples  <- decisions of finished episodes: prompt ids, generated ids, the logprobs
                recorded at generation time (log pi_old), the policy version, the return
    A        <- advantages.compute_advantages(returns, keys)            # (N,)
    for epoch in 1..epochs:                                   # PPO-style reuse of the batch
        for minibatch in a shuffled split into `minibatches`:  # one optimizer step each
            for micro-batch (gradient accumulation; by count, or by padded tokens):
                logp  <- log pi_theta(token_t | prompt, tokens_<t) per generated token
                         (logits / temperature, illegal tokens masked out exactly as the
                         backend's constraint masked them)               # (n, T)
                loss  <- OBJECTIVES[objective](logp, logp_old, A, KL)   # its share
                loss.backward()
            clip grad norm; optimizer.step()
    version += 1                                              # one new version per batch

The objectives (GRPO, DAPO, Dr. GRPO, RLOO, REINFORCE) are the published ones, each a
small function of :mod:`parley.arena.training.objectives`.

Why these choices:

- The token ids and logprobs are the ones the backend produced (``Action.tokens``); the
  history is never re-tokenised, which is known to break convergence.
- The constraint mask matters: the backend sampled from the distribution restricted to
  legal tokens, so the trainer differentiates the same restricted distribution. Without
  the mask the gradient would also spend itself on pushing illegal tokens down.
- pi_old is the policy that generated the tokens (their recorded logprobs): for samples
  of an older policy (staleness S > 0) and for later epochs and minibatches the ratio
  differs from 1, and the clip (or, for the REINFORCE objectives, the truncated
  sequence importance weight) bounds the update.
- One model per policy name, or one LoRA adapter per policy name on a base that several
  share (:mod:`parley.arena.training.adapters`: the trainer sees :class:`PolicyWeights`
  either way; an adapter's optimizer holds only that adapter's parameters). Seats map to
  policies (``seat_policy``): one shared policy for self-play, or one per seat.
- Micro-batches: ``micro_batch`` samples at most, and with ``token_budget`` at most that
  many padded tokens (rows x longest row) per forward/backward; the objectives divide by
  the whole minibatch's counts, so the accumulated gradient is the one-batch gradient.
- Precision (:mod:`parley.arena.training.precision`): forward passes under autocast in
  bf16/fp16, master weights float32. ``logp_gap`` (metric) is the mean |log pi_theta -
  log pi_old| over the tokens of on-policy samples, scored before the update's first
  optimizer step: ~0 when trainer and pool compute alike; larger when their dtypes or
  code paths differ (then every ratio starts off 1 by that much).

:class:`PolicyGradientTrainer` does the maths; the sampler and the weight sync live in
:mod:`parley.arena.training.sampler` and :mod:`parley.arena.training.sync`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from parley.arena.training.adapters import PolicyWeights, as_weights
from parley.arena.training.advantages import BaselineState, compute_advantages
from parley.arena.training.objectives import OBJECTIVES, LossInputs, clipped_tokens
from parley.arena.training.pg_config import PGConfig, Sample
from parley.arena.training.precision import autocast, check_precision, grad_scaler
from parley.arena.training.scoring import LegalMasks
from parley.protocols.errors import ConfigError, require

__all__ = ["PGConfig", "PolicyGradientTrainer", "Sample"]

# Running sums of one update's statistics (see PolicyGradientTrainer.step).
_SUMS = (
    "loss",
    "nonfinite_steps",
    "steps",
    "tokens",
    "sequences",
    "ratio_sum",
    "clipped",
    "is_weight_sum",
    "kl_sum",
    "entropy_sum",
    "micro_batches",
    "over_budget",
    "gap_sum",
    "gap_tokens",
)


class PolicyGradientTrainer:
    """Trains one or several policies (causal LMs or LoRA adapters) from :class:`Sample` lists.

    ``models`` maps a policy name to a ``transformers`` causal LM (trained in place) or to
    its :class:`~parley.arena.training.adapters.PolicyWeights` (an adapter on a shared
    base: :func:`~parley.arena.training.adapters.attach_adapters`); ``tokenizer`` is a
    Hugging Face tokenizer (pad id, constraint masks); ``trainable`` names the policies
    that learn (the others are scored but frozen — a staged recipe freezes one side while
    the other learns). ``precision`` (``fp32``, ``bf16``, ``fp16``) is the autocast of the
    forward passes (:class:`ConfigError` where the models' device cannot do it).
    """

    def __init__(
        self,
        models: Mapping[str, Any],
        tokenizer: Any,
        config: PGConfig | None = None,
        *,
        trainable: Sequence[str] | None = None,
        precision: str = "fp32",
    ) -> None:
        self.torch: Any = require("torch", "train")
        self.config = config or PGConfig()
        self.weights: dict[str, PolicyWeights] = {n: as_weights(m) for n, m in models.items()}
        self.models = {n: w.module for n, w in self.weights.items()}
        self.tokenizer = tokenizer
        self.trainable = set(self.models if trainable is None else trainable)
        self.version = 0
        self.baselines = BaselineState(decay=self.config.baseline_decay)
        self.precision = precision
        devices = {str(_device(m)) for m in self.models.values()}
        for device in devices:
            check_precision(precision, device)
        self._optims: dict[str, Any] = {}
        self._scalers: dict[str, Any] = {}
        self._replay: deque[Sample] = deque(maxlen=max(self.config.replay, 1))
        self._rng = np.random.default_rng(self.config.seed or 0)
        self._settings = self.config.loss_settings()
        self._objective = OBJECTIVES[self.config.objective]
        if self.config.objective == "dr_grpo" and self.config.length_norm < 1:
            raise ConfigError(
                "pg.length_norm: Dr. GRPO divides by a constant length; set it to the "
                "generation budget (parley train uses agent.max_tokens)"
            )
        self._masks = LegalMasks(tokenizer)
        for name in self.trainable:
            self._ensure_optimizer(name)

    # ------------------------------------------------------------------ set-up

    def set_trainable(self, names: Sequence[str]) -> None:
        """Choose which policies learn from the next update on (stages of a recipe)."""
        unknown = set(names) - set(self.models)
        if unknown:
            raise ConfigError(f"unknown policies {sorted(unknown)}; known: {sorted(self.models)}")
        self.trainable = set(names)
        for name in self.trainable:
            self._ensure_optimizer(name)

    def restore(self, snapshots: Mapping[str, list[Any]]) -> None:
        """Put each policy's weights back as in ``snapshots`` (``PolicyWeights.snapshot``),
        forgetting what the updates since learned: optimizer state, role baselines, replay."""
        for name, saved in snapshots.items():
            self.weights[name].restore(saved)
            self._optims.pop(name, None)
            self._scalers.pop(name, None)
        self.baselines = BaselineState(decay=self.config.baseline_decay)
        self._replay.clear()
        for name in self.trainable:
            self._ensure_optimizer(name)

    def _ensure_optimizer(self, name: str) -> None:
        cfg, weights = self.config, self.weights[name]
        if name not in self._optims:
            params = weights.parameters()
            self._optims[name] = self.torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas)
            self._scalers[name] = grad_scaler(self.precision, _device(weights.module).type)
        if cfg.kl_coef > 0:
            weights.prepare_reference()  # the policy as it is when it first learns

    # ------------------------------------------------------------------ one update

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One update of every trainable policy over ``samples``; returns metrics.

        ``epochs`` x ``minibatches`` optimizer steps per policy, one new version. Samples
        of frozen policies only update the baselines. Metrics: ``loss`` (mean over the
        optimizer steps), ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``clip_frac``
        (share of tokens whose clip was active), ``is_weight_mean``, ``kl``,
        ``optimizer_steps``, ``nonfinite_steps`` (optimizer steps skipped: the gradient was
        NaN or infinite), ``micro_batches``, ``over_budget`` (micro-batches of one sample
        longer than ``token_budget``), ``logp_gap`` (see the module docstring; absent when
        no sample was on-policy) and, per role, ``reward/<role>`` and ``advantage_abs/<role>``.
        """
        cfg = self.config
        samples = list(samples)
        if not samples:
            raise ValueError("step() needs at least one sample")
        for s in samples:
            if not math.isfinite(s.reward):
                raise ValueError(
                    f"a sample of {s.policy!r} ({s.key}) has reward {s.reward}: one NaN or "
                    "infinite reward makes every advantage NaN, and every weight after one "
                    "step (the runner fails such episodes: scenario_error)"
                )
        # 1. advantages, over the fresh samples only (replayed ones keep theirs)
        advantages = compute_advantages(
            [s.reward for s in samples],
            [s.key for s in samples],
            estimator=cfg.advantage_estimator,
            grouping=cfg.grouping,
            state=self.baselines,
        )
        for s, a in zip(samples, advantages, strict=True):
            s.advantage = float(a)
        replayed = self._from_replay(len(samples))
        batch = samples + replayed
        if cfg.replay:
            self._replay.extend(samples)
        # 2. per trainable policy: epochs x minibatches optimizer steps
        totals: dict[str, float] = dict.fromkeys(_SUMS, 0.0)
        totals["ratio_min"], totals["ratio_max"] = float("inf"), float("-inf")
        learners = [s for s in batch if s.policy in self.trainable and s.token_ids]
        for s in learners:
            # pi_old is the recorded logprobs: without them every ratio would be wrong.
            if len(s.logprobs) != len(s.token_ids):
                raise ValueError(
                    f"a sample of {s.policy!r} has {len(s.token_ids)} tokens but "
                    f"{len(s.logprobs)} logprobs: generate with SamplingParams(logprobs=True) "
                    "from a backend that returns the sampled token ids (an OpenAI-compatible "
                    "server that ignores return_token_ids gives no usable logprobs)"
                )
        for name in sorted({s.policy for s in learners}):
            own = [s for s in learners if s.policy == name]
            for epoch in range(cfg.epochs):
                for k, minibatch in enumerate(self._minibatches(own)):
                    # Before its first optimizer step the policy is the one that sampled.
                    self._optimizer_step(name, minibatch, totals, gap=epoch == 0 and k == 0)
        self.version += 1
        # 3. metrics
        steps, tokens = max(totals["steps"], 1.0), max(totals["tokens"], 1.0)
        metrics = {
            "loss": totals["loss"] / steps,
            "optimizer_steps": totals["steps"],
            "nonfinite_steps": totals["nonfinite_steps"],
            "ratio_mean": totals["ratio_sum"] / tokens,
            "ratio_min": totals["ratio_min"] if totals["tokens"] else 1.0,
            "ratio_max": totals["ratio_max"] if totals["tokens"] else 1.0,
            "clip_frac": totals["clipped"] / tokens,
            "is_weight_mean": totals["is_weight_sum"] / max(totals["sequences"], 1.0),
            "kl": totals["kl_sum"] / max(totals["sequences"], 1.0),
            "entropy": totals["entropy_sum"] / tokens,
            "reward_mean": float(np.mean([s.reward for s in samples])),
            "micro_batches": totals["micro_batches"],
            "over_budget": totals["over_budget"],
        }
        if cfg.replay:
            metrics["replayed"] = float(len(replayed))
            metrics["replay_age_max"] = float(
                max((self.version - 1 - s.policy_version for s in replayed), default=0)
            )
        if totals["gap_tokens"]:
            metrics["logp_gap"] = totals["gap_sum"] / totals["gap_tokens"]
        for role in sorted({s.key.role for s in samples}):
            mine = [s for s in samples if s.key.role == role]
            metrics[f"reward/{role}"] = float(np.mean([s.reward for s in mine]))
            metrics[f"advantage_abs/{role}"] = float(np.mean([abs(s.advantage) for s in mine]))
        return metrics

    def _minibatches(self, own: list[Sample]) -> list[list[Sample]]:
        """``own`` shuffled (when split or reused) and split into ``minibatches`` parts."""
        cfg = self.config
        order = np.arange(len(own))
        if cfg.minibatches > 1 or cfg.epochs > 1:
            order = self._rng.permutation(len(own))
        parts = np.array_split(order, min(cfg.minibatches, len(own)))
        return [[own[i] for i in part] for part in parts]

    def _optimizer_step(
        self, name: str, minibatch: list[Sample], totals: dict[str, float], *, gap: bool = False
    ) -> None:
        """Accumulate the objective's gradient over micro-batches, clip, step."""
        optim, scaler = self._optims[name], self._scalers[name]
        self.accumulate_gradients(name, minibatch, totals, gap=gap)
        if scaler is not None:
            scaler.unscale_(optim)  # clip the true gradient, not the scaled one
        params = self.weights[name].parameters()
        norm = self.torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        if scaler is not None:
            scaler.step(optim)  # skipped when the scaled gradient overflowed
            scaler.update()
        elif not math.isfinite(float(norm)):
            # A NaN or inf gradient (non-finite recorded logprobs, an overflow) would make
            # every weight NaN: the step is skipped and counted, the weights stay as they were.
            optim.zero_grad(set_to_none=True)
            totals["nonfinite_steps"] += 1
        else:
            optim.step()
        totals["steps"] += 1

    def accumulate_gradients(
        self,
        name: str,
        minibatch: Sequence[Sample],
        totals: dict[str, float] | None = None,
        *,
        gap: bool = False,
    ) -> None:
        """Zero ``name``'s gradients, then accumulate the objective's gradient over
        ``minibatch`` one micro-batch (:meth:`micro_batches`) at a time: the parameters'
        ``.grad`` is then the minibatch's gradient (times the loss scale under fp16).
        Samples need their ``advantage`` set. ``totals`` receives the statistics."""
        if totals is None:
            totals = dict.fromkeys(_SUMS, 0.0)
            totals["ratio_min"], totals["ratio_max"] = float("inf"), float("-inf")
        cfg, weights, scaler = self.config, self.weights[name], self._scalers.get(name)
        self._optims[name].zero_grad(set_to_none=True)
        size = (len(minibatch), sum(len(s.token_ids) for s in minibatch))  # sequences, tokens
        for part in self.micro_batches(minibatch):
            with weights.selected():
                loss = self._loss(name, part, size, totals, gap=gap)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            totals["loss"] += float(loss.detach())
            totals["micro_batches"] += 1
            if cfg.token_budget and len(part) * max(map(_row_length, part)) > cfg.token_budget:
                totals["over_budget"] += 1

    def micro_batches(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        """``samples`` in the parts of one forward/backward each: at most ``micro_batch``
        samples and, with a ``token_budget``, at most that many padded tokens (rows x the
        longest row); then the samples are packed shortest first, so little is padding."""
        cfg = self.config
        if not cfg.token_budget:
            step = cfg.micro_batch
            return [list(samples[i : i + step]) for i in range(0, len(samples), step)]
        parts: list[list[Sample]] = []
        part: list[Sample] = []
        for s in sorted(samples, key=_row_length):  # stable: a deterministic packing
            # Shortest first: the sample being added is its part's longest row.
            full = len(part) >= cfg.micro_batch
            if part and (full or (len(part) + 1) * _row_length(s) > cfg.token_budget):
                parts.append(part)
                part = []
            part.append(s)
        if part:
            parts.append(part)
        return parts

    def _from_replay(self, fresh: int) -> list[Sample]:
        cfg = self.config
        if not cfg.replay or not cfg.replay_fraction or not self._replay:
            return []
        if cfg.replay_max_age is not None:  # too old to train on: out of the buffer
            young = [
                s for s in self._replay if self.version - s.policy_version <= cfg.replay_max_age
            ]
            if len(young) < len(self._replay):
                self._replay = deque(young, maxlen=self._replay.maxlen)
        want = round(fresh * cfg.replay_fraction / (1 - cfg.replay_fraction))
        pool = list(self._replay)
        picks = self._rng.choice(len(pool), size=min(want, len(pool)), replace=False)
        return [pool[int(i)] for i in picks]

    def _loss(
        self,
        name: str,
        part: Sequence[Sample],
        size: tuple[int, int],
        totals: dict[str, float],
        *,
        gap: bool = False,
    ) -> Any:
        """The objective's share of the minibatch loss from micro-batch ``part``; adds the
        ratio statistics to ``totals`` (and with ``gap`` the on-policy logprob gap).
        ``size``: (sequences, tokens) of the minibatch."""
        torch, cfg = self.torch, self.config
        entropy: list[Any] = []  # filled with the (n, T) per-token entropies, if asked
        wanted = entropy if cfg.entropy_coef > 0 else None
        logp, valid = self.token_logprobs(self.models[name], part, wanted)  # (n, T), (n, T)
        old = torch.zeros_like(valid)  # (n, T) log pi_old, right-aligned like logp
        for i, s in enumerate(part):
            if s.logprobs:
                old[i, old.shape[1] - len(s.logprobs) :] = torch.tensor(s.logprobs)
        kl = torch.zeros_like(valid)  # (n, T)
        if cfg.kl_coef > 0:
            with torch.no_grad(), self.weights[name].reference() as ref:
                ref_logp, _ = self.token_logprobs(ref, part)  # (n, T)
            # k3 estimator of KL(pi || ref) per token: exp(d) - d - 1 with d = ref - logp.
            d = (ref_logp - logp) * valid
            kl = cfg.kl_coef * (torch.exp(d) - d - 1) * valid
        adv = torch.tensor([s.advantage for s in part], dtype=logp.dtype, device=logp.device)
        x = LossInputs(logp, old, valid, adv, kl, sequences=size[0], tokens=max(size[1], 1))
        loss = self._objective.loss(x, self._settings)
        ent = (entropy[0] * valid).sum() if entropy else torch.zeros(())  # summed over tokens
        if entropy:
            # The bonus as a token mean over the minibatch (micro-batch shares add up to it).
            loss = loss - cfg.entropy_coef * ent / max(size[1], 1)
        # Statistics: token ratios, active clips, sequence weights, KL.
        with torch.no_grad():
            ratio = (logp - old).exp()[valid > 0]  # (tokens,)
            seq = ((logp - old) * valid).sum(1)  # (n,)
            totals["tokens"] += float(valid.sum())
            totals["sequences"] += len(part)
            totals["ratio_sum"] += float(ratio.sum())
            if ratio.numel():
                totals["ratio_min"] = min(totals["ratio_min"], float(ratio.min()))
                totals["ratio_max"] = max(totals["ratio_max"], float(ratio.max()))
            if self._objective.clipped:
                totals["clipped"] += clipped_tokens(x, self._settings)
            totals["is_weight_sum"] += float(seq.exp().clamp(max=cfg.is_cap).sum())
            totals["kl_sum"] += float(kl.sum() / cfg.kl_coef) if cfg.kl_coef > 0 else 0.0
            totals["entropy_sum"] += float(ent)
            if gap:  # samples of the weights being trained, scored before any step
                fresh = [float(s.policy_version == self.version) for s in part]
                on = valid * torch.tensor(fresh, dtype=valid.dtype, device=valid.device)[:, None]
                totals["gap_sum"] += float(((logp - old).abs() * on).sum())
                totals["gap_tokens"] += float(on.sum())
        return loss

    # ------------------------------------------------------------------ scoring

    def token_logprobs(
        self, model: Any, part: Sequence[Sample], entropy: list[Any] | None = None
    ) -> tuple[Any, Any]:
        """Log-probabilities (n, T) of each sample's generated tokens under ``model``,
        right-aligned to T = the longest completion, and the 0/1 mask of real tokens.
        ``entropy``, when given, receives the (n, T) entropy of the (masked) distribution at
        each generated position (0 on padding).

        Prompt + completion rows are left-padded into one batch (B = n, L = longest row);
        position ids count real tokens only, so padding changes nothing. The forward pass
        runs under the trainer's ``precision``; the softmax in float32, on ``model``'s device.
        """
        torch, cfg = self.torch, self.config
        device = _device(model)
        pad = int(self.tokenizer.pad_token_id or 0)
        rows = [s.prompt_ids + s.token_ids for s in part]
        n, length = len(rows), max(len(r) for r in rows)
        t_max = max(len(s.token_ids) for s in part)
        ids = torch.full((n, length), pad, dtype=torch.long)  # (B, L)
        attn = torch.zeros((n, length), dtype=torch.long)  # (B, L)
        for i, row in enumerate(rows):
            ids[i, length - len(row) :] = torch.tensor(row, dtype=torch.long)
            attn[i, length - len(row) :] = 1
        positions = (attn.cumsum(1) - 1).clamp(min=0)  # (B, L)
        ids, attn, positions = ids.to(device), attn.to(device), positions.to(device)
        with autocast(self.precision, device.type):
            out = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False)
            logits = out.logits
        # The logits at position j predict token j + 1: keep the T positions before the end.
        logits = logits[:, length - t_max - 1 : length - 1, :].float() / cfg.temperature
        mask = self._masks(part, t_max, logits.shape[-1])  # (B, T, V) bool or None
        if mask is not None:
            logits = logits.masked_fill(~torch.from_numpy(mask).to(device), float("-inf"))
        logp_all = torch.log_softmax(logits, dim=-1)  # (B, T, V)
        target = torch.full((n, t_max), pad, dtype=torch.long, device=device)  # (B, T)
        valid = torch.zeros((n, t_max), dtype=logp_all.dtype, device=device)  # (B, T)
        for i, s in enumerate(part):
            k = len(s.token_ids)
            if k:
                target[i, t_max - k :] = torch.tensor(s.token_ids, dtype=torch.long)
                valid[i, t_max - k :] = 1.0
        logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
        # Padding positions may be -inf (a masked pad id); zero them before any sum.
        logp = torch.where(valid > 0, logp, torch.zeros_like(logp))
        if entropy is not None:
            # Masked tokens (-inf) count 0; replaced *before* the product, since 0 * -inf
            # would put NaN into the gradient even behind a torch.where.
            legal = torch.isfinite(logp_all)  # (B, T, V)
            safe = torch.where(legal, logp_all, torch.zeros_like(logp_all))  # (B, T, V)
            p_log_p = torch.where(legal, safe.exp() * safe, torch.zeros_like(safe))
            entropy.append(-p_log_p.sum(-1) * valid)  # (B, T)
        return logp, valid

    # ------------------------------------------------------------------ weights

    def state_tensors(self, name: str) -> dict[str, np.ndarray]:
        """What a ``WeightUpdate`` of the policy carries, as numpy arrays: every parameter
        of a whole model (tied weights once, under the name ``named_parameters`` gives
        them), or only the tensors of its adapter (named as ``peft`` names them)."""
        return self.weights[name].state_tensors()


def _row_length(sample: Sample) -> int:
    """Tokens in the sample's scored row (prompt + completion)."""
    return len(sample.prompt_ids) + len(sample.token_ids)


def _device(model: Any) -> Any:
    """The device of the model's (first) parameters."""
    return next(model.parameters()).device
