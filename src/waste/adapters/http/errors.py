"""The one table from exception types to HTTP errors, and the OpenAI error envelope.

Domain errors carry no status; this module is the only place one is chosen (docs/HTTP.md §5).
"""

from __future__ import annotations

from typing import cast

import attrs

from waste.domain.ports import EngineError, EngineUnavailable
from waste.domain.errors import (ChatFormatError, ContextLengthExceeded, InvalidRequest,
                                 KimiToolError, XTMLError)
from waste.domain.chat_format import NoChatFormat
from waste.service import EngineLoadFailed, EngineLoading, QueueFull, ShuttingDown

INVALID = "invalid_request_error"
UNAVAILABLE = "unavailable_error"


@attrs.frozen
class ApiError(Exception):
    """An error answer decided at the HTTP edge (routing, auth, transport limits)."""

    status: int
    code: str
    message: str
    type: str = INVALID
    param: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


# exception type -> (status, OpenAI type, code or None to take the exception's own code,
#                    extra headers)
_TABLE: list[tuple[type, int, str, str | None, tuple[tuple[str, str], ...]]] = [
    (InvalidRequest, 400, INVALID, None, ()),
    (XTMLError, 400, INVALID, "invalid_value", ()),
    (KimiToolError, 400, INVALID, "invalid_value", ()),
    (ChatFormatError, 400, INVALID, "unsupported_by_format", ()),
    (NoChatFormat, 400, INVALID, "unsupported_chat_format", ()),
    (ContextLengthExceeded, 400, INVALID, "context_length_exceeded", ()),
    (EngineUnavailable, 502, "engine_error", "upstream_error", ()),
    (EngineError, 500, "engine_error", "engine_error", ()),
    (EngineLoadFailed, 500, "engine_error", "engine_error", ()),
    (EngineLoading, 503, UNAVAILABLE, "engine_loading", (("Retry-After", "5"),)),
    (QueueFull, 503, UNAVAILABLE, "queue_full", (("Retry-After", "30"),)),
    (ShuttingDown, 503, UNAVAILABLE, "shutting_down", (("Retry-After", "5"),)),
]

_MESSAGES: dict[type, str] = {
    EngineLoading: "The model is still loading; retry shortly.",
    QueueFull: "Too many requests are waiting for the engine; retry later.",
    ShuttingDown: "The server is shutting down.",
}


def to_api_error(exc: BaseException) -> ApiError:
    """Map any exception to the error the client sees. Unknown faults never leak a traceback."""
    if isinstance(exc, ApiError):
        return exc
    for kind, status, type_, code, headers in _TABLE:
        if isinstance(exc, kind):
            param = getattr(exc, "param", None)
            if kind is XTMLError or kind is KimiToolError:
                param = param or "messages"
            if kind is NoChatFormat:
                param = None
            message = _MESSAGES.get(kind) or _engine_message(exc) or str(exc)
            own = code if code is not None else cast(InvalidRequest, exc).code  # the one None row
            return ApiError(status, own, message, type_, param, headers)
    return ApiError(500, "internal_error", "The server hit an internal error.", "server_error")


def _engine_message(exc: BaseException) -> str | None:
    if isinstance(exc, EngineError):
        return f"The engine failed ({exc.code}): {exc.detail}"
    if isinstance(exc, EngineLoadFailed):
        cause = exc.cause
        why = f"{cause.code}: {cause.detail}" if isinstance(cause, EngineError) else str(cause)
        return f"The engine failed to load ({why}); this server cannot generate. Fix the " \
               "container or the flags and restart it."
    return None


def envelope(err: ApiError) -> dict:
    """The OpenAI error object (``code`` is always a string)."""
    return {"error": {"message": err.message, "type": err.type, "param": err.param,
                      "code": err.code}}
