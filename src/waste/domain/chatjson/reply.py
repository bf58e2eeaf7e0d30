"""The chat.json reply reader: splits reasoning from content and reads K2 tool calls.

Structure comes only from token ids (the think markers, the stop ids, the five K2 tool
markers); every other token is text. The twin of the XTML region parser, with the same
``ReplyReader`` surface, so the server streams either the same way.
"""

from __future__ import annotations

import codecs
from typing import Any

import attrs

from waste.domain.chatjson.glmtools import GlmCallReader
from waste.domain.chatjson.k2tools import CallSectionReader
from waste.domain.reply.events import Delta, ToolCall, assistant_message

REASONING, CONTENT = "reasoning", "content"


def _utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


@attrs.define(kw_only=True)
class ChatReplyReader:
    """An incremental reader of one generated chat.json turn. Never raises on model output.

    Build it with ``ChatFormat.reply_reader``. Reasoning starts at once when the prompt left
    the channel open, or when the model opens it itself before any content; it ends at the
    close marker. Other special tokens carry no text and are dropped, so no marker ever
    reaches a delta. A run of whitespace-only content is held until it is followed by text
    (then it is kept, never stripped) or by structure (then it is dropped, as between XTML
    regions); at the end it is kept unless calls were made.
    """

    stop_ids: frozenset[int]
    n_base_vocab: int
    think_ids: tuple[int, int] | None
    starts_in_reasoning: bool
    calls: CallSectionReader | GlmCallReader | None
    reasoning_tokens: int = 0
    _state: str = attrs.field(init=False)
    _done: bool = attrs.field(default=False, init=False)
    _ended: bool = attrs.field(default=False, init=False)
    _decoder: codecs.IncrementalDecoder = attrs.field(factory=_utf8_decoder, init=False)
    _reasoning: list[str] = attrs.field(factory=list, init=False)
    _content: list[str] = attrs.field(factory=list, init=False)
    _held: str = attrs.field(default="", init=False)
    _calls: list[ToolCall] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        self._state = REASONING if self.starts_in_reasoning else CONTENT

    # -- the ReplyReader surface -------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once a stop id arrived: the turn is over and generation may stop."""
        return self._done

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return list(self._calls)

    def message(self) -> dict[str, Any]:
        """The OpenAI assistant message (``replies.assistant_message``)."""
        return assistant_message(self.content, self.reasoning, self._calls)

    @property
    def in_answer(self) -> bool:
        """In the content channel, outside any tool-call section."""
        return self._state == CONTENT and not self._in_calls and not self.done

    def feed_token(self, token_id: int, piece: bytes | str) -> list[Delta]:
        """Feed one generated token. ``piece`` may be a fragment of a UTF-8 character."""
        out: list[Delta] = []
        if self._ended:
            return out
        if token_id in self.stop_ids:
            self._done = True
            self._end(out)
        elif self.calls is not None and self.calls.is_marker(token_id):
            self._tool_marker(token_id, out)
        elif self.think_ids is not None and token_id in self.think_ids:
            self._think_marker(token_id, out)
        elif token_id < self.n_base_vocab:
            if self._state == REASONING and not self._in_calls:
                self.reasoning_tokens += 1
            if isinstance(piece, str):
                self._flush_decoder(out)
                self._route(piece, out)
            else:
                self._route(self._decoder.decode(piece), out)
        return out

    def finish(self) -> list[Delta]:
        """End of output (stop id, cap, stop string, disconnect): flush what is sound.

        An incomplete UTF-8 tail becomes U+FFFD; an unfinished call is dropped.
        """
        out: list[Delta] = []
        if not self._ended:
            self._end(out)
        return out

    # -- structure ---------------------------------------------------------------------------

    @property
    def _in_calls(self) -> bool:
        return self.calls is not None and self.calls.active

    def _at_start(self) -> bool:
        return not (self._content or self._reasoning or self._calls or self._in_calls)

    def _tool_marker(self, token_id: int, out: list[Delta]) -> None:
        assert self.calls is not None
        self._flush_decoder(out)
        if not self._in_calls and not self._content:
            self._held = ""  # whitespace before a call section is not an answer
        self._state = CONTENT  # a call section ends the reasoning channel
        for outcome in self.calls.feed_marker(token_id):
            if isinstance(outcome, ToolCall):
                out.append(Delta(kind="tool_call", call=outcome, index=len(self._calls)))
                self._calls.append(outcome)
            else:
                self._emit_content(outcome, out)

    def _think_marker(self, token_id: int, out: list[Delta]) -> None:
        assert self.think_ids is not None
        think_open, think_close = self.think_ids
        self._flush_decoder(out)
        if token_id == think_open and self._state == CONTENT and self._at_start():
            self._held = ""
            self._state = REASONING
        elif token_id == think_close and self._state == REASONING and not self._in_calls:
            self._state = CONTENT
        # Any other think marker is out of place: dropped, the state unchanged.

    def _end(self, out: list[Delta]) -> None:
        self._flush_decoder(out)
        if self.calls is not None:
            self.calls.finish()
        if self._held and not self._calls:
            held, self._held = self._held, ""
            self._content.append(held)
            out.append(Delta(kind=CONTENT, text=held))
        self._ended = True

    # -- text --------------------------------------------------------------------------------

    def _flush_decoder(self, out: list[Delta]) -> None:
        self._route(self._decoder.decode(b"", final=True), out)
        self._decoder.reset()

    def _route(self, text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self._in_calls:
            assert self.calls is not None
            self.calls.feed_text(text)
        elif self._state == REASONING:
            self._reasoning.append(text)
            out.append(Delta(kind=REASONING, text=text))
        else:
            self._emit_content(text, out)

    def _emit_content(self, text: str, out: list[Delta]) -> None:
        if not self._content and (self._held + text).isspace():
            self._held += text
            return
        text, self._held = self._held + text, ""
        self._content.append(text)
        out.append(Delta(kind=CONTENT, text=text))
