"""The chat format a container is served with: one Protocol, three implementations.

XTML (``xtml.format``), a chat.json (``chatjson.format``) and none (``NoFormat`` here) each
state what they can express, refuse what they cannot, and turn a request into a ``ChatPlan``
(segments, stop ids, a reply reader). ``format_choice.select_chat_format`` picks one at load.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import attrs

from waste.domain.errors import DomainError
from waste.domain.reply.events import ReplyReader
from waste.domain.reply.tool_grammar import ToolGrammar
from waste.domain.requests.parse import ChatRequest
from waste.domain.segments import Segment


class NoChatFormat(DomainError):
    """The container has no usable chat format; only /v1/completions can serve it."""


@attrs.frozen(kw_only=True)
class Capabilities:
    """What a format can express, as /v1/models reports it."""

    reasoning: bool
    tools: bool
    images: bool


@attrs.frozen(kw_only=True)
class ChatPlan:
    """Everything a chat request needs from the domain before the engine runs."""

    segments: tuple[Segment, ...]
    stop_ids: tuple[int, ...]
    thinking: bool
    new_reader: Callable[[], ReplyReader]
    #: markup that closes the answer and the message (a response_format grammar ends with
    #: it, forced); empty: the first stop id does
    answer_end: str = ""
    #: with tools declared (tool_choice not none): the grammar of the whole reply, which
    #: replaces the answer-only one (docs/DECISIONS.md, tool-call constraints)
    reply_grammar: ToolGrammar | None = None


class ChatFormat(Protocol):
    """A chat format resolved against the served vocabulary. Pure: no I/O, no engine calls."""

    @property
    def name(self) -> str | None:
        """``"xtml"``, ``"chat.json"``, or None when the container has no usable format."""
        ...

    @property
    def error(self) -> str | None:
        """Why there is no usable format (None when there is one)."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        ...

    @property
    def end_ids(self) -> tuple[int, ...]:
        """The ids that end a generated message: /v1/completions stops on them too."""
        ...

    def require_usable(self) -> None:
        """docs/HTTP.md §2.1 step 6. Raises NoChatFormat (the held error) when unusable."""
        ...

    def check_request(self, request: ChatRequest) -> None:
        """Refuse what the format cannot express (docs/HTTP.md §2.1 step 8), before any image
        is decoded.

        Raises:
            NoChatFormat: the container has no chat format.
            ChatFormatError: ``unsupported_by_format``, naming the field that asked.
        """
        ...

    def plan(self, request: ChatRequest, *, default_thinking: bool,
             image_sizes: Sequence[tuple[int, int]] = ()) -> ChatPlan:
        """Render ``request`` (already checked by ``check_request``) into a prompt plan.

        Args:
            request: a validated chat request.
            default_thinking: the server default (False with ``--no-thinking``).
            image_sizes: (width, height) of each decoded image, in message order.

        Raises:
            ChatFormatError, XTMLError, KimiToolError: what rendering refuses.
        """
        ...

    def startup_warnings(self, *, default_thinking: bool) -> tuple[str, ...]:
        """What the server should say at load about serving with this format."""
        ...


@attrs.frozen
class NoFormat:
    """The container has no usable chat format: every chat request is refused with ``error``."""

    error: str
    name: None = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(reasoning=False, tools=False, images=False)

    @property
    def end_ids(self) -> tuple[int, ...]:
        return ()

    def require_usable(self) -> None:
        raise NoChatFormat(f"This model has no usable chat format ({self.error}). "
                           "Use /v1/completions for raw continuation.")

    def check_request(self, request: ChatRequest) -> None:
        self.require_usable()

    def plan(self, request: ChatRequest, *, default_thinking: bool,
             image_sizes: Sequence[tuple[int, int]] = ()) -> ChatPlan:
        self.require_usable()
        raise AssertionError("unreachable: require_usable always raises")

    def startup_warnings(self, *, default_thinking: bool) -> tuple[str, ...]:
        return ()
