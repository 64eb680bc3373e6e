"""Action constraints (structured output) for backends that decode token by token.

A :class:`~parley.protocols.messages.Constraint` says what text a completion may be:

- ``choice``: exactly one of ``choices``. Decoded through a prefix trie over each choice's
  canonical token sequence (the tokenizer's own encoding of the choice), so every
  completion is one of the choices, followed by the end-of-sequence token.
- ``regex``: the whole completion fully matches ``pattern`` (``regex`` module syntax).
  At each step a token is allowed iff the text with that token appended can still be
  extended to a full match (``regex`` partial matching); end-of-sequence is allowed iff
  the text is already a full match. Cost: one partial match per vocabulary entry per new
  prefix (cached), fine for small vocabularies, slow for 100k+ ones - use vLLM there.
- ``json``: a JSON Schema compiled to a regex by :func:`json_schema_to_regex`. Supported:
  ``enum``, ``const``, ``type`` string / integer / number / boolean / null, ``object``
  with ``properties`` (every property emitted, in schema order, ``json.dumps`` spacing:
  ``{"a": 1, "b": "x"}``), ``array`` of ``items`` (``minItems``/``maxItems`` honoured),
  ``anyOf``/``oneOf``. Not supported (rejected with a :class:`BackendError`): ``$ref``,
  ``pattern``, optional properties, ``additionalProperties``, numeric bounds. vLLM's
  structured outputs accept full JSON Schema; this subset is the transformers backend's.

This module imports no torch: masks are numpy arrays over the vocabulary.
"""

from __future__ import annotations

import codecs
import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from parley.arena.inference.backends.errors import BackendError
from parley.protocols.messages import Constraint

__all__ = [
    "check_constraint",
    "constraint_regex",
    "json_schema_to_regex",
    "matches",
    "TokenVocab",
    "TokenMatcher",
    "make_matchers",
]

_STRING = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
_INTEGER = r"-?(0|[1-9][0-9]*)"
_NUMBER = _INTEGER + r"(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_UNSUPPORTED = ("$ref", "pattern", "additionalProperties", "minimum", "maximum", "format")


def _regex_module() -> Any:
    try:
        import regex
    except ImportError as exc:  # a core dependency; only a broken install lacks it
        raise BackendError("the `regex` package is missing: pip install regex") from exc
    return regex


def json_schema_to_regex(schema: dict[str, Any] | str) -> str:
    """A regex whose full matches are exactly the JSON texts this backend emits for ``schema``.

    Raises :class:`BackendError` naming the first unsupported keyword.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise BackendError(f"json_schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise BackendError("a JSON schema must be an object")
    return _schema(schema)


def _schema(s: dict[str, Any]) -> str:
    for key in _UNSUPPORTED:
        if key in s:
            raise BackendError(
                f"JSON schema keyword {key!r} is not supported by this backend's constraint "
                "compiler; use the vllm backend or simplify the schema"
            )
    if "enum" in s:
        return "(" + "|".join(re.escape(json.dumps(v)) for v in s["enum"]) + ")"
    if "const" in s:
        return re.escape(json.dumps(s["const"]))
    for key in ("anyOf", "oneOf"):
        if key in s:
            return "(" + "|".join(_schema(sub) for sub in s[key]) + ")"
    kind = s.get("type")
    if kind == "object":
        props: dict[str, Any] = s.get("properties", {})
        parts = [re.escape(json.dumps(name)) + ": " + _schema(sub) for name, sub in props.items()]
        return r"\{" + ", ".join(parts) + r"\}"
    if kind == "array":
        item = _schema(s.get("items", {"type": "string"}))
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        if hi is not None and int(hi) == 0:
            return r"\[\]"
        upper = "" if hi is None else str(int(hi) - 1)
        more = f"{{{max(lo - 1, 0)},{upper}}}"
        body = f"{item}(, {item}){more}"
        return r"\[" + (body if lo > 0 else f"({body})?") + r"\]"
    simple = {
        "string": _STRING,
        "integer": _INTEGER,
        "number": _NUMBER,
        "boolean": "(true|false)",
        "null": "null",
    }
    if isinstance(kind, str) and kind in simple:
        return simple[kind]
    raise BackendError(f"JSON schema {json.dumps(s)[:80]} has no supported 'type'/'enum'/'const'")


def constraint_regex(constraint: Constraint) -> str:
    """The regex a completion must fully match (choices become an escaped alternation)."""
    if constraint.type == "choice":
        return "(" + "|".join(re.escape(c) for c in constraint.choices) + ")"
    if constraint.type == "regex":
        return str(constraint.pattern)
    return json_schema_to_regex(constraint.json_schema)


def check_constraint(constraint: Constraint) -> None:
    """Raise :class:`BackendError` if ``constraint`` is malformed or unsupported."""
    if constraint.type == "choice":
        if not constraint.choices or any(not c for c in constraint.choices):
            raise BackendError("a choice constraint needs at least one non-empty choice")
        return
    if constraint.type == "regex" and not constraint.pattern:
        raise BackendError("a regex constraint needs a pattern")
    if constraint.type == "json" and not constraint.json_schema:
        raise BackendError("a json constraint needs json_schema (a JSON Schema as a string)")
    try:
        _regex_module().compile(constraint_regex(constraint))
    except Exception as exc:  # regex.error has no stable public base class across versions
        if isinstance(exc, BackendError):
            raise
        raise BackendError(f"constraint pattern does not compile: {exc}") from exc


def matches(constraint: Constraint, text: str) -> bool:
    """Whether ``text`` satisfies ``constraint`` (what a valid completion looks like).

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
            pattern = constraint_regex(constraint)
        except BackendError:
            return True
        return _regex_module().fullmatch(pattern, text) is not None
    return _regex_module().fullmatch(constraint_regex(constraint), text) is not None


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
    """The bytes of every token id, for matching text constraints token by token.

    ``size`` is the model's logit width (which may exceed the tokenizer's length); ids
    without text (special tokens, padding rows) have ``None`` and are never allowed by a
    constraint, except ``eos_id`` which ends a completion once the constraint is met.
    """

    def __init__(self, tokenizer: _HFTokenizer, size: int, eos_id: int) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self.eos_id = eos_id
        special = set(tokenizer.all_special_ids)
        n = min(len(tokenizer), size)
        tokens = tokenizer.convert_ids_to_tokens(list(range(n)))
        inverse = _byte_decoder()
        byte_level = all(
            ch in inverse for i, t in enumerate(tokens) if t and i not in special for ch in t
        )
        self.bytes: list[bytes | None] = [None] * size
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
        self._candidates = [i for i, b in enumerate(self.bytes) if b]
        # Tokens grouped by their first byte when it is ASCII (a whole character): if the
        # text plus that character cannot match, no token of the group can (one test
        # rules out a whole group); tokens starting with a non-ASCII byte are tested alone.
        self._by_first: dict[str, list[int]] = {}
        self._other: list[int] = []
        for i in self._candidates:
            first = self.bytes[i][0]  # type: ignore[index]
            if first < 0x80:
                self._by_first.setdefault(chr(first), []).append(i)
            else:
                self._other.append(i)
        self._cache: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()

    def encode(self, text: str) -> list[int]:
        """The canonical token ids of ``text`` (no special tokens)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def regex_mask(self, pattern: Any, prefix: bytes) -> np.ndarray:
        """Allowed next tokens after ``prefix`` for a compiled ``regex`` pattern (cached)."""
        key = (pattern.pattern, prefix)
        mask = self._cache.get(key)
        if mask is not None:
            self._cache.move_to_end(key)
            return mask
        mask = np.zeros(self.size, dtype=bool)
        done = _split_utf8(prefix)
        if done is not None and not done[1]:
            candidates = list(self._other)
            for char, group in self._by_first.items():
                if pattern.fullmatch(done[0] + char, partial=True) is not None:
                    candidates += group
        else:
            candidates = self._candidates
        for i in candidates:
            mask[i] = _can_continue(pattern, prefix + self.bytes[i])  # type: ignore[operator]
        if done is not None and not done[1] and pattern.fullmatch(done[0]) is not None:
            mask[self.eos_id] = True
        self._cache[key] = mask
        if len(self._cache) > 4096:
            self._cache.popitem(last=False)
        return mask


def _split_utf8(data: bytes) -> tuple[str, bytes] | None:
    """``data`` as (complete text, pending bytes of an unfinished character); None if invalid."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return None
    return text, decoder.getstate()[0]


def _can_continue(pattern: Any, data: bytes) -> bool:
    """Whether text starting with the bytes ``data`` can still fully match ``pattern``.

    When ``data`` ends inside a multi-byte character, some character starting with those
    bytes must keep a partial match; the (at most 64) candidates are enumerated. A token
    ending two or more bytes short of a character (a lone 3- or 4-byte lead byte) is
    refused: enumerating 4096+ characters per token per step is too slow, and byte-level
    vocabularies usually hold merged tokens for the characters a pattern needs.
    """
    split = _split_utf8(data)
    if split is None:
        return False
    text, pending = split
    if not pending:
        return pattern.fullmatch(text, partial=True) is not None
    length = 2 if pending[0] < 0xE0 else 3 if pending[0] < 0xF0 else 4
    value = pending[0] & (0x7F >> length)
    for byte in pending[1:]:
        value = value << 6 | (byte & 0x3F)
    free = 6 * (length - len(pending))
    if free > 6:
        return False
    lo = value << free
    shortest = (0, 0, 0x80, 0x800, 0x10000)[length]  # smaller code points are overlong
    for cp in range(lo, lo + (1 << free)):
        if cp < shortest or 0xD800 <= cp <= 0xDFFF or cp > 0x10FFFF:
            continue
        if pattern.fullmatch(text + chr(cp), partial=True) is not None:
            return True
    return False


class TokenMatcher:
    """Per-completion constraint state: which tokens may come next, advanced per token."""

    def __init__(self, vocab: TokenVocab, constraint: Constraint) -> None:
        check_constraint(constraint)
        self.vocab = vocab
        self._prefix = b""
        self._trie: dict[int, Any] | None = None
        self._node: dict[int, Any] = {}
        if constraint.type == "choice":
            self._trie = {}
            for choice in constraint.choices:
                node = self._trie
                for tok in vocab.encode(choice):
                    node = node.setdefault(tok, {})
                node[-1] = {}  # -1 marks "a choice ends here"
            self._node = self._trie
        else:
            self._pattern = _regex_module().compile(constraint_regex(constraint))

    def allowed(self) -> np.ndarray:
        """Boolean mask over the vocabulary of tokens that keep the constraint satisfiable."""
        if self._trie is not None:
            mask = np.zeros(self.vocab.size, dtype=bool)
            for tok in self._node:
                mask[self.vocab.eos_id if tok == -1 else tok] = True
            return mask
        return self.vocab.regex_mask(self._pattern, self._prefix)

    def advance(self, token: int) -> None:
        """Record that ``token`` was generated (must have been allowed)."""
        if self._trie is not None:
            self._node = self._node.get(-1 if token == self.vocab.eos_id else token, {})
            return
        piece = self.vocab.bytes[token] if 0 <= token < self.vocab.size else None
        self._prefix += piece or b""


def make_matchers(
    vocab: TokenVocab, constraints: Sequence[Constraint | None]
) -> list[TokenMatcher | None]:
    """One matcher per row (None where the row is unconstrained)."""
    return [None if c is None else TokenMatcher(vocab, c) for c in constraints]
