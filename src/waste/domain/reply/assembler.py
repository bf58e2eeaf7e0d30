"""Turning generated tokens into a reply: reader, stop strings, logprobs and finish reason.

``ReplyAssembler`` runs inside the engine's token callback, so a stop string or the end of
the message stops generation at the very token that decided it. It is pure: events in,
output pieces and a stop decision out.
"""

from __future__ import annotations

from typing import Any

import attrs

from waste.domain.ports import TokenEvent
from waste.domain.reply.events import Delta, ReplyReader, ToolCall, assistant_message
from waste.domain.reply.stop_strings import ContentPiece, StopStringFilter


@attrs.frozen(kw_only=True)
class Output:
    """One piece for the client: ``reasoning`` / ``content`` text, or a ``tool_call``.

    Content carries its logprob attribution: one ``ContentPiece`` per token that added text.
    """

    kind: str
    text: str = ""
    pieces: tuple[ContentPiece, ...] = ()
    call: ToolCall | None = None
    index: int = 0


@attrs.define(kw_only=True)
class ReplyAssembler:
    """Feeds token events to a reader and a stop-string filter; decides when to stop."""

    reader: ReplyReader
    stop_filter: StopStringFilter
    completion_tokens: int = 0
    content: list[str] = attrs.field(factory=list)
    content_pieces: list[ContentPiece] = attrs.field(factory=list)
    calls: list[ToolCall] = attrs.field(factory=list)
    reasoning: list[str] = attrs.field(factory=list)
    finished: bool = False

    @classmethod
    def create(cls, reader: ReplyReader, stops: tuple[str, ...] = ()) -> "ReplyAssembler":
        return cls(reader=reader, stop_filter=StopStringFilter(tuple(stops)))

    @property
    def should_stop(self) -> bool:
        """True once the reply is over: a stop string matched or the message ended."""
        return self.stop_filter.matched is not None or self.reader.done

    def on_token(self, event: TokenEvent) -> list[Output]:
        """Account one sampled token and return what it released."""
        self.completion_tokens += 1
        if self.should_stop:
            return []
        return self._route(self.reader.feed_token(event.token, event.piece), event.logprob)

    def finish(self) -> list[Output]:
        """End of generation: flush the reader, then whatever the stop filter holds."""
        if self.finished:
            return []
        self.finished = True
        out = self._route(self.reader.finish(), None) if self.stop_filter.matched is None else []
        released = self.stop_filter.flush()
        if released:
            out.append(self._content_output(released))
        return out

    def finish_reason(self, engine_stop_reason: str) -> str:
        """docs/HTTP.md §3.2: tool_calls, else stop, else length."""
        if self.calls:
            return "tool_calls"
        if self.stop_filter.matched is not None or self.reader.done or engine_stop_reason == "token":
            return "stop"
        if engine_stop_reason in ("max_tokens", "ctx_full"):
            return "length"
        return "stop"

    def message(self) -> dict[str, Any]:
        """The final OpenAI assistant message (docs/HTTP.md §3.1), content cut at a stop string."""
        return assistant_message("".join(self.content), "".join(self.reasoning), self.calls)

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def reasoning_tokens(self) -> int:
        return self.reader.reasoning_tokens

    def _route(self, deltas: list[Delta], logprob: float | None) -> list[Output]:
        out: list[Output] = []
        content = "".join(d.text for d in deltas if d.kind == "content")
        for delta in deltas:
            if delta.kind == "reasoning":
                self.reasoning.append(delta.text)
                out.append(Output(kind="reasoning", text=delta.text))
            elif delta.kind == "tool_call" and delta.call is not None:
                self.calls.append(delta.call)
                out.append(Output(kind="tool_call", call=delta.call, index=len(self.calls) - 1))
            elif delta.kind == "content" and content:
                # All of a token's content becomes one piece, so one logprob entry per token.
                released = self.stop_filter.push(ContentPiece(content, logprob))
                content = ""
                if released:
                    out.append(self._content_output(released))
        return out

    def _content_output(self, pieces: list[ContentPiece]) -> Output:
        for piece in pieces:
            if piece.logprob is None and self.content_pieces:
                last = self.content_pieces[-1]
                self.content_pieces[-1] = ContentPiece(last.text + piece.text, last.logprob)
            else:
                self.content_pieces.append(piece)
        text = "".join(p.text for p in pieces)
        self.content.append(text)
        return Output(kind="content", text=text, pieces=tuple(pieces))
