"""Reading warm start: teach a tiny random model to read its prompt, before any RL.

Why: a randomly initialised tiny LM cannot *read*. In the referential game the listener
must find, among numbered lines, the one its partner's message refers to and answer that
line's number (match a line, copy its number); the speaker must pick the target out of a
list of distractors. Such a model has to discover those circuits from scratch, and by RL
with one bit of reward per episode it sits at chance for hundreds of updates (measured in
``examples/referential.md``). Real LLMs arrive able to read; this gives the tiny one a
similar starting point.

What it is: supervised next-token training on *generic* exercises with literal names —
``lookup`` ("Find: green", numbered lines, answer the number of the line that says
"green") and ``repeat`` (answer the item named "Target" among "Others"). Neither contains
a message, a code or the game's reward: nothing about *which code means which object* is
learned here. The RL stages that follow still have to invent (speaker) and understand
(listener) the code from the shared reward alone.

:func:`pretrain_reading` trains a ``transformers`` causal LM in place and returns its
accuracy curve (fraction of the batch answered right, per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from parley.protocols.errors import require

__all__ = ["pretrain_reading"]


def _words() -> list[str]:
    from parley.scenarios.collaboration.referential import ATTRIBUTES

    return [w for group in ATTRIBUTES for w in group]


def lookup_example(
    rng: np.random.Generator,
    words: Sequence[str],
    *,
    min_items: int = 2,
    max_items: int = 6,
    max_words: int = 2,
    question: str = "",
    query: str = "Find",
) -> tuple[str, str]:
    """One (user text, answer) pair: find an item among numbered lines of 1..max_words
    words each (``question`` replaces the closing ``Pick 1-N:`` line, ``query`` the word
    before the item looked for)."""
    n = int(rng.integers(min_items, max_items + 1))
    size = int(rng.integers(1, max_words + 1))
    items: list[str] = []
    while len(items) < n:
        item = " ".join(str(w) for w in rng.choice(list(words), size=size, replace=False))
        if item not in items:
            items.append(item)
    target = int(rng.integers(n))
    lines = "\n".join(f"{i + 1} {item}" for i, item in enumerate(items))
    text = f"{query}: {items[target]}\n{lines}\n{question or f'Pick 1-{n}:'}"
    return text, str(target + 1)


def repeat_example(
    rng: np.random.Generator,
    words: Sequence[str],
    *,
    min_items: int = 2,
    max_items: int = 6,
    max_words: int = 1,
    question: str = "Repeat the target:",
    query: str = "",
) -> tuple[str, str]:
    """One (user text, answer) pair: repeat the item named "Target" among the others."""
    n = int(rng.integers(min_items, max_items + 1))
    items = [str(w) for w in rng.choice(list(words), size=n, replace=False)]
    others = ", ".join(items[1:])
    return f"Target: {items[0]}\nOthers: {others}\n{question}", items[0]


TASKS = {"lookup": lookup_example, "repeat": repeat_example}
"""Warm-start task name -> example maker ``(rng, words, ...) -> (text, answer)``:
``lookup`` reads a numbered list (listener-like), ``repeat`` names the target among
distractors (speaker-like)."""


def pretrain_reading(
    model: Any,
    tokenizer: Any,
    *,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    target: float | None = 0.97,
    system_prompt: str = "",
    words: Sequence[str] | None = None,
    min_items: int = 2,
    max_items: int = 6,
    max_words: int = 2,
    task: str = "lookup",
    question: str = "",
    query: str = "",
    params: Sequence[Any] | None = None,
) -> list[float]:
    """Train ``model`` on :func:`lookup_example` answers for up to ``steps`` steps.

    ``tokenizer`` is a :class:`~parley.arena.inference.backends.tokenizer.HFChatTokenizer` (prompts
    go through the chat template, as the LLM agent sends them). ``words`` (default: every
    attribute word of the referential scenario), ``min_items``..``max_items`` lines of
    1..``max_words`` words shape the lists; ``task`` picks the exercise (:data:`TASKS`)
    and ``question`` replaces its closing line (``query``: the lookup's first word).
    Stops early when the mean accuracy of the last 10 steps reaches ``target``. ``params``:
    the parameters that learn (default: all of ``model``'s; a LoRA adapter's alone when
    the model is a ``PeftModel``). Returns accuracy per step.
    """
    torch: Any = require("torch", "train")
    rng = np.random.default_rng(seed)
    words = list(words) if words else _words()
    optim = torch.optim.Adam(list(params) if params is not None else model.parameters(), lr=lr)
    pad = int(tokenizer.pad_token_id)
    eos = tokenizer.eos_token_id
    model.train()
    curve: list[float] = []
    for _ in range(steps):
        rows, answers = [], []
        for _ in range(batch_size):
            options: dict[str, Any] = {"question": question} if question else {}
            if query:
                options["query"] = query
            text, answer = TASKS[task](
                rng, words, min_items=min_items, max_items=max_items, max_words=max_words, **options
            )
            messages = [{"role": "user", "content": text}]
            if system_prompt:
                messages.insert(0, {"role": "system", "content": system_prompt})
            prompt = tokenizer.encode_chat(messages)
            completion = tokenizer.encode(answer) + ([eos] if eos is not None else [])
            rows.append((prompt, completion))
            answers.append(completion[0])
        length = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((batch_size, length), pad, dtype=torch.long)  # (B, L)
        attn = torch.zeros((batch_size, length), dtype=torch.long)  # (B, L)
        labels = torch.full((batch_size, length), -100, dtype=torch.long)  # (B, L)
        answer_pos = torch.zeros(batch_size, dtype=torch.long)  # (B,) where the answer is
        for i, (p, c) in enumerate(rows):
            row = p + c
            start = length - len(row)
            ids[i, start:] = torch.tensor(row)
            attn[i, start:] = 1
            labels[i, start + len(p) :] = torch.tensor(c)
            answer_pos[i] = start + len(p) - 1
        positions = (attn.cumsum(1) - 1).clamp(min=0)
        device = next(model.parameters()).device  # the model's (a GPU when trained there)
        ids, attn, positions = ids.to(device), attn.to(device), positions.to(device)
        labels, answer_pos = labels.to(device), answer_pos.to(device)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits
        # Next-token loss on the completion tokens only (B, L-1, V) vs (B, L-1).
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        )
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        picked = logits[torch.arange(batch_size, device=device), answer_pos].argmax(-1)  # (B,)
        curve.append(float((picked.cpu() == torch.tensor(answers)).float().mean()))
        if target is not None and len(curve) >= 10 and float(np.mean(curve[-10:])) >= target:
            break
    model.eval()
    return curve
