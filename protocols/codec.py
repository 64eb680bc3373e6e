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

from collections.abc import Sequence
from typing import Any, TypeAlias

import msgspec
import numpy as np

from parley.protocols.errors import ProtocolError
from parley.protocols.messages import SCHEMA_VERSION, Envelope

__all__ = ["Codec", "Frame", "DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_ZERO_COPY_BYTES"]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest accepted message (all frames together); larger ones are refused both ways."""

DEFAULT_ZERO_COPY_BYTES = 64 * 1024
"""Arrays at least this large travel as their own frame, without a copy."""

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


class Codec:
    """Encodes envelopes into frames and decodes frames back, enforcing size limits."""

    def __init__(
        self,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        zero_copy_bytes: int = DEFAULT_ZERO_COPY_BYTES,
    ) -> None:
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
        self.max_message_bytes = max_message_bytes
        self.zero_copy_bytes = zero_copy_bytes
        self._out_frames: list[Frame] = []
        self._in_frames: Sequence[Frame] = ()
        self._used_frames = 0
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._decoder = msgspec.msgpack.Decoder(Envelope, dec_hook=self._dec_hook)
        self._version_decoder = msgspec.msgpack.Decoder(_Version)
        # Bound once: the per-message path is short enough for attribute lookups to show.
        self._encode = self._encoder.encode
        self._decode = self._decoder.decode

    # --- encoding -------------------------------------------------------------------

    def encode(self, envelope: Envelope) -> list[Frame]:
        """Frames for ``envelope``; raises ``ProtocolError`` if it cannot be sent."""
        try:
            head = self._encode(envelope)
        except (TypeError, ValueError, OverflowError) as exc:
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
        try:
            envelope: Envelope = self._decode(head)
        except (msgspec.DecodeError, ValueError, TypeError) as exc:
            raise ProtocolError(self._explain(head, exc)) from exc
        if envelope.v != SCHEMA_VERSION:
            raise _unsupported(envelope.v)
        return envelope

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
        self._in_frames = frames  # read by _dec_hook for out-of-band arrays
        self._used_frames = 0
        try:
            envelope: Envelope = self._decoder.decode(head)
        except (msgspec.DecodeError, ValueError, TypeError) as exc:
            raise ProtocolError(self._explain(head, exc)) from exc
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

    def _explain(self, head: Frame, exc: Exception) -> str:
        """A reason for a failed decode, naming the version when that is the cause."""
        try:
            version = self._version_decoder.decode(head).v
        except (msgspec.DecodeError, ValueError, TypeError):
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
