"""The domain error family. No HTTP status lives here: the HTTP adapter maps each type once."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error the domain raises on bad input."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


class InvalidRequest(DomainError):
    """A request body field is missing, mistyped, out of range or not implemented.

    ``code`` is one of the OpenAI-style codes of docs/HTTP.md §2.1/§5 (``invalid_value``,
    ``invalid_type``, ``missing_required_parameter``, ``unsupported_value``, or an image code
    such as ``invalid_image``); ``param`` is the exact path, e.g. ``messages[0].content[1].text``.
    """

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message, param)
        self.code = code


class XTMLError(DomainError):
    """The K3 renderer refused, where upstream's encoder raises.

    ``kind`` is upstream's exception class name (``ValueError``, ``TypeError``, ``KeyError``,
    ``AssertionError``); ``str(err)`` is upstream's message text.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message, "messages")
        self.kind = kind


class ChatFormatError(DomainError):
    """A chat.json is unusable, or a request asks for what the chat format cannot express.

    At load, the message names the key and the offending string. At request time ``param``
    names the field that asked (HTTP ``unsupported_by_format``).
    """


class KimiToolError(DomainError):
    """A Kimi K2 tool call is malformed (arguments that are not a JSON object, a bad id)."""


class ContextLengthExceeded(DomainError):
    """The prompt does not fit the context: ``prompt_tokens`` >= ``ctx_tokens``."""

    def __init__(self, prompt_tokens: int, ctx_tokens: int, param: str = "messages") -> None:
        super().__init__(
            f"This model's context is {ctx_tokens} tokens, but the prompt is {prompt_tokens} tokens;"
            " shorten the prompt or start the server with a larger --ctx.",
            param,
        )
        self.prompt_tokens = prompt_tokens
        self.ctx_tokens = ctx_tokens
