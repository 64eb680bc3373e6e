"""The errors inference backends raise (kept apart so that ``base``, ``limits`` and
``constraints`` need not import each other)."""

from __future__ import annotations

from parley.protocols.errors import ParleyError

__all__ = ["BackendError", "RequestError", "ConstraintError"]


class BackendError(ParleyError):
    """An inference backend could not serve a request (bad request, server error, ...).

    ``retryable`` is True when the same request may succeed later (overload, a transient
    server error), False when the request itself must change.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class RequestError(BackendError):
    """A request field is out of range or malformed; ``field`` names it (``"seed"``,
    ``"stop"``, ``"constraint"``, ...) and the message gives the allowed range."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ConstraintError(RequestError):
    """A constraint that cannot be used, refused before any token is generated.

    ``reason`` is ``"invalid"`` (malformed or unsupported), ``"unsatisfiable"`` (no text,
    or no token of the model's vocabulary, can start a match) or ``"too_costly"`` (over the
    matching engine's work limits, :data:`MATCHER_LIMITS`). The field is ``"constraint"``:
    the client must change its constraint (an HTTP 400 naming it, never a 5xx)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__("constraint", message)
        self.reason = reason
