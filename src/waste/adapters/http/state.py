"""The server's shared state: the engine host, the chat format chosen at load, the metrics."""

from __future__ import annotations

import time
from typing import Sequence

import attrs
import trio

from waste.adapters.engine_host import EngineHost, EngineLoading
from waste.adapters.http.config import HttpConfig
from waste.adapters.metrics import Metrics
from waste.domain.chatfmt import ChatFormatSelection, select_chat_format
from waste.domain.engine import ModelInfo
from waste.domain.segments import Segment


@attrs.define(eq=False)
class ServerState:
    config: HttpConfig
    host: EngineHost
    metrics: Metrics = attrs.field(factory=Metrics)
    started: float = attrs.field(factory=time.monotonic)
    selection: ChatFormatSelection | None = None
    info: ModelInfo | None = None
    completed_requests: int = 0

    def on_loaded(self) -> None:
        """Resolve the chat format once the engine is open (never raises: held errors)."""
        engine, tokenizer = self.host.engine, self.host.tokenizer
        self.info = engine.model_info()
        try:
            template = engine.chat_template()
        except Exception as exc:  # an unreadable chat.json is a held error, not a crash
            self.selection = ChatFormatSelection(kind=None, error=f"chat.json unreadable: {exc}")
            return
        self.selection = select_chat_format(
            tokenizer, template, image_placeholder_id=self.info.media_placeholder_id)

    def require_loaded(self) -> ModelInfo:
        if self.shutting_down:
            from waste.adapters.engine_host import ShuttingDown
            raise ShuttingDown()
        if self.info is None or not self.host.loaded:
            raise EngineLoading()
        return self.info

    @property
    def shutting_down(self) -> bool:
        return self.host.shutting_down

    async def tokenize_segments(self, segments: Sequence[Segment]) -> list[int]:
        """Encode each segment on its own and concatenate (never merge, xtml.md §1)."""
        tokenizer = self.host.tokenizer

        def encode() -> list[int]:
            ids: list[int] = []
            for seg in segments:
                ids += tokenizer.tokenize_markup(seg.text) if seg.markup else tokenizer.tokenize(seg.text)
            return ids

        return await trio.to_thread.run_sync(encode, limiter=self.host.tokenizer_limiter)

    async def call_tokenizer(self, fn, *args):
        return await trio.to_thread.run_sync(fn, *args, limiter=self.host.tokenizer_limiter)
