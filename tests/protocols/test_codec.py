"""Round trips of every message kind (property-based), codec limits, errors and arrays."""

from __future__ import annotations

import contextlib
import types
import typing
from typing import Any

import msgpack
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from parley.protocols.codec import Codec
from parley.protocols.errors import ProtocolError
from parley.protocols.messages import (
    BODY_TYPES,
    SCHEMA_VERSION,
    Body,
    Chat,
    Envelope,
    Observation,
    WeightUpdate,
)

# --- strategies built from the struct types ----------------------------------------------

_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
_JSON = st.recursive(
    _JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_ARRAYS = hnp.arrays(
    dtype=st.sampled_from(
        [np.int8, np.int32, np.int64, np.uint16, np.float32, np.float64, np.bool_]
    ),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy producing valid values of the annotation ``tp`` (message fields only)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return struct_strategy(tp)
    if origin is typing.Annotated:  # (list lengths: the bounds are far above max_size)
        inner, *metas = args
        ge = [m.ge for m in metas if isinstance(m, msgspec.Meta) and m.ge is not None]
        return st.integers(ge[0], 2**64 - 1) if inner is int and ge else strategy_for(inner)
    if tp is Any:
        return _JSON
    if tp is np.ndarray:
        return _ARRAYS
    if tp is str:
        return st.text(max_size=30)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-(2**63), 2**64 - 1)
    if tp is float:
        return st.floats(allow_nan=False)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is list:
        return st.lists(strategy_for(args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=4)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in args))
    if tp is type(None):
        return st.none()
    raise NotImplementedError(f"no strategy for {tp!r}: extend strategy_for")


def struct_strategy(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: strategy_for(hints[f.name]) for f in msgspec.structs.fields(cls)}
    return st.builds(cls, **fields)


ENVELOPES = st.builds(
    Envelope,
    body=st.one_of(*(struct_strategy(t) for t in BODY_TYPES)),
    sender=st.text(max_size=10),
    id=st.integers(0, 2**63),
    reply_to=st.integers(0, 2**63),
    expects_reply=st.booleans(),
    to=st.lists(st.text(max_size=5), max_size=3),
    channel=st.text(max_size=10),
    episode=st.text(max_size=10),
    turn=st.integers(0, 10_000),
)


def plain(value: Any) -> Any:
    """A comparable form: structs as (type, fields), arrays as (dtype, shape, bytes)."""
    if isinstance(value, msgspec.Struct):
        return (
            type(value).__name__,
            {f: plain(getattr(value, f)) for f in value.__struct_fields__},
        )
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(ENVELOPES, st.sampled_from([64, 1 << 30]))
def test_every_kind_round_trips(env: Envelope, zero_copy_bytes: int) -> None:
    """Every field of every kind survives the codec, arrays inline and out of band."""
    codec = Codec(zero_copy_bytes=zero_copy_bytes)
    frames = codec.encode(env)
    assert plain(codec.decode([bytes(f) for f in frames])) == plain(env)


def test_every_body_kind_is_covered() -> None:
    kinds = {t.__struct_config__.tag for t in BODY_TYPES}
    assert len(kinds) == len(BODY_TYPES)  # tags are unique
    assert set(Body.__subclasses__()) == set(BODY_TYPES)


# --- arrays ------------------------------------------------------------------------------


def test_small_arrays_inline_large_arrays_out_of_band() -> None:
    codec = Codec(zero_copy_bytes=1024)
    small = np.arange(10, dtype=np.float32)
    large = np.arange(1000, dtype=np.float64).reshape(10, 100)
    env = Envelope(body=WeightUpdate(policy="p", version=3, tensors={"a": small, "b": large}))
    frames = codec.encode(env)
    assert len(frames) == 2
    assert len(frames[1]) == large.nbytes
    out = codec.decode(frames)
    assert isinstance(out.body, WeightUpdate)
    np.testing.assert_array_equal(out.body.tensors["a"], small)
    np.testing.assert_array_equal(out.body.tensors["b"], large)
    assert out.body.tensors["b"].dtype == np.float64


def test_object_arrays_are_refused_both_ways() -> None:
    codec = Codec()
    env = Envelope(body=WeightUpdate(policy="p", version=1, tensors={"x": np.array([object()])}))
    with pytest.raises(ProtocolError, match="cannot be sent"):
        codec.encode(env)
    forged = msgpack.packb(
        {
            "body": {
                "kind": "weights",
                "policy": "p",
                "version": 1,
                "tensors": {"x": {"dtype": "|O", "shape": [1], "data": b"\0" * 8}},
            }
        }
    )
    with pytest.raises(ProtocolError, match="not allowed"):
        codec.decode([forged])


@pytest.mark.parametrize(
    ("meta", "frames", "reason"),
    [
        ({"dtype": "<f4", "shape": [3], "data": b"\0" * 8}, [], "buffer has 8 bytes"),
        ({"dtype": "<f4", "shape": [2], "frame": 1}, [], "missing frame"),
        ({"dtype": "<f4", "shape": [-1], "data": b""}, [], "negative"),
        ({"dtype": "<f4", "shape": [1], "data": b"\0" * 4}, [b"extra"], "frame count"),
        ({"shape": [1]}, [], "bad array metadata"),
    ],
)
def test_bad_arrays_are_protocol_errors(
    meta: dict[str, Any], frames: list[bytes], reason: str
) -> None:
    head = msgpack.packb(
        {"body": {"kind": "weights", "policy": "p", "version": 1, "tensors": {"x": meta}}}
    )
    with pytest.raises(ProtocolError, match=reason):
        Codec().decode([head, *frames])


# --- limits and errors -------------------------------------------------------------------


def test_size_limit_is_enforced_both_ways() -> None:
    codec = Codec(max_message_bytes=1000)
    big = Envelope(body=Chat(sender="a", text="x" * 2000))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        codec.encode(big)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        codec.decode(Codec().encode(big))
    with pytest.raises(ValueError):
        Codec(max_message_bytes=0)


def test_unknown_python_types_are_refused() -> None:
    env = Envelope(body=Observation(agent="a", text="", info={"when": object()}))
    with pytest.raises(ProtocolError, match="cannot encode Observation"):
        Codec().encode(env)


@pytest.mark.parametrize(
    ("frames", "code", "reason"),
    [
        ([], "bad_message", "empty message"),
        ([b""], "bad_message", "malformed"),
        ([b"\xc1"], "bad_message", "malformed"),
        ([msgpack.packb([1, 2])], "bad_message", "malformed"),
        ([msgpack.packb({"body": {"kind": "nope"}})], "bad_message", "malformed"),
        ([msgpack.packb({"body": {"kind": "chat"}})], "bad_message", "malformed"),
        ([msgpack.packb({"body": {"kind": "ok"}, "v": 99})], "unsupported_version", "schema"),
        (
            [msgpack.packb({"body": {"kind": "ok", "x": 1}, "v": 2, "new": 1})],
            "unsupported_version",
            "schema",
        ),
    ],
)
def test_malformed_input_gives_protocol_error(frames: list[bytes], code: str, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason) as info:
        Codec().decode(frames)
    assert info.value.code == code


def test_absent_fields_take_their_defaults() -> None:
    """The wire form omits defaults; a minimal map from any msgpack library decodes."""
    env = Codec().decode([msgpack.packb({"body": {"kind": "chat", "sender": "a", "text": "hi"}})])
    assert env == Envelope(body=Chat(sender="a", text="hi"))
    assert env.v == SCHEMA_VERSION
    assert msgpack.unpackb(Codec().encode(env)[0]) == {
        "body": {"kind": "chat", "sender": "a", "text": "hi"}
    }


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_codec(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        Codec().decode([data])
