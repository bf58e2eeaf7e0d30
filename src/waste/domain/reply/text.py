"""The raw-continuation reader for /v1/completions: every generated piece is content."""

from __future__ import annotations

import codecs

import attrs

from waste.domain.reply.events import Delta


@attrs.define(kw_only=True)
class TextReader:
    """The raw-continuation reader for /v1/completions: every piece is content.

    Stop ids never reach the text; other special tokens are written as their text.
    """

    stop_ids: frozenset[int] = frozenset()
    _decoder: codecs.IncrementalDecoder = attrs.field(
        factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    done: bool = False
    reasoning: str = ""
    tool_calls: tuple[object, ...] = ()
    reasoning_tokens: int = 0

    def feed_token(self, token_id: int, piece: bytes | str) -> list[Delta]:
        if self.done:
            return []
        if token_id in self.stop_ids:
            self.done = True
            return self.finish()
        text = piece if isinstance(piece, str) else self._decoder.decode(piece)
        return [Delta(kind="content", text=text)] if text else []

    def finish(self) -> list[Delta]:
        text = self._decoder.decode(b"", final=True)
        return [Delta(kind="content", text=text)] if text else []
