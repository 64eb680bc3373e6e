"""parley's wire contract: typed messages, the closed msgpack codec and the ZeroMQ bus.

``protocols/PROTOCOL.md`` documents the frames for implementers in other languages.
Everything not listed here is imported by its full path (``parley.protocols.messages``).
"""

from typing import TYPE_CHECKING

from parley.protocols.lazy import lazy_exports

if TYPE_CHECKING:
    from parley.protocols.bus import BusConfig, Endpoint
    from parley.protocols.codec import Codec
    from parley.protocols.errors import (
        BusError,
        ParleyError,
        PeerDead,
        ProtocolError,
        RemoteError,
        RequestTimeout,
    )
    from parley.protocols.messages import (
        SCHEMA_VERSION,
        Action,
        Body,
        Chat,
        Envelope,
        Error,
        GenerateRequest,
        GenerateResult,
        Observation,
        Ok,
        ToolCall,
        ToolResult,
        Trajectory,
        WeightUpdate,
    )

__all__ = [
    # messages
    "SCHEMA_VERSION",
    "Envelope",
    "Body",
    "Observation",
    "Action",
    "Chat",
    "ToolCall",
    "ToolResult",
    "GenerateRequest",
    "GenerateResult",
    "Trajectory",
    "WeightUpdate",
    "Ok",
    "Error",
    # codec
    "Codec",
    # errors
    "ParleyError",
    "ProtocolError",
    "BusError",
    "RequestTimeout",
    "PeerDead",
    "RemoteError",
    # bus
    "BusConfig",
    "Endpoint",
]

_WHERE: dict[str, str] = {
    "BusConfig": "parley.protocols.bus",
    "Endpoint": "parley.protocols.bus",
    "Codec": "parley.protocols.codec",
    "BusError": "parley.protocols.errors",
    "ParleyError": "parley.protocols.errors",
    "PeerDead": "parley.protocols.errors",
    "ProtocolError": "parley.protocols.errors",
    "RemoteError": "parley.protocols.errors",
    "RequestTimeout": "parley.protocols.errors",
    "SCHEMA_VERSION": "parley.protocols.messages",
    "Action": "parley.protocols.messages",
    "Body": "parley.protocols.messages",
    "Chat": "parley.protocols.messages",
    "Envelope": "parley.protocols.messages",
    "Error": "parley.protocols.messages",
    "GenerateRequest": "parley.protocols.messages",
    "GenerateResult": "parley.protocols.messages",
    "Observation": "parley.protocols.messages",
    "Ok": "parley.protocols.messages",
    "ToolCall": "parley.protocols.messages",
    "ToolResult": "parley.protocols.messages",
    "Trajectory": "parley.protocols.messages",
    "WeightUpdate": "parley.protocols.messages",
}
"""Public name -> module; imported on first use (PEP 562), so importing this package (for
``parley --help``, ``parley list``) costs nothing until a name is used."""

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, __all__)
