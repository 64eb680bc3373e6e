"""Reward models: a scalar head on a causal LM, trained from pairwise preferences.

A reward model scores a sequence (``prompt + response``, the text TRL's RewardTrainer
scores for a non-conversational preference row) with one number. parley builds it as
``AutoModelForSequenceClassification`` with ``num_labels=1`` on any causal LM checkpoint
(the head is new; the body starts from the checkpoint), trains it with the Bradley-Terry
loss on preference pairs (Ouyang et al. 2022, eq. 1)::

    loss = -log sigmoid(r(prompt + chosen) - r(prompt + rejected))

and saves it with ``save_pretrained`` beside its tokenizer: the directory TRL's
RewardTrainer writes, so ``AutoModelForSequenceClassification.from_pretrained(DIR)`` (and
TRL, and parley's pool: :class:`~parley.arena.inference.backends.scorer.SequenceScorer`)
load it as it is.

Preference data (``preferences.jsonl``) is TRL's explicit-prompt preference format, one
JSON object a line: ``{"prompt": str, "chosen": str, "rejected": str}``, plus any parley
fields (who rated, when, what was shown, ``"tie": true``...), which training ignores except
``tie``: a tie says neither is preferred, so it gives Bradley-Terry nothing to fit and is
skipped (counted in :class:`RewardModelReport`). :func:`export_preferences` writes the rows
as TRL's DPO or RewardTrainer datasets (the same three columns, parley fields dropped).

Length: a reward model learns whatever separates chosen from rejected, length included
(Singhal et al. 2023). Two guards:

- Training and the ``rm`` component score texts in their
  :func:`~parley.arena.run.model_rewards.scored_text` form (the LLM judge's canonical form,
  each word once per line, at most ``MAX_SCORED_WORDS`` words a line): padding a line with
  whitespace, back-to-back repeats or its own words, in any order and amount, gives the
  very same text, hence the very same score (proven by construction).
- Against filler of other words (from the text's other lines), training adds a hinge term
  that penalises any score a text gains from a run of them appended
  (:attr:`RewardModelConfig.padding_penalty`), and reports the data's length bias (the
  share of pairs whose chosen is longer minus the share whose chosen is shorter, in
  tokens). This one is learned, so measured, not proven.

As a reward: :class:`RewardModelReward` is the ``rm`` component, each seat's episode text
scored at the episode's end (in-process, or by a reward model the pool serves).

May import ``parley.protocols`` and ``parley.arena.inference``; torch and transformers
are imported lazily (the ``torch`` extra).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from parley.arena.inference.backends.scorer import load_reward_model, score_texts
from parley.arena.run.model_rewards import (
    ScoredReward,
    reward_model_name,
    scored_text,
    shown_items,
    shown_text,
)
from parley.protocols.errors import ConfigError, require

__all__ = [
    "Preference",
    "RewardModelConfig",
    "RewardModelReport",
    "read_preferences",
    "train_reward_model",
    "export_preferences",
    "RewardModelReward",
]

REPORT_FILE = "reward_model.json"
"""The training report saved in the output directory beside the checkpoint."""


@dataclass(frozen=True)
class Preference:
    """One preference pair: ``chosen`` is preferred to ``rejected`` as a reply to ``prompt``
    (or neither, when ``tie``)."""

    prompt: str
    chosen: str
    rejected: str
    tie: bool = False


def read_preferences(path: str | Path) -> list[Preference]:
    """The rows of a ``preferences.jsonl`` file, in order.

    Each row is a JSON object with string fields ``prompt``, ``chosen`` and ``rejected``
    (``prompt`` may be empty) and an optional boolean ``tie``; other fields are kept in the
    file and ignored here. Raises :class:`ConfigError` naming the line of a malformed row."""
    rows: list[Preference] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            rows.append(_preference(line, f"{path}:{number}"))
    return rows


def _preference(line: str, where: str) -> Preference:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON ({exc.msg}); one JSON object a line") from None
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a row is a JSON object {{prompt, chosen, rejected}}")
    for key in ("chosen", "rejected"):
        if not isinstance(row.get(key), str):
            raise ConfigError(f"{where}: {key!r} must be a string (TRL's preference format)")
    prompt, tie = row.get("prompt", ""), row.get("tie", False)
    if not isinstance(prompt, str) or not isinstance(tie, bool):
        raise ConfigError(f"{where}: 'prompt' must be a string and 'tie' a boolean")
    return Preference(prompt, row["chosen"], row["rejected"], tie)


# -------------------------------------------------------------------------- training


@dataclass(frozen=True)
class RewardModelConfig:
    """How :func:`train_reward_model` trains. Validated at construction."""

    epochs: int = 3
    """Passes over the (non-tie) pairs."""
    batch_size: int = 8
    """Pairs per optimiser step."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_length: int = 512
    """Most tokens of one ``prompt + response``; longer ones keep their first tokens."""
    padding_penalty: float = 1.0
    """Weight of the length guard: ``mean(relu(r(x + filler) - r(x) + 0.1))`` over every
    chosen and rejected ``x`` of a batch, ``filler`` a run of 1-64 words of ``x``'s other
    lines appended to its last (its own words ``scored_text`` folds away already). It
    teaches the model that padding a reply does not make it better, whatever length
    correlations the preferences hold; 0 leaves it out."""
    center_rewards: float = 0.0
    """Weight of TRL's ``center_rewards_coefficient`` term ``(r_c + r_r)^2``, which keeps
    scores near 0 (Eisenstein et al. 2023); 0 leaves it out."""
    seed: int = 0
    """Seeds the new head and the order of the pairs (the process's RNGs are left alone)."""
    device: str = "cpu"
    """Where to train: cpu, cuda, cuda:N or auto."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"reward model {name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"reward model lr must be a positive number, got {self.lr}")
        if min(self.weight_decay, self.center_rewards, self.padding_penalty) < 0:
            raise ConfigError(
                "reward model weight_decay, center_rewards and padding_penalty must be >= 0"
            )


@dataclass
class RewardModelReport:
    """What a training run did; saved as ``reward_model.json`` in the output directory."""

    pairs: int
    """Pairs trained on (ties excluded)."""
    ties: int
    """Tie rows skipped."""
    steps: int
    """Optimiser steps taken."""
    first_loss: float
    """Mean Bradley-Terry loss of the first epoch."""
    last_loss: float
    """Mean Bradley-Terry loss of the last epoch."""
    train_accuracy: float
    """Share of training pairs the final model scores chosen above rejected."""
    length_bias: float
    """Share of pairs with chosen longer (in tokens) minus share with chosen shorter, in
    [-1, 1]: far from 0, the model can learn length as a proxy for preference."""
    base: str = ""
    """The checkpoint the body started from."""
    config: dict[str, Any] = field(default_factory=dict)


def train_reward_model(
    preferences: Iterable[Preference],
    base: str | Path,
    out: str | Path,
    config: RewardModelConfig | None = None,
) -> RewardModelReport:
    """Train a reward model on ``preferences`` from the checkpoint ``base`` and save it in
    ``out`` (``save_pretrained`` of the model and the tokenizer, plus the report).

    Raises :class:`ConfigError` when no pair is left after ties. Blocking (CPU/GPU bound)."""
    torch: Any = require("torch", "torch")
    from parley.arena.training.models import resolve_device

    config = config or RewardModelConfig()
    rows = list(preferences)
    pairs = [p for p in rows if not p.tie]
    if not pairs:
        raise ConfigError(
            f"no preference pairs to train on ({len(rows)} rows, all ties or none); "
            "rate some pairs A or B first (parley view, rate mode)"
        )
    device = resolve_device(config.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # the new head's initial weights
        model, tokenizer = load_reward_model(base, device=device)
    optimiser = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    order = random.Random(config.seed)
    epoch_losses: list[float] = []
    steps = 0
    model.train()
    for _ in range(config.epochs):
        order.shuffle(pairs)
        total = 0.0
        for batch in _batches(pairs, config.batch_size):
            loss = _bradley_terry(model, tokenizer, batch, config, order)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            steps += 1
            total += float(loss.detach()) * len(batch)
        epoch_losses.append(total / len(pairs))
    model.eval()
    report = RewardModelReport(
        pairs=len(pairs),
        ties=len(rows) - len(pairs),
        steps=steps,
        first_loss=epoch_losses[0],
        last_loss=epoch_losses[-1],
        train_accuracy=pair_accuracy(model, tokenizer, pairs, max_length=config.max_length),
        length_bias=_length_bias(tokenizer, pairs),
        base=str(base),
        config=asdict(config),
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    return report


def _batches(pairs: Sequence[Preference], size: int) -> Iterator[Sequence[Preference]]:
    for start in range(0, len(pairs), size):
        yield pairs[start : start + size]


def _bradley_terry(
    model: Any,
    tokenizer: Any,
    batch: Sequence[Preference],
    config: RewardModelConfig,
    rng: random.Random,
) -> Any:
    """Mean Bradley-Terry loss of ``batch`` plus its regularisers, in one forward pass."""
    torch: Any = require("torch", "torch")
    b = len(batch)
    texts = [scored_text(p.prompt + p.chosen) for p in batch]
    texts += [scored_text(p.prompt + p.rejected) for p in batch]
    if config.padding_penalty:
        texts += [scored_text(_padded(text, rng)) for text in texts]
    scores = score_texts(model, tokenizer, texts, max_length=config.max_length)  # (2B|4B,)
    chosen, rejected = scores[:b], scores[b : 2 * b]  # (B,), (B,)
    loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
    if config.padding_penalty:
        gain = scores[2 * b :] - scores[: 2 * b]  # (2B,) what padding each text earned
        # The margin keeps padded texts clearly below, not level with their unpadded ones.
        loss = loss + config.padding_penalty * torch.relu(gain + _PADDING_MARGIN).mean()
    if config.center_rewards:
        loss = loss + config.center_rewards * ((chosen + rejected) ** 2).mean()
    return loss


_PADDING_MARGIN = 0.1


def _padded(text: str, rng: random.Random) -> str:
    """``text`` with 1-64 of its own words appended to its last line, drawn at random or
    one repeated (filler that says nothing new): words of its other lines, which
    :func:`scored_text` cannot fold away (the last line's own words it folds: no gain to
    learn there)."""
    *before, last = text.splitlines() or [""]
    words = sorted({w for line in before for w in line.split()} - set(last.split()))
    words = words or text.split() or ["."]
    count = rng.randint(1, 64)
    filler = rng.choices(words, k=count) if rng.random() < 0.5 else [rng.choice(words)] * count
    return text + " " + " ".join(filler)


def pair_accuracy(
    model: Any, tokenizer: Any, pairs: Sequence[Preference], *, max_length: int = 512
) -> float:
    """Share of ``pairs`` whose chosen the model scores strictly above the rejected."""
    torch: Any = require("torch", "torch")
    wins = 0
    with torch.no_grad():
        for batch in _batches(pairs, 16):
            chosen = score_texts(
                model,
                tokenizer,
                [scored_text(p.prompt + p.chosen) for p in batch],
                max_length=max_length,
            )
            rejected = score_texts(
                model,
                tokenizer,
                [scored_text(p.prompt + p.rejected) for p in batch],
                max_length=max_length,
            )
            wins += int((chosen > rejected).sum())
    return wins / len(pairs) if pairs else 0.0


def _length_bias(tokenizer: Any, pairs: Sequence[Preference]) -> float:
    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    signs = [
        (length(p.chosen) > length(p.rejected)) - (length(p.chosen) < length(p.rejected))
        for p in pairs
    ]
    return sum(signs) / len(signs)


# ---------------------------------------------------------------------------- export

EXPORT_FORMATS: tuple[str, ...] = ("dpo", "rm")
"""``dpo``: TRL DPOTrainer's explicit-prompt preference rows; ``rm``: TRL RewardTrainer's.
Both are ``{prompt, chosen, rejected}`` rows (TRL 1.x); ``dpo`` needs a prompt to condition
on, so it leaves out rows without one, where ``rm`` keeps them (it scores ``prompt +
response``)."""


def export_preferences(rows: Iterable[Preference], out: str | Path, format: str) -> int:
    """Write ``rows`` to ``out`` as a TRL dataset in JSON lines (``datasets.load_dataset(
    "json", data_files=out)`` reads it); ties are left out. Returns the rows written."""
    if format not in EXPORT_FORMATS:
        raise ConfigError(
            f"unknown preference export format {format!r}; choose one of {EXPORT_FORMATS}"
        )
    written = 0
    with open(out, "w", encoding="utf-8") as f:
        for p in rows:
            if p.tie or (format == "dpo" and not p.prompt):
                continue
            row = {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += 1
    return written


# ------------------------------------------------------------------ reward component

COMPONENT = ScoredReward.name
"""The reward component's name in ``infos[seat]["components"]`` and the trajectories."""


def seat_text(transcript: Mapping[str, Any], seat: str) -> str:
    """What a reward model scores of ``seat`` in an episode (before :func:`scored_text`):
    each observation it got and each move it made, one ``who: text`` line each — the text
    ``parley view --rate --seat SEAT`` shows a rater, so a model trained on those ratings
    scores what it was trained on."""
    return shown_text(shown_items(transcript, seat))


class RewardModelReward(ScoredReward):
    """The ``rm`` reward component
    (:class:`~parley.arena.run.model_rewards.ScoredReward`: each seat's :func:`seat_text` as
    ``scored_text`` scored, times ``weight``, credited at the last step; a scorer that fails
    leaves the component out with why), made from a directory or a pool."""

    @classmethod
    def from_dir(cls, path: str | Path, *, device: str = "cpu", weight: float = 1.0) -> Any:
        """The reward model saved in ``path``, in this process; the seats of every episode
        running at once are scored in shared batches (blocking load)."""
        from parley.arena.inference.backends.scorer import ScoreBatcher, SequenceScorer

        batcher = ScoreBatcher(SequenceScorer.load(path, device=device))
        return cls(batcher.score, model=reward_model_name(str(path)), weight=weight)

    @classmethod
    def from_pool(cls, pool: Any, model: str, *, weight: float = 1.0) -> Any:
        """The reward model ``model`` served by ``pool`` (an
        :class:`~parley.arena.inference.pool.InferencePool`, batched with its other score
        requests)."""
        from parley.arena.inference.backends.scorer import score_client

        return cls(score_client(model, {"pool": pool}), model=model, weight=weight)
