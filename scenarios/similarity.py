"""Semantic similarity to a reference text as a reward component (``similarity``).

Two scorers, both ``(response, reference) -> float``:

- :func:`chrf` — sentence chrF (Popović 2015: character n-gram F-score, n <= 6, beta 2) from
  ``sacrebleu`` (``pip install 'parley[train]'``), scaled to 0..1. The default: it needs no
  model, and misspelled or partly right answers get partial credit where exact match gives 0.
- :class:`EmbeddingSimilarity` — cosine of mean-pooled last hidden states (masked mean over
  tokens) of any local model directory ``transformers.AutoModel`` loads (an embedding model,
  or a causal LM's base); -1..1.

:func:`similarity_scorer` picks one (``None``/``"chrf"``: chrF; anything else: a model
directory). :class:`SimilarityReward` wraps any parallel env and credits the score as the
component ``similarity`` (in ``infos[agent]["components"]`` and the step's reward) on each step
where an agent's response and a reference are both known:

- the reference is ``infos[agent]["reference"]`` when a scenario puts one there, else, with
  ``key``, ``env.oracle(agent)[key]`` (the privileged answer; the agent never sees it);
- the response is the whole action, or, with ``key``, the ``key`` field of a JSON action
  (``{"answer": "Tessamar"}``, as the tool-use scenarios' final answers are).

For example, partial credit on ``tool_use/research-team-v0``'s answers::

    env = SimilarityReward(make("tool_use/research-team-v0"), chrf, key="answer")

This module imports neither sacrebleu nor torch until a scorer is used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from pettingzoo.utils.wrappers import BaseParallelWrapper

from parley.protocols.errors import ConfigError, require

__all__ = [
    "COMPONENT",
    "REFERENCE_KEY",
    "EmbeddingSimilarity",
    "Scorer",
    "SimilarityReward",
    "chrf",
    "similarity_scorer",
]

COMPONENT = "similarity"
"""The reward component's name."""
REFERENCE_KEY = "reference"
"""``infos[agent][REFERENCE_KEY]``: a scenario's reference text for the agent's response."""

Scorer = Callable[[str, str], float]
"""``(response, reference) -> score``."""


def chrf(response: str, reference: str) -> float:
    """Sentence chrF of ``response`` against ``reference`` (sacrebleu's defaults: character
    6-grams, beta 2, whitespace ignored), in 0..1; 1.0 for identical texts."""
    metrics: Any = require("sacrebleu.metrics", "train")
    return float(metrics.CHRF().sentence_score(response, [reference]).score) / 100.0


class EmbeddingSimilarity:
    """Cosine similarity of mean-pooled hidden states of the model at ``model_dir``.

    Loaded on the first call (``transformers.AutoModel``, CPU unless ``device``), kept for
    the instance's life; texts are cut at ``max_tokens`` tokens. Thread-compatible, not
    thread-safe (one instance per worker).
    """

    def __init__(self, model_dir: str, *, device: str = "cpu", max_tokens: int = 512) -> None:
        self.model_dir, self.device, self.max_tokens = model_dir, device, max_tokens
        self._loaded: tuple[Any, Any] | None = None

    def _load(self) -> tuple[Any, Any]:
        if self._loaded is None:
            transformers: Any = require("transformers", "torch")
            try:
                tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_dir)
                model = transformers.AutoModel.from_pretrained(self.model_dir)
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"cannot load an embedding model from {self.model_dir!r} "
                    f"({str(exc).splitlines()[0]}); give a local model directory, or no "
                    "model for chrF"
                ) from exc
            self._loaded = (tokenizer, model.to(self.device).eval())
        return self._loaded

    def embed(self, text: str) -> Any:
        """The mean of the last hidden states over ``text``'s tokens, a 1-D tensor."""
        torch: Any = require("torch", "torch")
        tokenizer, model = self._load()
        batch = tokenizer(
            text or " ", return_tensors="pt", truncation=True, max_length=self.max_tokens
        ).to(self.device)
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state[0]  # (T, H)
        mask = batch["attention_mask"][0].unsqueeze(-1).to(hidden.dtype)  # (T, 1)
        return (hidden * mask).sum(0) / mask.sum().clamp(min=1.0)  # (H,)

    def __call__(self, response: str, reference: str) -> float:
        torch: Any = require("torch", "torch")
        a, b = self.embed(response), self.embed(reference)
        return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def similarity_scorer(model: str | None = None) -> Scorer:
    """chrF for ``None``/``""``/``"chrf"``, else :class:`EmbeddingSimilarity` of ``model``."""
    if not model or model == "chrf":
        return chrf
    return EmbeddingSimilarity(model)


def _field(action: str, key: str) -> str | None:
    """The string ``key`` of a JSON-object action, or None."""
    try:
        value = json.loads(action)
    except ValueError:
        return None
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


class SimilarityReward(BaseParallelWrapper):  # type: ignore[misc]
    """Adds the ``similarity`` component (``weight`` x the score) where a reference is known;
    see the module docstring. A scorer result that is not finite is an error (never 0)."""

    def __init__(self, env: Any, scorer: Scorer = chrf, *, key: str = "", weight: float = 1.0):
        super().__init__(env)
        self.metadata = env.metadata  # (the class attribute would hide the env's)
        if not math.isfinite(weight):
            raise ConfigError(f"similarity weight must be a finite number, got {weight!r}")
        self.scorer, self.key, self.weight = scorer, key, weight

    def _reference(self, seat: str, info: Mapping[str, Any]) -> str | None:
        reference = info.get(REFERENCE_KEY)
        if reference is None and self.key:
            reference = (self.env.oracle(seat) or {}).get(self.key)
        return reference if isinstance(reference, str) else None

    def step(self, actions: dict[str, Any]) -> tuple[Any, ...]:
        # The oracle is read before the step: an episode's last step may end its state.
        references = {a: self._reference(a, {}) for a in actions} if self.key else {}
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        rewards = dict(rewards)
        for agent, action in actions.items():
            info = infos.get(agent)
            if info is None:
                continue
            reference = self._reference(agent, info) or references.get(agent)
            response = _field(str(action), self.key) if self.key else str(action)
            if reference is None or response is None:
                continue
            score = float(self.scorer(response, reference))
            if not math.isfinite(score):
                raise ValueError(f"similarity scorer gave {score} for {agent}'s response")
            value = self.weight * score
            components = dict(info.get("components") or {})
            components[COMPONENT] = components.get(COMPONENT, 0.0) + value
            infos[agent] = {**info, "components": components}
            rewards[agent] = rewards.get(agent, 0.0) + value
        return observations, rewards, terminations, truncations, infos
