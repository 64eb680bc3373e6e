"""parley's wire contract: typed messages, the closed msgpack codec and the ZeroMQ bus.

``protocols/PROTOCOL.md`` documents the frames for implementers in other languages.
Everything not listed here is imported by its full path (``parley.protocols.messages``).
"""

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
