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

Unsatisfiable constraints are errors, not empty outputs: no choices, an empty ``enum`` or
``anyOf``, ``minItems`` > ``maxItems``, a regex that no text can start to match. The
transformers backend also refuses a constraint that allows no first token of its
vocabulary. A constrained completion cut by ``max_tokens`` finishes ``"length"`` (its text
does not satisfy the constraint); only one that satisfies it finishes ``"stop"``.

This module imports no torch: masks are numpy arrays over the vocabulary.
"""

from __future__ import annotations

import codecs
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from parley.arena.inference.backends.errors import BackendError
from parley.protocols.messages import Constraint

_log = logging.getLogger(__name__)

__all__ = [
    "check_constraint",
    "constraint_regex",
    "SUPPORTED_KEYWORDS",
    "json_schema_to_regex",
    "matches",
    "TokenVocab",
    "TokenMatcher",
    "make_matchers",
]

# One character of a JSON string: a plain character, a short escape, or a \u escape of a
# non-surrogate (so each regex repetition is one code point, as minLength/maxLength count).
_CHAR = (
    r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))'
)
_STRING = '"' + _CHAR + '*"'
_INTEGER = r"-?(0|[1-9][0-9]*)"
_NUMBER = _INTEGER + r"(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_SIMPLE = {
    "string": _STRING,
    "integer": _INTEGER,
    "number": _NUMBER,
    "boolean": "(true|false)",
    "null": "null",
}

# The JSON Schema keywords the compiler honours exactly; any other keyword is refused.
_ANNOTATIONS = frozenset(
    {"title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated"}
)
_GENERIC = frozenset({"type", "enum", "const", "anyOf", "oneOf"})
_BY_TYPE: dict[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
}
SUPPORTED_KEYWORDS = sorted(_ANNOTATIONS | _GENERIC | frozenset().union(*_BY_TYPE.values()))
"""Every JSON Schema keyword :func:`json_schema_to_regex` accepts."""
_SUPPORTED_HINT = (
    "supported: type (string, integer, number, boolean, null, object, array or a list of "
    "them), enum, const, anyOf, oneOf (disjoint alternatives), string minLength/maxLength, "
    "object properties/required/additionalProperties (every property is emitted, in schema "
    "order), array items/minItems/maxItems, and annotations (title, description, ...)"
)


def _regex_module() -> Any:
    try:
        import regex
    except ImportError as exc:  # a core dependency; only a broken install lacks it
        raise BackendError("the `regex` package is missing: pip install regex") from exc
    return regex


def json_schema_to_regex(schema: dict[str, Any] | str) -> str:
    """A regex whose full matches are exactly the JSON texts this backend emits for ``schema``.

    Every text it matches is valid under ``schema`` (whitespace and key order fixed:
    ``json.dumps`` spacing, properties in schema order). Raises :class:`BackendError` naming
    the first keyword it cannot honour (with the list of supported ones) or saying why the
    schema cannot be satisfied.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise BackendError(f"json_schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise BackendError("a JSON schema must be an object")
    return _schema(schema, "#")


def _count(s: dict[str, Any], key: str, where: str) -> int | None:
    value = s.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackendError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    if value > 10_000:
        raise BackendError(f"{where}: {key} above 10000 is not supported, got {value}")
    return value


def _bounds(s: dict[str, Any], lo_key: str, hi_key: str, where: str) -> tuple[int, int | None]:
    lo, hi = _count(s, lo_key, where) or 0, _count(s, hi_key, where)
    if hi is not None and lo > hi:
        raise BackendError(f"{where}: {lo_key} {lo} > {hi_key} {hi}: no value can satisfy it")
    return lo, hi


def _types(s: dict[str, Any], where: str) -> list[str]:
    kind = s.get("type")
    kinds = kind if isinstance(kind, list) else [] if kind is None else [kind]
    if kind is not None and not kinds:
        raise BackendError(f"{where}: an empty type list cannot be satisfied")
    for k in kinds:
        if k not in _SIMPLE and k not in ("object", "array"):
            raise BackendError(f"{where}: type {k!r} is not supported; {_SUPPORTED_HINT}")
    return kinds


MAX_SCHEMA_REGEX_CHARS = 64 * 1024
"""Longest regex a JSON schema may compile to (checked at every level as it is built): an
array nested 17 deep, 494 characters of schema, had grown a regex 4x per level (119 MB at
20) and held the pool's event loop for every client."""


def _schema(s: Any, where: str) -> str:
    out = _schema_body(s, where)
    if len(out) > MAX_SCHEMA_REGEX_CHARS:
        raise BackendError(
            f"{where}: the schema compiles to a pattern of {len(out):,} characters; at most "
            f"{MAX_SCHEMA_REGEX_CHARS:,} (nest fewer arrays or objects)"
        )
    return out


def _schema_body(s: Any, where: str) -> str:
    if not isinstance(s, dict):
        raise BackendError(f"{where}: a schema must be an object, got {json.dumps(s)[:40]}")
    kinds = _types(s, where)
    allowed = _ANNOTATIONS | _GENERIC | frozenset().union(*(_BY_TYPE.get(k, ()) for k in kinds))
    for key in s:
        if key not in allowed:
            raise BackendError(
                f"{where}: JSON schema keyword {key!r} is not supported (it would be ignored, "
                f"so outputs could break it); {_SUPPORTED_HINT}"
            )
    if "enum" in s or "const" in s:
        return _values(s, kinds, where)
    for key in ("anyOf", "oneOf"):
        if key in s:
            if kinds or len([k for k in s if k not in _ANNOTATIONS]) > 1:
                raise BackendError(f"{where}: {key} beside other keywords is not supported")
            subs = s[key]
            if not isinstance(subs, list) or not subs:
                raise BackendError(f"{where}: an empty {key} cannot be satisfied")
            if key == "oneOf":
                _check_disjoint(subs, where)
            return (
                "("
                + "|".join(_schema(sub, f"{where}/{key}/{i}") for i, sub in enumerate(subs))
                + ")"
            )
    if not kinds:
        raise BackendError(
            f"{where}: the schema needs a type, enum, const or anyOf; {_SUPPORTED_HINT}"
        )
    return "(" + "|".join(_typed(s, k, where) for k in kinds) + ")"


def _typed(s: dict[str, Any], kind: str, where: str) -> str:
    if kind == "object":
        props: dict[str, Any] = s.get("properties", {})
        if not isinstance(props, dict):
            raise BackendError(f"{where}: properties must be an object")
        required = s.get("required", [])
        missing = [r for r in required if r not in props] if isinstance(required, list) else [0]
        if missing:
            raise BackendError(
                f"{where}: required must list names from properties (every property is "
                f"emitted); not there: {missing}"
            )
        parts = [
            re.escape(json.dumps(name)) + ": " + _schema(sub, f"{where}/properties/{name}")
            for name, sub in props.items()
        ]
        return r"\{" + ", ".join(parts) + r"\}"
    if kind == "array":
        item = _schema(s.get("items", {"type": "string"}), f"{where}/items")
        lo, hi = _bounds(s, "minItems", "maxItems", where)
        if hi == 0:
            return r"\[\]"
        more = f"{{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}"
        body = f"{item}(, {item}){more}"
        return r"\[" + (body if lo > 0 else f"({body})?") + r"\]"
    if kind == "string" and ("minLength" in s or "maxLength" in s):
        lo, hi = _bounds(s, "minLength", "maxLength", where)
        return f'"{_CHAR}{{{lo},{"" if hi is None else hi}}}"'
    return _SIMPLE[kind]


_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


def _type_of(value: Any) -> str:
    return (
        "object"
        if isinstance(value, dict)
        else "array"
        if isinstance(value, list)
        else _JSON_TYPE[type(value)]
    )


def _values(s: dict[str, Any], kinds: list[str], where: str) -> str:
    values = [s["const"]] if "const" in s else s["enum"]
    if not isinstance(values, list):
        raise BackendError(f"{where}: enum must be a list")
    if "const" in s and "enum" in s and s["const"] not in s["enum"]:
        raise BackendError(f"{where}: const is not in enum: no value can satisfy both")
    if kinds:  # enum beside type: every value must have one of the types
        ok = set(kinds) | ({"integer"} if "number" in kinds else set())
        values = [
            v
            for v in values
            if _type_of(v) in ok
            or (_type_of(v) == "number" and "integer" in ok and float(v).is_integer())
        ]
    if not values:
        raise BackendError(
            f"{where}: an empty enum (or none of its values of the given type) cannot be satisfied"
        )
    return "(" + "|".join(re.escape(json.dumps(v)) for v in values) + ")"


def _check_disjoint(subs: list[Any], where: str) -> None:
    """oneOf means exactly one alternative matches; an alternation means at least one.

    They agree when no output can match two alternatives: each alternative is reduced to
    the JSON types it can produce (or its constants), and those must not overlap."""
    seen: set[str] = set()
    for sub in subs:
        if isinstance(sub, dict) and ("const" in sub or "enum" in sub):
            values = [sub["const"]] if "const" in sub else list(sub.get("enum") or [])
            keys = {json.dumps(v, sort_keys=True) for v in values}
            keys |= {"type:" + _type_of(v) for v in values}
            clash = bool(keys & seen)
        else:
            kinds = set(_types(sub, where)) if isinstance(sub, dict) else set()
            if "number" in kinds:
                kinds.add("integer")
            keys = {"type:" + k for k in kinds or {"*"}}
            clash = bool(keys & seen) or "type:*" in seen or ("type:*" in keys and bool(seen))
        if clash:
            raise BackendError(
                f"{where}: oneOf alternatives that may overlap are not supported (an output "
                "could match two of them); use anyOf, or make them distinct types or constants"
            )
        seen |= keys


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
        pattern = _regex_module().compile(constraint_regex(constraint))
    except Exception as exc:  # regex.error has no stable public base class across versions
        if isinstance(exc, BackendError):
            raise
        raise BackendError(f"constraint pattern does not compile: {exc}") from exc
    if pattern.fullmatch("", partial=True) is None:
        raise BackendError(
            f"the {constraint.type} constraint cannot be satisfied: no text can match it"
        )


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
        """Allowed next tokens after ``prefix`` for a compiled ``regex`` pattern (cached).

        At most :data:`MATCH_BUDGET_S` per match and :data:`MASK_BUDGET_S` per mask (or
        :data:`MASK_BUDGET_PER_TOKEN_S` per token of the vocabulary, if more): a
        pattern that backtracks past either allows no token, so its completion ends with
        ``error`` (``(a|a){40}``, ten characters, had
        taken minutes per token and held every request of the policy behind it)."""
        key = (pattern.pattern, prefix)
        mask = self._cache.get(key)
        if mask is not None:
            self._cache.move_to_end(key)
            return mask
        mask = np.zeros(self.size, dtype=bool)
        budget = max(MASK_BUDGET_S, MASK_BUDGET_PER_TOKEN_S * self.size)
        deadline = time.monotonic() + budget
        try:
            done = _split_utf8(prefix)
            if done is not None and not done[1]:
                candidates = list(self._other)
                for char, group in self._by_first.items():
                    if _partial(pattern, done[0] + char, deadline):
                        candidates += group
            else:
                candidates = self._candidates
            for i in candidates:
                mask[i] = _can_continue(pattern, prefix + self.bytes[i], deadline)  # type: ignore[operator]
            if done is not None and not done[1] and _full(pattern, done[0], deadline):
                mask[self.eos_id] = True
        except TimeoutError:
            mask[:] = False
            _log.warning(
                "constraint pattern %.80r took over %g s for one match or %g s for one token "
                "mask: its completion ends with error",
                pattern.pattern,
                MATCH_BUDGET_S,
                budget,
            )
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


MATCH_BUDGET_S = 0.05
"""Most time one partial match may take: a sane pattern takes microseconds, a backtracking
one seconds and more (see :meth:`TokenVocab.regex_mask`)."""
MASK_BUDGET_S = 0.5
"""Most time one token mask may take on a small vocabulary (a longer one gets
:data:`MASK_BUDGET_PER_TOKEN_S` per token: 1.5 s for 150k, ~5x a sane pattern's cost)."""
MASK_BUDGET_PER_TOKEN_S = 1e-5


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return min(left, MATCH_BUDGET_S)


def _partial(pattern: Any, text: str, deadline: float) -> bool:
    """``text`` can still be extended to a full match (raises TimeoutError past ``deadline``)."""
    return pattern.fullmatch(text, partial=True, timeout=_left(deadline)) is not None


def _full(pattern: Any, text: str, deadline: float) -> bool:
    return pattern.fullmatch(text, timeout=_left(deadline)) is not None


def _can_continue(pattern: Any, data: bytes, deadline: float) -> bool:
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
        return _partial(pattern, text, deadline)
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
        if _partial(pattern, text + chr(cp), deadline):
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
