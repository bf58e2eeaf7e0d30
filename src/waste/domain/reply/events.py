"""What a reply reader produces: deltas while the model talks, and the final message.

Every reader — the XTML region parser (``xtml.reply``), the chat.json reader
(``chatjson.reply``) and the raw-continuation ``TextReader`` (``reply.text``) — implements
``ReplyReader``, so the server streams any of them the same way.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs


@attrs.frozen
class ToolCall:
    """A complete tool call. ``arguments`` is the JSON string sent to the client."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@attrs.frozen(kw_only=True)
class Delta:
    """One piece of the reply. ``kind`` is ``reasoning``, ``content`` or ``tool_call``.

    Text deltas carry ``text`` (never empty, never a partial marker or partial UTF-8
    character); a ``tool_call`` delta carries the whole ``call`` and its 0-based ``index``.
    """

    kind: str
    text: str = ""
    call: ToolCall | None = None
    index: int = 0


def assistant_message(content: str, reasoning: str, calls: list[ToolCall]) -> dict[str, Any]:
    """The final OpenAI assistant message (docs/HTTP.md §3.1): ``content`` is null only when it is
    empty and calls exist; ``reasoning_content`` and ``tool_calls`` appear only when non-empty."""
    message: dict[str, Any] = {"role": "assistant", "content": None if not content and calls else content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    return message


class ReplyReader(Protocol):
    """An incremental reader of a model's reply. Never raises on malformed output."""

    def feed_token(self, token_id: int, piece: bytes | str) -> list[Delta]:
        """Feed one generated token; structure is decided only by marker ids."""
        ...

    def finish(self) -> list[Delta]:
        """End of output (end marker, cap, stop string, disconnect): flush what is sound."""
        ...

    @property
    def done(self) -> bool:
        """True once the reply has ended structurally (the server may stop generating)."""
        ...

    @property
    def reasoning_tokens(self) -> int:
        """How many fed tokens were reasoning (0 for a reader without a reasoning channel)."""
        ...
