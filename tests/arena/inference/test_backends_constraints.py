"""The constraint compiler (JSON Schema -> regex, matching) and token-level matching."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parley.arena.inference.backends import BackendError
from parley.arena.inference.backends.constraints import (
    TokenMatcher,
    TokenVocab,
    check_constraint,
    json_schema_to_regex,
    matches,
)
from parley.protocols.messages import Constraint


def json_constraint(schema: dict[str, object]) -> Constraint:
    return Constraint(type="json", json_schema=json.dumps(schema))


SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["offer", "accept"]},
        "book": {"type": "integer"},
        "price": {"type": "number"},
        "note": {"type": "string"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "who": {"anyOf": [{"const": "me"}, {"type": "null"}]},
    },
}


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ({"action": "offer", "book": 2, "price": -1.5e3, "note": 'a "q"', "ok": True,
          "tags": ["x"], "who": "me"}, True),
        ({"action": "accept", "book": 0, "price": 0, "note": "", "ok": False,
          "tags": ["x", "y"], "who": None}, True),
        ({"action": "deny", "book": 2, "price": 1, "note": "", "ok": True,
          "tags": ["x"], "who": None}, False),  # not in the enum
        ({"action": "offer", "book": 2.5, "price": 1, "note": "", "ok": True,
          "tags": ["x"], "who": None}, False),  # not an integer
        ({"action": "offer", "book": 2, "price": 1, "note": "", "ok": True,
          "tags": [], "who": None}, False),  # minItems
        ({"action": "offer", "book": 2, "price": 1, "note": "", "ok": True,
          "tags": ["a", "b", "c"], "who": None}, False),  # maxItems
        ({"book": 2, "action": "offer", "price": 1, "note": "", "ok": True,
          "tags": ["x"], "who": None}, False),  # keys in schema order only
    ],
)  # fmt: skip
def test_json_schemas_compile_to_exact_regexes(value: dict[str, object], valid: bool) -> None:
    assert matches(json_constraint(SCHEMA), json.dumps(value)) is valid


def test_unsupported_schemas_are_refused_with_a_hint() -> None:
    for schema in ({"$ref": "#/x"}, {"type": "string", "pattern": "a+"}, {"type": "thing"}):
        with pytest.raises(BackendError, match=r"vllm|supported"):
            json_schema_to_regex(schema)
    with pytest.raises(BackendError, match="not valid JSON"):
        check_constraint(Constraint(type="json", json_schema="{"))
    # matches() still checks JSON validity for schemas only vLLM can enforce
    assert matches(json_constraint({"$ref": "#"}), '{"a": 1}')
    assert not matches(json_constraint({"$ref": "#"}), "{a")


def test_choice_and_regex_matching() -> None:
    choice = Constraint(type="choice", choices=["a.b", "c"])
    assert matches(choice, "a.b")
    assert not matches(choice, "axb")  # choices are literal, not patterns
    regex = Constraint(type="regex", pattern=r"book=[0-4]")
    assert matches(regex, "book=3")
    assert not matches(regex, "book=5")
    for bad in (Constraint(type="choice", choices=[""]), Constraint(type="regex", pattern="(")):
        with pytest.raises(BackendError):
            check_constraint(bad)


@pytest.fixture(scope="module")
def vocab(tiny_model_dir: Path) -> TokenVocab:
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    return TokenVocab(tok.hf, len(tok), int(tok.eos_token_id or 0))


def walk(vocab: TokenVocab, constraint: Constraint, seed: int) -> bytes:
    """Follow random allowed tokens until only end-of-sequence remains or is picked."""
    rng = np.random.default_rng(seed)
    matcher = TokenMatcher(vocab, constraint)
    out = b""
    for _ in range(200):
        allowed = np.flatnonzero(matcher.allowed())
        assert allowed.size, f"dead end after {out!r}"
        token = int(rng.choice(allowed))
        if token == vocab.eos_id:
            return out
        matcher.advance(token)
        out += vocab.bytes[token] or b""
    raise AssertionError("no end of sequence within 200 tokens")


@pytest.mark.parametrize(
    "constraint",
    [
        # 2-byte characters; "€" needs a token holding 2+ of its bytes (none in this vocab),
        # so that branch is closed rather than a dead end.
        Constraint(type="regex", pattern=r"café|naïve|€5"),
        Constraint(type="regex", pattern=r"(yes|no)( [0-9]{1,3})?"),
        Constraint(type="choice", choices=["offer", "off", "accept"]),  # a prefix choice
        json_constraint({"type": "object", "properties": {"n": {"enum": [1, 22]}}}),
    ],
    ids=["utf8", "regex", "choice", "json"],
)
def test_random_walks_through_the_token_masks_always_match(
    vocab: TokenVocab, constraint: Constraint
) -> None:
    for seed in range(25):
        text = walk(vocab, constraint, seed).decode("utf-8")
        assert matches(constraint, text), text
