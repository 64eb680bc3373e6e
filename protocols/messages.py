"""Every message that crosses the parley bus, as typed ``msgspec.Struct`` values.

A frame on the wire is one MessagePack map, an :class:`Envelope`, whose ``body`` is one
of the body structs below. The body carries its own kind in the field ``"kind"`` (a
msgspec tagged union), so a receiver in any language dispatches on ``body["kind"]``.
``protocols/PROTOCOL.md`` documents every field for implementers in other languages.

Versioning: ``Envelope.v`` is :data:`SCHEMA_VERSION`. A receiver that does not speak the
sender's version answers with an :class:`Error` of code ``"unsupported_version"``.
Fields equal to their default are left out on the wire (``omit_defaults``) and read back as
the default; ``v`` therefore travels only when it is not 1, the default forever.
Adding an optional field keeps the version; renaming, removing or retyping one bumps it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import numpy as np

__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "ActionBatch",
    "Body",
    "Bye",
    "Chat",
    "Completion",
    "Constraint",
    "Envelope",
    "Error",
    "GenerateRequest",
    "GenerateResult",
    "Heartbeat",
    "Hello",
    "Observation",
    "ObservationBatch",
    "Ok",
    "SamplingParams",
    "ScoreRequest",
    "ScoreResult",
    "Subscribe",
    "TokenRecord",
    "ToolCall",
    "ToolResult",
    "Trajectory",
    "TurnRecord",
    "WeightUpdate",
    "BODY_KINDS",
    "BODY_TYPES",
    "MAX_LIST_ITEMS",
]

SCHEMA_VERSION = 1
"""Wire schema version carried in every envelope (``Envelope.v``)."""

FinishReason = Literal["stop", "length", "abort", "error"]

MAX_LIST_ITEMS = 4096
"""Most entries of a list of names or texts (``Envelope.to``, ``Chat.to``, ``Hello`` and
``Subscribe`` prefixes, ``SamplingParams.stop``); ``Constraint.choices`` may hold 65,536.
The receiver refuses a longer list before decoding its entries: a short string costs ~20x
its wire size in Python, and these lists have no use for more."""

_Texts = Annotated[list[str], msgspec.Meta(max_length=MAX_LIST_ITEMS)]
_TokenIds = list[Annotated[int, msgspec.Meta(ge=0)]]
"""Token ids are never negative: a negative one (outside CPython's cached small ints) cost
~40x its wire byte once decoded."""
_Choices = Annotated[list[str], msgspec.Meta(max_length=65_536)]


class Body(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=True):
    """Base of every message body; the subclass ``tag`` is its kind on the wire."""


# --- session --------------------------------------------------------------------------


class Hello(Body, tag="hello"):
    """First message of a peer on a connection: who it is and what it speaks.

    The bound side answers with its own ``Hello``; either side refuses a peer whose
    ``schemas`` does not contain its version with an :class:`Error`. ``subscriptions``
    lists the broadcast channel prefixes the sender wants forwarded (see :class:`Subscribe`).
    """

    name: str
    role: str = "peer"
    schemas: Annotated[list[int], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=lambda: [SCHEMA_VERSION]
    )
    heartbeat_interval: float = 1.0
    subscriptions: _Texts = msgspec.field(default_factory=list)
    meta: Annotated[dict[str, str], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=dict
    )


class Heartbeat(Body, tag="heartbeat"):
    """Liveness signal, sent every ``heartbeat_interval`` seconds by each side."""

    seq: int = 0


class Bye(Body, tag="bye"):
    """Orderly goodbye: the receiver fails the sender's pending requests at once."""

    reason: str = ""


class Subscribe(Body, tag="subscribe"):
    """Ask the receiver to forward broadcasts whose channel starts with one of ``channels``.

    ``unsubscribe`` true withdraws them instead. Sent as a request; the reply is ``Ok``.
    """

    channels: _Texts
    unsubscribe: bool = False


class Ok(Body, tag="ok"):
    """Empty success reply to a request that returns nothing."""


class Error(Body, tag="error"):
    """A failure, as a reply to a request (``reply_to`` set) or unsolicited.

    ``code`` is machine-readable (``timeout``, ``peer_dead``, ``bad_message``,
    ``unsupported_version``, ``no_handler``, ``handler_failed``, ``overloaded``,
    ``cancelled``, ...); ``message`` says what happened and what to do next.
    """

    code: str
    message: str
    retryable: bool = False


# --- arena <-> agent ------------------------------------------------------------------


class TokenRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Exactly what a model generated for one action, kept for training."""

    policy: str
    policy_version: int
    prompt_token_ids: _TokenIds
    token_ids: _TokenIds
    logprobs: list[float]
    finish_reason: FinishReason = "stop"


class Observation(Body, tag="observation"):
    """What one agent sees before it acts; a request whose reply is an :class:`Action`."""

    agent: str
    text: str
    scenario: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = msgspec.field(default_factory=dict)


class Action(Body, tag="action"):
    """An agent's move: free text that the scenario parses; ``tokens`` if a model made it."""

    agent: str
    text: str
    tokens: list[TokenRecord] = msgspec.field(default_factory=list)


class ObservationBatch(Body, tag="observations"):
    """Several :class:`Observation` requests in one message, for the seats one agent process
    hosts, across the episodes in flight (opt-in: ``RunConfig.batch_frames``); a request
    answered with an :class:`ActionBatch` of as many results, in the same order.
    ``episodes[i]`` is the episode of ``observations[i]`` (what ``Envelope.episode`` says of a
    single observation)."""

    observations: Annotated[list[Observation], msgspec.Meta(max_length=MAX_LIST_ITEMS)]
    episodes: _Texts
    timeout: float = 0.0
    """Seconds the arena waits for the reply (0: no bound); answer by then, with an
    ``Error`` of code ``timeout`` for each observation still unanswered."""


class ActionBatch(Body, tag="actions"):
    """The reply to an :class:`ObservationBatch`: ``results[i]`` answers its observation
    ``i``, an :class:`Action`, or the :class:`Error` a single observation would have got."""

    results: Annotated[list[Action | Error], msgspec.Meta(max_length=MAX_LIST_ITEMS)]


class Chat(Body, tag="chat"):
    """An agent-to-agent message: ``to`` empty means the public channel."""

    sender: str
    text: str
    to: _Texts = msgspec.field(default_factory=list)
    channel: Literal["public", "private"] = "public"


class ToolCall(Body, tag="tool_call"):
    """A call of a named tool with JSON-encoded arguments."""

    call_id: str
    name: str
    arguments: str = "{}"


class ToolResult(Body, tag="tool_result"):
    """The result of a :class:`ToolCall`; ``error`` set (and ``content`` empty) on failure."""

    call_id: str
    name: str
    content: str = ""
    error: str = ""


# --- agents <-> inference pool --------------------------------------------------------


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Per-request sampling options (the OpenAI / vLLM meaning of each field)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: _Texts = msgspec.field(default_factory=list)
    n: int = 1
    seed: int | None = None
    logprobs: bool = True
    top_logprobs: int = 0
    """Most likely alternatives to record per generated token (0-20; needs ``logprobs``)."""


class Constraint(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Restricts what the model may generate (structured output).

    ``type`` is ``"choice"`` (``choices``), ``"regex"`` (``pattern``) or ``"json"``
    (``json_schema``, a JSON Schema as a JSON string).
    """

    type: Literal["choice", "regex", "json"]
    choices: _Choices = msgspec.field(default_factory=list)
    pattern: str = ""
    json_schema: str = ""


class GenerateRequest(Body, tag="generate"):
    """Ask the pool for completions; ``prompt`` text or ``prompt_token_ids`` (ids win)."""

    policy: str = "default"
    prompt: str = ""
    prompt_token_ids: _TokenIds = msgspec.field(default_factory=list)
    params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    constraint: Constraint | None = None
    timeout: float = 0.0


class Completion(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One sampled continuation."""

    text: str
    token_ids: _TokenIds
    logprobs: list[float] = msgspec.field(default_factory=list)
    finish_reason: FinishReason = "stop"
    top_token_ids: list[list[int]] = msgspec.field(default_factory=list)
    """Per generated token (when ``params.top_logprobs`` > 0): the most likely tokens of the
    distribution it was drawn from, most likely first (fewer when fewer have probability > 0)."""
    top_logprobs: list[list[float]] = msgspec.field(default_factory=list)
    """The log-probabilities of ``top_token_ids``, parallel to it."""


class GenerateResult(Body, tag="generated"):
    """Reply to :class:`GenerateRequest`: ``n`` completions and the policy version used."""

    policy: str
    policy_version: int
    prompt_token_ids: _TokenIds
    completions: list[Completion]


class WeightUpdate(Body, tag="weights"):
    """Tell a pool that ``policy`` has new weights: from ``path`` or inline ``tensors``."""

    policy: str
    version: int
    path: str = ""
    tensors: dict[str, np.ndarray] = msgspec.field(default_factory=dict)


class ScoreRequest(Body, tag="score"):
    """Ask the pool's reward model ``model`` for a score of ``prompt + text`` per text (the
    sequence a TRL reward model scores); the reply is a :class:`ScoreResult`."""

    texts: _Texts
    model: str = "default"
    prompt: str = ""
    timeout: float = 0.0


class ScoreResult(Body, tag="scored"):
    """Reply to :class:`ScoreRequest`: one score per text, in order, and the version of the
    reward model's weights that gave them."""

    model: str
    scores: list[float]
    version: int = 0


# --- arena -> trainer -----------------------------------------------------------------


class TurnRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One decision of one agent: what it saw, what it did, what it got."""

    turn: int
    observation: str
    action: str
    reward: float = 0.0
    tokens: list[TokenRecord] = msgspec.field(default_factory=list)
    invalid: str = ""


class Trajectory(Body, tag="trajectory"):
    """One agent's whole episode; ``failed`` holds the reason when it did not finish."""

    episode: str
    scenario: str
    agent: str
    seed: int | None = None
    turns: list[TurnRecord] = msgspec.field(default_factory=list)
    reward: float = 0.0
    components: dict[str, float] = msgspec.field(default_factory=dict)
    failed: str = ""


BODY_TYPES: tuple[type[Body], ...] = (
    Hello,
    Heartbeat,
    Bye,
    Subscribe,
    Ok,
    Error,
    Observation,
    Action,
    Chat,
    ToolCall,
    ToolResult,
    GenerateRequest,
    GenerateResult,
    WeightUpdate,
    Trajectory,
    ScoreRequest,
    ScoreResult,
    ObservationBatch,
    ActionBatch,
)
"""Every body kind the codec accepts, in a fixed order."""

AnyBody = (
    Hello
    | Heartbeat
    | Bye
    | Subscribe
    | Ok
    | Error
    | Observation
    | Action
    | Chat
    | ToolCall
    | ToolResult
    | GenerateRequest
    | GenerateResult
    | WeightUpdate
    | Trajectory
    | ScoreRequest
    | ScoreResult
    | ObservationBatch
    | ActionBatch
)


class Envelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The routing header around every body.

    ``id`` is unique per sender; a reply carries the request's id in ``reply_to``.
    ``to`` names recipients (empty: the peer at the other end of the socket);
    ``channel`` names a broadcast topic instead. ``episode`` and ``turn`` let a receiver
    file the message without looking into the body.
    """

    body: AnyBody
    sender: str = ""
    id: int = 0
    reply_to: int = 0
    expects_reply: bool = False
    to: _Texts = msgspec.field(default_factory=list)
    channel: str = ""
    episode: str = ""
    turn: int = 0
    v: int = SCHEMA_VERSION

    @property
    def kind(self) -> str:
        """The body's kind, as on the wire."""
        return kind_of(self.body)


def kind_of(body: Body | type[Body]) -> str:
    """The wire tag of a body struct (or of a body struct type)."""
    tag = body.__struct_config__.tag
    return str(tag)


BODY_KINDS: frozenset[str] = frozenset(kind_of(t) for t in BODY_TYPES)
"""The wire tag of every body kind (what ``BusConfig.accept`` may name)."""
