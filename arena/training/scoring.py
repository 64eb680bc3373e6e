"""The legal-token masks the trainer scores constrained samples under.

A backend that decoded under a constraint (choice, regex, JSON schema) sampled from the
distribution restricted to the tokens the constraint allowed at each step; the trainer
differentiates the same restricted distribution (see :mod:`parley.arena.training.pg`).
:class:`LegalMasks` rebuilds those masks with the backend's own matcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LegalMasks"]


class LegalMasks:
    """(B, T, V) masks of the allowed tokens of samples, for one tokenizer (its token
    table is built once per vocabulary width and kept)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._vocab: Any = None

    def __call__(self, part: Sequence[Any], t_max: int, width: int) -> np.ndarray | None:
        """Per sample of ``part`` (:class:`~parley.arena.training.pg.Sample`), per generated
        position right-aligned to ``t_max``, the tokens its constraint allowed (all True for
        an unconstrained sample or padding); None when no sample was constrained."""
        if all(s.constraint is None for s in part):
            return None
        from parley.arena.inference.backends.constraints import TokenMatcher, TokenVocab

        if self._vocab is None or self._vocab.size != width:
            hf = getattr(self.tokenizer, "hf", self.tokenizer)
            eos = self.tokenizer.eos_token_id
            self._vocab = TokenVocab(hf, width, -1 if eos is None else int(eos))
        mask = np.ones((len(part), t_max, width), dtype=bool)
        for i, s in enumerate(part):
            if s.constraint is None:
                continue
            matcher = TokenMatcher(self._vocab, s.constraint)
            offset = t_max - len(s.token_ids)
            for t, token in enumerate(s.token_ids):
                allowed = matcher.allowed()
                # A token the mask refuses means the sample was not made under this
                # constraint (e.g. a different tokenizer): fall back to the full softmax.
                if not allowed[token]:
                    mask[i, offset:] = True
                    break
                mask[i, offset + t] = allowed
                matcher.advance(token)
        return mask
