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

from parley.arena.inference.backends.errors import BackendError, RequestError
from parley.protocols.messages import Constraint

__all__ = [
    "ConstraintError",
    "check_constraint",
    "constraint_grammar",
    "MATCHER_LIMITS",
    "constraint_regex",
    "SUPPORTED_KEYWORDS",
    "json_schema_to_regex",
    "matches",
    "TokenVocab",
    "TokenMatcher",
    "make_matchers",
]


class ConstraintError(RequestError):
    """A constraint that cannot be used, refused before any token is generated.

    ``reason`` is ``"invalid"`` (malformed or unsupported), ``"unsatisfiable"`` (no text,
    or no token of the model's vocabulary, can start a match) or ``"too_costly"`` (over the
    matching engine's work limits, :data:`MATCHER_LIMITS`). The field is ``"constraint"``:
    the client must change its constraint (an HTTP 400 naming it, never a 5xx)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__("constraint", message)
        self.reason = reason


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
        raise ConstraintError(
            "too_costly",
            f"{where}: the schema compiles to a pattern of {len(out):,} characters; at most "
            f"{MAX_SCHEMA_REGEX_CHARS:,} (nest fewer arrays or objects)",
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
