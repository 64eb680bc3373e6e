"""Constraints are complete or refused (issue 12 §4), on the transformers backend and the
HTTP front; the vLLM side is in ``test_backends_vllm.py``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from parley.arena.inference.backends import BackendError, RequestError
from parley.arena.inference.backends.constraints import SUPPORTED_KEYWORDS, json_schema_to_regex
from parley.arena.inference.http import serve_http
from parley.arena.inference.pool import InferencePool, PoolConfig
from parley.protocols.messages import Constraint, GenerateRequest, SamplingParams

pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")
from parley.arena.inference.backends.transformers import TransformersBackend  # noqa: E402

pytestmark = pytest.mark.timeout(180)

SCHEMA = {
    "title": "a move",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "n": {"type": ["integer", "null"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "kind": {"oneOf": [{"const": "x"}, {"type": "integer"}]},
    },
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture
async def backend(tiny_model_dir: Path) -> AsyncIterator[TransformersBackend]:
    b = await TransformersBackend.create(str(tiny_model_dir))
    yield b
    await b.close()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "a+"},
        {"type": "string", "format": "email"},
        {"type": "integer", "minimum": 0},
        {"type": "number", "multipleOf": 2},
        {"$ref": "#/$defs/x"},
        {"allOf": [{"type": "string"}]},
        {"type": "object", "properties": {"a": {"type": "string", "maxLenght": 3}}},
        {"type": "array", "uniqueItems": True},
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},  # 1 matches both
        {},
    ],
)
def test_keywords_it_cannot_honour_are_refused(schema: dict[str, object]) -> None:
    with pytest.raises(BackendError, match=r"not supported|needs a type") as err:
        json_schema_to_regex(schema)
    assert "supported:" in str(err.value) or "oneOf" in str(err.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": []},
        {"anyOf": []},
        {"type": []},
        {"type": "string", "enum": [1, 2]},
        {"const": "a", "enum": ["b"]},
        {"type": "string", "minLength": 4, "maxLength": 2},
        {"type": "array", "minItems": 3, "maxItems": 1},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
    ],
)
def test_unsatisfiable_schemas_are_errors(schema: dict[str, object]) -> None:
    with pytest.raises(BackendError, match=r"cannot be satisfied|no value|not there"):
        json_schema_to_regex(schema)


def test_supported_keywords_are_listed() -> None:
    assert {"minLength", "maxLength", "required", "enum", "anyOf"} <= set(SUPPORTED_KEYWORDS)
    assert "pattern" not in SUPPORTED_KEYWORDS


async def test_stop_means_valid_and_cut_means_length(backend: TransformersBackend) -> None:
    """Every completion that finished "stop" validates against the schema (jsonschema,
    not our own matcher); every one that does not was cut by max_tokens: "length"."""
    c = Constraint(type="json", json_schema=json.dumps(SCHEMA))
    requests = [
        GenerateRequest(prompt="json", params=SamplingParams(max_tokens=m, seed=i), constraint=c)
        for i in range(16)
        for m in (10, 80)
    ]
    seen: Counter[tuple[str, bool]] = Counter()
    for result in await backend.generate(requests):
        (done,) = result.completions
        try:
            jsonschema.validate(json.loads(done.text), SCHEMA)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        seen[done.finish_reason, valid] += 1
    assert set(seen) <= {("stop", True), ("length", False)}, seen
    assert seen["stop", True], seen
    assert seen["length", False], seen


async def test_the_backend_refuses_constraints_with_no_first_token(
    backend: TransformersBackend,
) -> None:
    for c in (
        Constraint(type="regex", pattern="(?!)x"),
        Constraint(type="regex", pattern=r"\b\B"),
        Constraint(type="choice", choices=[]),
        Constraint(type="json", json_schema='{"enum": []}'),
    ):
        with pytest.raises(RequestError) as err:
            backend.validate(GenerateRequest(prompt="x", constraint=c))
        assert err.value.field == "constraint"


async def test_http_never_reports_a_failed_completion_as_stop(
    backend: TransformersBackend,
) -> None:
    """A regex whose matches dead-end after one token (``a`` must be followed by ``a``
    and must not) had started a completion that ended in an error (a 500); the matching
    engine (llguidance) refuses its look-around up front, a 400 naming the constraint,
    and cannot reach a dead end (it knows when no text can follow)."""
    async with InferencePool({"tiny": backend}, PoolConfig(), owns_backends=False) as pool:
        runner, url = await serve_http(pool)
        try:
            async with aiohttp.ClientSession() as http:
                body = {"model": "tiny", "prompt": "x", "max_tokens": 5, "guided_regex": "a(?!a)a"}
                async with http.post(f"{url}/completions", json=body) as r:
                    dead_end = (r.status, await r.json())
                async with http.get(f"{url}/models") as r:
                    models = await r.json()
        finally:
            await runner.cleanup()
    status, reply = dead_end
    assert status == 400, reply
    assert reply["error"]["code"] == "bad_request"
    assert reply["error"]["param"] == "constraint"
    assert "look-around" in reply["error"]["message"]
    assert models["data"][0]["dtype"] == "float32"
    assert models["data"][0]["backend"] == "transformers"
