"""Closed MessagePack encoding of :class:`~parley.protocols.messages.Envelope` values.

One envelope travels as one or more ZeroMQ frames: frame 0 is the MessagePack map of the
envelope; frames 1.. are raw buffers of numpy arrays that were too large to inline.

Arrays are encoded as a map ``{"dtype": str, "shape": [int], "data": bytes}`` when small,
or ``{"dtype": str, "shape": [int], "frame": i}`` when their buffer travels as frame ``i``
(zero-copy pays only from ~64 KB on this hardware, so smaller arrays are inlined).
Anything else that is not a message struct or a plain MessagePack value raises: the
encoding is closed and there is no pickle anywhere.

A :class:`Codec` is not thread-safe: give each socket (each event loop) its own.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection, Sequence
from typing import Annotated, Any, TypeAlias, Union, cast

import msgspec
import numpy as np

from parley.protocols.errors import ProtocolError
from parley.protocols.messages import (
    BODY_KINDS,
    BODY_TYPES,
    SCHEMA_VERSION,
    Bye,
    Envelope,
    Error,
    Heartbeat,
    Hello,
    Ok,
    Subscribe,
    kind_of,
)

__all__ = [
    "Codec",
    "Frame",
    "Head",
    "NestedTooDeep",
    "salvage_head",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_ZERO_COPY_BYTES",
    "STRANGER_MAX_BYTES",
    "SESSION_KINDS",
]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest accepted message (all frames together); larger ones are refused both ways."""

DEFAULT_ZERO_COPY_BYTES = 64 * 1024
"""Arrays at least this large travel as their own frame, without a copy."""

STRANGER_MAX_BYTES = 64 * 1024
"""Largest message accepted from a connection that has not said ``Hello``: a ``Hello`` is a
few hundred bytes. Larger ones are refused unread (see :meth:`Codec.decode_stranger`)."""

SESSION_KINDS = frozenset(kind_of(t) for t in (Hello, Heartbeat, Bye, Subscribe, Ok, Error))
"""Body kinds every endpoint decodes, whatever it ``accept``s: the session and the replies
that carry no payload."""

_KINDS = {kind_of(t): t for t in BODY_TYPES}

# Arrays may only carry plain numeric dtypes: an object dtype would smuggle pickles in.
_ALLOWED_DTYPE_KINDS = frozenset("biuf")

Frame: TypeAlias = bytes | memoryview


class _Version(msgspec.Struct):
    """Just enough of an envelope to read its schema version."""

    v: int = SCHEMA_VERSION


def _unsupported(version: int) -> ProtocolError:
    return ProtocolError(
        f"unsupported schema version {version}; this peer speaks {SCHEMA_VERSION}",
        code="unsupported_version",
    )


_TOO_DEEP = "malformed message: nested too deeply (over ~900 levels of maps or lists)"


class NestedTooDeep(ProtocolError):
    """A message nested deeper than the decoder goes (~900 levels of maps or lists): pass
    it to :func:`salvage_head` as ``nested`` so that the nesting is not walked again."""

    def __init__(self, reason: str = _TOO_DEEP, *, code: str = "bad_message") -> None:
        super().__init__(reason, code=code)


# What decoding hostile bytes may raise; all of it becomes a ProtocolError. RecursionError:
# maps or lists nested ~1,000 deep exhaust the interpreter's recursion limit.
_DECODE_ERRORS = (msgspec.DecodeError, ValueError, TypeError, RecursionError)


class _StrangerEnvelope(msgspec.Struct, kw_only=True):
    """What a connection that has not said ``Hello`` may send: the envelope fields its
    answer needs, and a body that is ``Hello``, ``Heartbeat`` or ``Bye``."""

    body: Hello | Heartbeat | Bye
    sender: str = ""
    id: int = 0
    expects_reply: bool = False
    v: int = SCHEMA_VERSION


class _BodyKind(msgspec.Struct):
    kind: str = ""


class _KindProbe(msgspec.Struct):
    """Just enough of an envelope to read its body's kind (the rest is skipped in C)."""

    body: _BodyKind = msgspec.field(default_factory=_BodyKind)


class Peek(msgspec.Struct, kw_only=True):
    """The envelope fields a receiver reads before deciding to decode a large body
    (:meth:`Codec.peek`; the body's other fields are skipped in C, no objects built)."""

    body: _BodyKind = msgspec.field(default_factory=_BodyKind)
    id: int = 0
    reply_to: int = 0
    expects_reply: bool = False
    channel: str = ""
    episode: str = ""


_peek_decoder = msgspec.msgpack.Decoder(Peek)


class _ArrayWire(msgspec.Struct, forbid_unknown_fields=True):
    """An array's map exactly as the encoder writes it (checked before the array decodes:
    the decoder hands an array's map to the hook as any MessagePack value, built whole)."""

    dtype: str
    shape: Annotated[list[int], msgspec.Meta(max_length=64)]
    data: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    frame: int = 0


class _WeightsWire(msgspec.Struct):
    kind: str = ""
    tensors: dict[str, _ArrayWire] = msgspec.field(default_factory=dict)


class _WeightsProbe(msgspec.Struct):
    """A weights body's arrays, closed (every other field skipped in C)."""

    body: _WeightsWire = msgspec.field(default_factory=_WeightsWire)


_CHECK_ARRAYS_BYTES = 64 * 1024
"""Messages from this size on that may carry arrays (``weights``) get their array maps
checked closed first: a smaller one cannot build much whatever it holds."""


def _as_envelope(self: Envelope) -> tuple[Any, ...]:
    """Pickle a decoded envelope as the plain :class:`Envelope` it is (its class is made at
    run time, under no importable name)."""
    values = {name: getattr(self, name) for name in self.__struct_fields__}
    return (functools.partial(Envelope, **values), ())


def _accepting(kinds: Collection[str]) -> type[Envelope]:
    """An :class:`Envelope` subclass whose body may only be of ``kinds`` (and the session
    kinds): a body of another kind fails at its tag, the rest of it skipped unread."""
    unknown = sorted(set(kinds) - BODY_KINDS)
    if unknown:
        raise ValueError(f"unknown body kinds {unknown}; the kinds are {sorted(BODY_KINDS)}")
    types = tuple(t for kind, t in _KINDS.items() if kind in kinds or kind in SESSION_KINDS)
    body = Union[types]  # type: ignore[valid-type]  # noqa: UP007 -- built at run time
    accepted = msgspec.defstruct(
        "AcceptedEnvelope",
        [("body", body)],
        bases=(Envelope,),
        kw_only=True,
        omit_defaults=True,
        namespace={"__reduce__": _as_envelope},
    )
    return cast("type[Envelope]", accepted)


class Codec:
    """Encodes envelopes into frames and decodes frames back, enforcing size limits.

    ``accept`` (body kinds, as on the wire) restricts what :meth:`decode` builds: a message
    whose body is of another kind (beyond :data:`SESSION_KINDS`) is refused unread with
    ``ProtocolError`` ``unexpected_kind``. A receiver that never handles a kind thus never
    builds the objects of one: ``Observation.info`` holds any MessagePack value, and 64 MiB
    of empty lists there decode to ~4.5 GB of Python lists. ``None`` decodes every kind.
    With ``accept`` the envelopes decoded are of a subclass of :class:`Envelope` (they
    pickle as plain envelopes; ``==`` compares classes too).
    """

    def __init__(
        self,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        zero_copy_bytes: int = DEFAULT_ZERO_COPY_BYTES,
        accept: Collection[str] | None = None,
    ) -> None:
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
        self.max_message_bytes = max_message_bytes
        self.zero_copy_bytes = zero_copy_bytes
        self.accept = None if accept is None else frozenset(accept) | SESSION_KINDS
        self._out_frames: list[Frame] = []
        self._in_frames: Sequence[Frame] = ()
        self._used_frames = 0
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        envelope = Envelope if accept is None else _accepting(accept)
        self._decoder = msgspec.msgpack.Decoder(envelope, dec_hook=self._dec_hook)
        self._kind_decoder = msgspec.msgpack.Decoder(_KindProbe)
        self._arrays_decoder = msgspec.msgpack.Decoder(_WeightsProbe)
        self._takes_arrays = accept is None or "weights" in accept
        self._version_decoder = msgspec.msgpack.Decoder(_Version)
        self._stranger_decoder = msgspec.msgpack.Decoder(_StrangerEnvelope)
        # Bound once: the per-message path is short enough for attribute lookups to show.
        self._encode = self._encoder.encode
        self._decode = self._decoder.decode

    # --- encoding -------------------------------------------------------------------

    def encode(self, envelope: Envelope) -> list[Frame]:
        """Frames for ``envelope``; raises ``ProtocolError`` if it cannot be sent."""
        try:
            head = self._encode(envelope)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            self._out_frames = []
            raise ProtocolError(f"cannot encode {type(envelope.body).__name__}: {exc}") from exc
        if not self._out_frames and len(head) <= self.max_message_bytes:
            return [head]  # the common case, kept short: one frame within the limit
        frames: list[Frame] = [head, *self._out_frames]
        self._out_frames = []
        size = sum(len(f) for f in frames)
        if size > self.max_message_bytes:
            raise ProtocolError(
                f"message of {size} bytes exceeds the limit of {self.max_message_bytes}; "
                "send large payloads by path or raise max_message_bytes on both ends"
            )
        return frames

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind not in _ALLOWED_DTYPE_KINDS:
                raise TypeError(f"arrays of dtype {obj.dtype} cannot be sent")
            # ascontiguousarray makes 0-d arrays 1-d: reshape keeps the shape sent exact.
            arr = np.ascontiguousarray(obj).reshape(obj.shape)
            meta: dict[str, Any] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
            if arr.nbytes >= self.zero_copy_bytes:
                self._out_frames.append(memoryview(arr).cast("B"))  # type: ignore[arg-type]
                meta["frame"] = len(self._out_frames)
            else:
                meta["data"] = arr.tobytes()
            return meta
        raise TypeError(f"type {type(obj).__name__} is not part of the parley protocol")

    # --- decoding -------------------------------------------------------------------

    def decode(self, frames: Sequence[Frame]) -> Envelope:
        """The envelope in ``frames``; raises ``ProtocolError`` with a reason otherwise."""
        if len(frames) != 1:
            return self._decode_frames(frames)
        # The common case, kept short: one frame, no out-of-band arrays to account for.
        head = frames[0]
        if len(head) > self.max_message_bytes:
            raise ProtocolError(
                f"message of {len(head)} bytes exceeds the limit of {self.max_message_bytes}"
            )
        if len(head) >= _CHECK_ARRAYS_BYTES and self._takes_arrays:
            self._check_arrays(head)
        try:
            envelope: Envelope = self._decode(head)
        except _DECODE_ERRORS as exc:
            raise self._refusal(head, exc) from exc
        if envelope.v != SCHEMA_VERSION:
            raise _unsupported(envelope.v)
        return envelope

    def peek(self, head: Frame) -> Peek | None:
        """The routing fields and body kind of the envelope frame ``head``, without
        building its body; ``None`` if it does not parse (:meth:`decode` says why)."""
        try:
            return _peek_decoder.decode(head)
        except _DECODE_ERRORS:
            return None

    def decode_stranger(self, frames: Sequence[Frame]) -> Envelope:
        """The envelope of a message from a connection that has not said ``Hello``.

        Only a single frame of at most :data:`STRANGER_MAX_BYTES` whose body is ``Hello``,
        ``Heartbeat`` or ``Bye`` is decoded; any other body is skipped unread (in C, no
        Python objects built). A stranger cannot make the receive loop build the objects of
        a large body: 64 MiB of MessagePack empty lists decoded to ~4.5 GB of Python lists
        and held the loop for seconds. Raises ``ProtocolError`` ``hello_required``.
        """
        size = sum(len(f) for f in frames)
        if len(frames) != 1 or size > STRANGER_MAX_BYTES:
            raise ProtocolError(
                f"a {len(frames)}-frame message of {size} bytes before Hello; until its Hello "
                f"is accepted a connection may send one frame of at most {STRANGER_MAX_BYTES} "
                "bytes",
                code="hello_required",
            )
        try:
            head = self._stranger_decoder.decode(frames[0])
        except _DECODE_ERRORS as exc:
            if isinstance(exc, RecursionError):  # (a second walk would fail alike)
                reason = f"only hello, heartbeat or bye before Hello ({_TOO_DEEP})"
                raise NestedTooDeep(reason, code="hello_required") from exc
            with contextlib.suppress(*_DECODE_ERRORS):
                version = self._version_decoder.decode(frames[0]).v  # (skips the body)
                if version != SCHEMA_VERSION:
                    raise _unsupported(version) from exc
            raise ProtocolError(
                f"only hello, heartbeat or bye before Hello ({str(exc)[:200]})",
                code="hello_required",
            ) from exc
        if head.v != SCHEMA_VERSION:
            raise _unsupported(head.v)
        return Envelope(
            body=head.body, sender=head.sender, id=head.id, expects_reply=head.expects_reply
        )

    def _decode_frames(self, frames: Sequence[Frame]) -> Envelope:
        """``decode`` for messages with array frames (or none at all)."""
        if not frames:
            raise ProtocolError("empty message: expected at least the envelope frame")
        size = sum(len(f) for f in frames)
        if size > self.max_message_bytes:
            raise ProtocolError(
                f"message of {size} bytes exceeds the limit of {self.max_message_bytes}"
            )
        head = frames[0]
        if len(head) >= _CHECK_ARRAYS_BYTES and self._takes_arrays:
            self._check_arrays(head)
        self._in_frames = frames  # read by _dec_hook for out-of-band arrays
        self._used_frames = 0
        try:
            envelope: Envelope = self._decoder.decode(head)
        except _DECODE_ERRORS as exc:
            raise self._refusal(head, exc) from exc
        finally:
            self._in_frames = ()  # do not keep large buffers alive
        if envelope.v != SCHEMA_VERSION:
            raise _unsupported(envelope.v)
        if self._used_frames != len(frames) - 1:
            raise ProtocolError(
                f"frame count mismatch: {len(frames)} frames, envelope references "
                f"{self._used_frames} array frames"
            )
        return envelope

    def _check_arrays(self, head: Frame) -> None:
        """Refuse a ``weights`` body whose array maps are not exactly what the encoder
        writes (extra keys, a long shape), before the decoder builds them as any value:
        an extra key of 8 MiB of empty lists had cost ~64x its size."""
        try:
            kind = self._kind_decoder.decode(head).body.kind
        except _DECODE_ERRORS:
            return  # (the decoder says what is wrong)
        if kind != "weights":
            return
        try:
            self._arrays_decoder.decode(head)
        except _DECODE_ERRORS as exc:
            raise ProtocolError(f"malformed array in a weights message: {exc}") from exc

    def _refusal(self, head: Frame, exc: Exception) -> ProtocolError:
        """Why ``head`` failed to decode: a kind this codec does not accept, or ``_explain``."""
        if isinstance(exc, RecursionError):
            # Every probe would walk the same nesting to the same error: each pass cost as
            # much as the decode itself, 4 passes in all.
            return NestedTooDeep()
        if self.accept is not None:
            try:
                kind = self._kind_decoder.decode(head).body.kind
            except _DECODE_ERRORS:
                kind = ""
            with contextlib.suppress(*_DECODE_ERRORS):  # (another version: say that first)
                version = self._version_decoder.decode(head).v
                if version != SCHEMA_VERSION:
                    return _unsupported(version)
            if kind in _KINDS and kind not in self.accept:
                return ProtocolError(
                    f"this endpoint does not take {kind} messages; it takes "
                    f"{', '.join(sorted(self.accept))}",
                    code="unexpected_kind",
                )
        return ProtocolError(self._explain(head, exc))

    def _explain(self, head: Frame, exc: Exception) -> str:
        """A reason for a failed decode, naming the version when that is the cause."""
        try:
            version = self._version_decoder.decode(head).v
        except _DECODE_ERRORS:
            version = SCHEMA_VERSION
        if version != SCHEMA_VERSION:
            return f"unsupported schema version {version}; this peer speaks {SCHEMA_VERSION}"
        return f"malformed message: {exc}"

    def _dec_hook(self, typ: type, obj: Any) -> Any:
        if typ is np.ndarray:
            return self._decode_array(obj)
        raise TypeError(f"unsupported type {typ!r}")

    def _decode_array(self, obj: Any) -> np.ndarray:
        if not isinstance(obj, dict):
            raise ValueError("array must be a map with dtype, shape and data or frame")
        try:
            dtype = np.dtype(obj["dtype"])
            shape = tuple(int(d) for d in obj["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad array metadata: {exc}") from exc
        if dtype.kind not in _ALLOWED_DTYPE_KINDS:
            raise ValueError(f"array dtype {dtype} is not allowed")
        if any(d < 0 for d in shape):
            raise ValueError(f"negative array dimension in {shape}")
        if "frame" in obj:
            index = obj["frame"]
            if not isinstance(index, int) or not 1 <= index < len(self._in_frames):
                raise ValueError(f"array refers to missing frame {index!r}")
            self._used_frames += 1
            buffer: Frame = self._in_frames[index]
        else:
            buffer = obj.get("data", b"")
            if not isinstance(buffer, bytes):
                raise ValueError("array data must be bytes")
        expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if len(buffer) != expected:
            raise ValueError(f"array buffer has {len(buffer)} bytes, shape needs {expected}")
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)


class Head(msgspec.Struct):
    """The envelope fields a receiver salvages from a message it cannot decode, so that it
    can still answer the request (``reply_to``) or fail the right pending request."""

    id: int = 0
    reply_to: int = 0
    expects_reply: bool = False


_head_decoder = msgspec.msgpack.Decoder(Head)

SALVAGE_STEPS = 32
"""Most MessagePack values :func:`salvage_head` walks by hand past a nesting too deep to
decode (an envelope's own fields take ~25). Walking on in Python cost ~0.15 ms per KB, ~150x
the cost of refusing a flat frame (a stranger's flood of such frames cut a live run to 1 %
of its speed), and only a hostile peer writes such a frame: parley's encoder refuses the
same depth. So an id that follows the nesting is given up, and refusal stays bounded per
byte."""


def salvage_head(frame: Frame, *, nested: bool = False) -> Head:
    """The request bookkeeping of a malformed envelope, or an empty :class:`Head`.

    Never raises. Past a map nested too deeply for the decoder, at most
    :data:`SALVAGE_STEPS` values are walked, without recursion: the fields found before the
    walk ends are kept (an empty :class:`Head` if none), so a hostile message costs bounded
    time. ``nested``: the frame is known to nest too deeply (:class:`NestedTooDeep`), so
    the decoder is not tried again (each try walks the nesting to the decoder's limit).
    """
    if nested:
        return _scan_head(frame)
    try:
        return _head_decoder.decode(frame)
    except RecursionError:
        return _scan_head(frame)
    except (msgspec.DecodeError, ValueError, TypeError):
        return Head()


# MessagePack type bytes -> (bytes of a length field or fixed payload, kind). Kinds:
# "len" a length-prefixed str/bin, "ext" length-prefixed with a type byte, "fix" a fixed
# payload, "arr"/"map" a container whose count is in the length field.
_WIDE = {
    0xC4: (1, "len"), 0xC5: (2, "len"), 0xC6: (4, "len"),  # bin
    0xD9: (1, "len"), 0xDA: (2, "len"), 0xDB: (4, "len"),  # str
    0xC7: (1, "ext"), 0xC8: (2, "ext"), 0xC9: (4, "ext"),  # ext
    0xCA: (4, "fix"), 0xCB: (8, "fix"),  # float
    0xCC: (1, "fix"), 0xCD: (2, "fix"), 0xCE: (4, "fix"), 0xCF: (8, "fix"),  # uint
    0xD0: (1, "fix"), 0xD1: (2, "fix"), 0xD2: (4, "fix"), 0xD3: (8, "fix"),  # int
    0xD4: (2, "fix"), 0xD5: (3, "fix"), 0xD6: (5, "fix"), 0xD7: (9, "fix"), 0xD8: (17, "fix"),
    0xDC: (2, "arr"), 0xDD: (4, "arr"), 0xDE: (2, "map"), 0xDF: (4, "map"),
}  # fmt: skip


class _Walk:
    """What is left of :data:`SALVAGE_STEPS` for one scan."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = SALVAGE_STEPS


def _skip(data: Frame, pos: int, walk: _Walk) -> int:
    """The position after the MessagePack value at ``pos``, walked without recursion;
    ``IndexError`` when ``walk`` runs out of steps or ``data`` ends first."""
    todo = 1  # values still to skip
    while todo:
        walk.steps -= 1
        if walk.steps < 0:
            raise IndexError("out of steps")
        todo -= 1
        t = data[pos]
        pos += 1
        if t <= 0x7F or t >= 0xE0 or t in (0xC0, 0xC2, 0xC3):
            continue  # fixint, nil, false, true
        if 0x80 <= t <= 0x8F:
            todo += 2 * (t & 0x0F)
        elif 0x90 <= t <= 0x9F:
            todo += t & 0x0F
        elif 0xA0 <= t <= 0xBF:
            pos += t & 0x1F
        else:
            width, kind = _WIDE[t]  # KeyError on 0xC1 (never used): malformed
            if kind == "fix":
                pos += width
                continue
            count = int.from_bytes(data[pos : pos + width], "big")
            pos += width
            if kind == "len":
                pos += count
            elif kind == "ext":
                pos += count + 1
            else:
                todo += count * (2 if kind == "map" else 1)
        if pos > len(data):
            raise IndexError("truncated")
    return pos


def _scan_head(data: Frame) -> Head:
    """:class:`Head` from the top-level map in ``data``, skipping every other value."""
    fields: dict[str, Any] = {}
    # Out of steps, or malformed further on: keep what was found.
    with contextlib.suppress(IndexError, KeyError, msgspec.DecodeError, RecursionError):
        _read_head_fields(data, fields, _Walk())
    try:
        return msgspec.convert(fields, Head)
    except msgspec.ValidationError:
        return Head()


def _read_head_fields(data: Frame, fields: dict[str, Any], walk: _Walk) -> None:
    t = data[0]
    if 0x80 <= t <= 0x8F:
        count, pos = t & 0x0F, 1
    elif t == 0xDE:
        count, pos = int.from_bytes(data[1:3], "big"), 3
    else:
        return
    for _ in range(count):
        key_end = _skip(data, pos, walk)
        value_end = _skip(data, key_end, walk)
        # Only string keys can name a field, and only scalars are decoded: no recursion.
        if _is_str(data[pos]) and _is_scalar(data[key_end]):
            key = msgspec.msgpack.decode(data[pos:key_end])
            if key in ("id", "reply_to", "expects_reply"):
                fields[key] = msgspec.msgpack.decode(data[key_end:value_end])
        pos = value_end


def _is_str(t: int) -> bool:
    return 0xA0 <= t <= 0xBF or t in (0xD9, 0xDA, 0xDB)


def _is_scalar(t: int) -> bool:
    """An int, bool or nil type byte (the types of :class:`Head`'s fields)."""
    return t <= 0x7F or t >= 0xE0 or t in (0xC0, 0xC2, 0xC3) or 0xCC <= t <= 0xD3
