r"""Action constraints (structured output) for backends that decode token by token.

A :class:`~parley.protocols.messages.Constraint` says what text a completion may be:

- ``choice``: exactly one of ``choices``. Decoded through a prefix trie over each choice's
  canonical token sequence (the tokenizer's own encoding of the choice), so every
  completion is one of the choices, followed by the end-of-sequence token.
- ``regex``: the whole completion fully matches ``pattern``. The dialect is llguidance's,
  Rust's ``regex`` syntax (classes, ``\d``/``\w``/``\s``, counted repetition, Unicode;
  no look-around, no backreferences; ``[^\s\S]`` matches nothing), the same on every
  backend: the transformers backend masks tokens with llguidance (:class:`TokenMatcher`),
  and vLLM runs its ``guidance`` structured-output backend, the same engine. Matching
  works on derivatives of the regex, without backtracking (no ReDoS class): a mask takes
  microseconds to milliseconds. At each step a token is allowed iff the text with it can
  still be extended to a full match; end-of-sequence iff the text is a full match. Where
  the constraint forces the text, the engine offers the tokenizer's canonical tokens.
- ``json``: a JSON Schema compiled to a regex by :func:`json_schema_to_regex`, the same
  regex on every backend (vLLM gets it as a regex constraint), so outputs look alike
  everywhere: every property emitted, in schema order, ``json.dumps`` spacing
  (``{"a": 1, "b": "x"}``). Constraints are complete or refused: the compiler honours
  every keyword it accepts (:data:`SUPPORTED_KEYWORDS`: ``type`` (or a list of types),
  ``enum``, ``const``, ``anyOf``, ``oneOf`` with disjoint alternatives, string
  ``minLength``/``maxLength``, object ``properties``/``required``/``additionalProperties``,
  array ``items``/``minItems``/``maxItems``, annotations) and refuses any other keyword
  (``pattern``, ``format``, numeric bounds, ``$ref``, ...) with a :class:`BackendError`
  listing what is supported, rather than ignoring it.

Verdicts depend on the constraint alone, never on time or load. A constraint is refused
up front (:func:`check_constraint`, :class:`ConstraintError`, a 400 naming ``constraint``
over HTTP) when it is invalid, over the engine's work limits (:data:`MATCHER_LIMITS`:
counts of work), or unsatisfiable: no choices, an empty ``enum`` or ``anyOf``,
``minItems`` > ``maxItems``, a regex no text can match (``[^\s\S]``, decided by the
engine), or, on the transformers backend, one that allows no first token of the
vocabulary. Nothing is cached: each completion compiles its own matcher. A constrained
completion cut by ``max_tokens`` finishes ``"length"`` (its text does not satisfy the
constraint); only one that satisfies it finishes ``"stop"``.

This module imports no torch: masks are numpy arrays over the vocabulary.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from parley.arena.inference.backends.errors import BackendError, ConstraintError
from parley.arena.inference.backends.json_schema import (
    SUPPORTED_KEYWORDS,
    json_schema_to_regex,
)
from parley.protocols.messages import Constraint

__all__ = [
    "ConstraintError",
    "check_constraint",
    "MATCHER_LIMITS",
    "constraint_regex",
    "SUPPORTED_KEYWORDS",
    "json_schema_to_regex",
    "TokenVocab",
    "TokenMatcher",
    "probe_constraint",
]


def constraint_regex(constraint: Constraint) -> str:
    """The regex a completion must fully match (choices become an escaped alternation)."""
    if constraint.type == "choice":
        return "(" + "|".join(re.escape(c) for c in constraint.choices) + ")"
    if constraint.type == "regex":
        return str(constraint.pattern)
    return json_schema_to_regex(constraint.json_schema)


def check_constraint(constraint: Constraint) -> None:
    """Raise :class:`ConstraintError` if ``constraint`` is malformed, unsupported, over the
    matching engine's work limits, or cannot be satisfied by any text.

    The verdict depends on the constraint alone (the engine's limits count work, not time),
    so it is the same on every backend, at any load, every time it is asked."""
    if constraint.type == "choice":
        if not constraint.choices or any(not c for c in constraint.choices):
            raise ConstraintError(
                "invalid", "a choice constraint needs at least one non-empty choice"
            )
        return
    if constraint.type == "regex" and not constraint.pattern:
        raise ConstraintError("invalid", "a regex constraint needs a pattern")
    if constraint.type == "json" and not constraint.json_schema:
        raise ConstraintError(
            "invalid", "a json constraint needs json_schema (a JSON Schema as a string)"
        )
    try:
        grammar = constraint_grammar(constraint)
    except ConstraintError:
        raise
    except BackendError as exc:  # the schema compiler's refusals
        raise ConstraintError("invalid", str(exc)) from exc
    _checked_mask(_compiled(_byte_vocab(), grammar), constraint.type)


def matches(constraint: Constraint, text: str) -> bool:
    """Whether ``text`` satisfies ``constraint`` (what a valid completion looks like), by the
    same engine and dialect that constrains generation.

    For a JSON schema outside the subset :func:`json_schema_to_regex` compiles, only
    "is valid JSON" is checked (parley does not depend on a JSON Schema validator).
    """
    if constraint.type == "choice":
        return text in constraint.choices
    if constraint.type == "json":
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return False
    try:
        grammar = constraint_grammar(constraint)
    except BackendError:
        if constraint.type == "json":
            return True
        raise
    matcher = _compiled(_byte_vocab(), grammar)
    return bool(matcher.consume_tokens(list(text.encode())) and matcher.is_accepting())


# --- token level ----------------------------------------------------------------------


class _HFTokenizer(Protocol):
    """The parts of a Hugging Face tokenizer the vocabulary table reads."""

    all_special_ids: list[int]

    def __len__(self) -> int: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    def decode(self, ids: list[int]) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenVocab:
    """The bytes of every token id, and the matching engine's view of the vocabulary.

    ``size`` is the model's logit width (which may exceed the tokenizer's length); ids
    without text (special tokens, padding rows) have ``None`` and are never allowed by a
    constraint, except ``eos_id`` which ends a completion once the constraint is met
    (``eos_id`` < 0: the tokenizer has none, and a constraint can never end a completion).
    """

    def __init__(self, tokenizer: _HFTokenizer | None, size: int, eos_id: int) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self.eos_id = eos_id
        self.bytes: list[bytes | None] = [None] * size
        self._ll: Any = None
        if tokenizer is None:  # the byte alphabet: checks that need no model
            self.bytes = [bytes([i]) for i in range(size)]
            return
        special = set(tokenizer.all_special_ids)
        n = min(len(tokenizer), size)
        tokens = tokenizer.convert_ids_to_tokens(list(range(n)))
        inverse = _byte_decoder()
        byte_level = all(
            ch in inverse for i, t in enumerate(tokens) if t and i not in special for ch in t
        )
        for i, tok in enumerate(tokens):
            if i in special or not tok:
                continue
            if byte_level and all(ch in inverse for ch in tok):
                self.bytes[i] = bytes(inverse[ch] for ch in tok)
            else:
                # Not a byte-level vocabulary (e.g. SentencePiece): decode the token after a
                # fixed one, so a leading space is not stripped.
                base = tokenizer.encode("a", add_special_tokens=False)
                self.bytes[i] = tokenizer.decode([*base, i])[len(tokenizer.decode(base)) :].encode()

    def encode(self, text: str) -> list[int]:
        """The canonical token ids of ``text`` (no special tokens)."""
        if self.tokenizer is None:
            return list(text.encode())
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def ll(self) -> Any:
        """The engine's tokenizer (``llguidance.LLTokenizer``), built on first use (a
        150k-token vocabulary takes about a second). Without an eos token of its own, the
        engine gets one more id, past the logits, that no mask ever offers."""
        if self._ll is None:
            llg = _llg()
            self._ll = llg.LLTokenizer(llg.TokenizerWrapper(_EngineTable(self)))
        return self._ll


class _EngineTable:
    """What ``llguidance.TokenizerWrapper`` reads: each id's bytes (empty for special ids),
    the end token, and canonical tokenisation (for text the grammar forces)."""

    def __init__(self, vocab: TokenVocab) -> None:
        eos = vocab.eos_id if vocab.eos_id >= 0 else vocab.size
        self.tokens = [b or b"" for b in vocab.bytes] + ([b""] if eos == vocab.size else [])
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(self.tokens) if not b]
        self._vocab = vocab

    def __call__(self, text: bytes) -> list[int]:
        if self._vocab.tokenizer is None:
            return list(text)
        return self._vocab.encode(text.decode("utf-8", errors="replace"))


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # a core dependency; only a broken install lacks it
        raise BackendError("the `llguidance` package is missing: pip install llguidance") from exc
    return llguidance


@functools.cache
def _byte_vocab() -> TokenVocab:
    """One token per byte and an end token: for verdicts that hold for any model."""
    return TokenVocab(None, 256, -1)


def constraint_grammar(constraint: Constraint) -> str:
    """The llguidance grammar of a regex or JSON constraint: :func:`constraint_regex` as a
    regex, the very grammar vLLM's ``guidance`` structured-output backend builds from it."""
    return str(_llg().grammar_from("regex", constraint_regex(constraint)))


MATCHER_LIMITS: dict[str, int] = {
    "initial_lexer_fuel": 100_000,  # llguidance's default 1M: see below
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_lexer_states": 250_000,
    "max_grammar_size": 500_000,
}
"""The matching engine's work limits (llguidance's ``LLParserLimits``): counts of work,
never time, so a constraint over them is refused the same way on a busy machine as on an
idle one. The engine matches without backtracking (derivatives of the regex, built
lazily), so a mask takes microseconds to milliseconds. llguidance's defaults, except the
initial lexer fuel, 10x lower: at 1M, ``(a{1000}){1000}`` (15 characters) took 2.7-3.0 s
of CPU on the tiny model before its matcher stopped at the second token ("too many
expressions constructed"); at 100k it stops there after 0.12 s, and a schema compiled to
33 KB of pattern (300 properties) still passes its check in 17 ms. A matcher stopped by a
limit ends its completion with ``error``, at the same token at any load. parley checks
every constraint with these limits before any backend sees it, vLLM's included."""


def _compiled(vocab: TokenVocab, grammar: str) -> Any:
    """A fresh ``LLMatcher`` for ``grammar`` at its start.

    Never copied from a cached one: copies of a matcher share the engine's regex state, so
    what one completion built would count against the work limits of the next, and a
    verdict would depend on history (``(a{1000}){1000}`` passed its first check and failed
    the next one's first mask). Compiling takes about a millisecond for a sane pattern."""
    llg = _llg()
    return llg.LLMatcher(
        vocab.ll, grammar, log_level=0, limits=llg.LLParserLimits(**MATCHER_LIMITS)
    )


def _checked_mask(matcher: Any, kind: str) -> np.ndarray:
    """The next mask of ``matcher``, or the reason it cannot go on, raised as
    :class:`ConstraintError`: the engine refused the grammar (invalid), ran into its work
    limits (too costly: at the start, or at a later token, the same token at any load), or
    the language is empty (at the start: unsatisfiable)."""
    mask = _mask(matcher)
    if matcher.is_error():
        error = _first_line(matcher.get_error())
        if error.startswith("NoExtension"):
            raise ConstraintError(
                "unsatisfiable", f"the {kind} constraint cannot be satisfied: no text can match it"
            )
        if any(word in error for word in ("too big", "too complex", "too many", "limit", "fuel")):
            raise ConstraintError(
                "too_costly",
                f"the {kind} constraint is too costly to enforce ({error}); the engine's work "
                "limits are in constraints.MATCHER_LIMITS: simplify the pattern or schema",
            )
        raise ConstraintError("invalid", f"the {kind} constraint is not valid: {error}")
    return mask


def _first_line(error: str) -> str:
    """The engine's error in one line: its first line and the line saying what is wrong
    (a regex parse error spans several, with the reason last)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    reason = [line for line in lines[1:] if line.startswith("error:")]
    return " ".join([lines[0], *reason[:1]])[:300]


def _mask(matcher: Any) -> np.ndarray:
    """The engine's next-token bitmask as booleans over its vocabulary (all False once it
    is in error: the completion then ends with ``error``)."""
    bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little").astype(bool)


class TokenMatcher:
    """Per-completion constraint state: which tokens may come next, advanced per token.

    A choice walks a prefix trie of each choice's canonical tokens; a regex or a JSON
    schema is matched by llguidance (:func:`constraint_grammar`). Raises
    :class:`ConstraintError` when the constraint cannot be used (see :func:`check_constraint`)
    or allows no first token of this vocabulary, and :meth:`allowed` raises it when the
    engine stops at a later token on its work limits (the client's constraint is at fault:
    a 400 naming it, not a failed completion)."""

    def __init__(self, vocab: TokenVocab, constraint: Constraint) -> None:
        check_constraint(constraint)
        self.vocab = vocab
        self._trie: dict[int, Any] | None = None
        self._node: dict[int, Any] = {}
        self._matcher: Any = None
        if constraint.type == "choice":
            self._trie = {}
            for choice in constraint.choices:
                node = self._trie
                for tok in vocab.encode(choice):
                    node = node.setdefault(tok, {})
                node[-1] = {}  # -1 marks "a choice ends here"
            self._node = self._trie
            return
        self._matcher = _compiled(vocab, constraint_grammar(constraint))
        self._kind = constraint.type
        self._next: np.ndarray | None = _checked_mask(self._matcher, constraint.type)
        if not self.allowed().any():
            raise ConstraintError(
                "unsatisfiable",
                f"the {constraint.type} constraint allows no first token of this model's "
                "vocabulary (it cannot be satisfied with it); check the pattern or schema",
            )

    def allowed(self) -> np.ndarray:
        """Boolean mask over the vocabulary of tokens that keep the constraint satisfiable."""
        if self._trie is not None:
            mask = np.zeros(self.vocab.size, dtype=bool)
            for tok in self._node:
                mask[self.vocab.eos_id if tok == -1 else tok] = True
            return mask
        if self._next is None:
            self._next = _checked_mask(self._matcher, self._kind)
        mask = np.zeros(self.vocab.size, dtype=bool)
        n = min(self.vocab.size, self._next.size)
        mask[:n] = self._next[:n]
        return mask

    def advance(self, token: int) -> None:
        """Record that ``token`` was generated (must have been allowed)."""
        if self._trie is not None:
            self._node = self._node.get(-1 if token == self.vocab.eos_id else token, {})
            return
        self._next = None
        if token != self.vocab.eos_id:
            self._matcher.consume_token(token)


def make_matchers(
    vocab: TokenVocab, constraints: Sequence[Constraint | None]
) -> list[TokenMatcher | None]:
    """One matcher per row (None where the row is unconstrained)."""
    return [None if c is None else TokenMatcher(vocab, c) for c in constraints]


PROBE_TOKENS = 8
"""Tokens :func:`probe_constraint` walks by default: each costs one mask (microseconds to
milliseconds for a constraint within the limits)."""


def probe_constraint(vocab: TokenVocab, constraint: Constraint, tokens: int = PROBE_TOKENS) -> None:
    """Walk ``constraint`` on ``vocab`` with parley's work limits for up to ``tokens`` tokens,
    each step taking the lowest allowed token id other than end-of-sequence; raise
    :class:`ConstraintError` where the transformers backend would refuse it (its check, its
    first mask, or a later mask on that path running out of :data:`MATCHER_LIMITS`). One
    path only: a constraint that runs out of the limits later or elsewhere passes."""
    matcher = TokenMatcher(vocab, constraint)  # parley's check and the first mask
    for _ in range(tokens):
        allowed = matcher.allowed()  # raises at the token the limits run out
        if vocab.eos_id >= 0:
            allowed[vocab.eos_id] = False
        ids = np.flatnonzero(allowed)
        if ids.size == 0:
            return  # only end-of-sequence is left: the text is complete
        matcher.advance(int(ids[0]))
