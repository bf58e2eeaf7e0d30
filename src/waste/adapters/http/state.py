"""The HTTP adapter's state: the generation service, the chat format chosen at load, the
image decoder it was given, and the metrics it serves."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Iterator, Sequence

import attrs
import trio

from waste.adapters.http.config import HttpConfig
from waste.adapters.http.metrics import Metrics
from waste.domain.chat_format import ChatFormat, NoFormat
from waste.domain.format_choice import select_chat_format
from waste.domain.ports import (Engine, EngineError, GrammarCompiler, ImageDecoder, ModelInfo, Tokenizer,
                                Unsupported)
from waste.domain.errors import InvalidRequest
from waste.domain.segments import Segment
from waste.service import EngineLoadFailed, EngineLoading, GenerationService, ShuttingDown

log = logging.getLogger("waste")
IMAGE_THREADS = 2  # concurrent image decodes; more would only compete for the same cores


@attrs.define(eq=False)
class ServerState:
    config: HttpConfig
    service: GenerationService
    decode_images: ImageDecoder
    metrics: Metrics = attrs.field(
        default=attrs.Factory(lambda self: Metrics(self.config.model_id), takes_self=True))
    started: float = attrs.field(factory=time.monotonic)
    # Until the engine has loaded, no format (requests are refused as loading before).
    chat_format: ChatFormat = attrs.field(factory=lambda: NoFormat("the engine has not loaded"))
    info: ModelInfo | None = None
    completed_requests: int = 0
    # Image decoding's own threads (docs/HTTP.md §7): never trio's default pool.
    image_limiter: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(IMAGE_THREADS))
    # Large bodies are parsed and validated in a thread, one at a time (memory stays bounded).
    parse_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    # Bodies being read: cancelled when shutdown starts (their requests get 503).
    uploads: set[trio.CancelScope] = attrs.field(factory=set)
    # Why the container cannot tokenize (it was converted without tokenizer files), or None.
    no_tokenizer: str | None = None
    # Builds the response_format grammar compiler once the engine is open (chosen by app).
    grammar_factory: Callable[[Tokenizer, ModelInfo, int], GrammarCompiler] | None = None
    grammar: GrammarCompiler | None = None

    async def resolve_chat_format(self) -> None:
        """Choose the chat format once the engine is open; a container without a usable one
        is a held error, not a failure. Every blocking call runs in a worker thread."""
        engine, tokenizer = self.service.engine, self.service.tokenizer
        assert engine is not None and tokenizer is not None, "called once the engine is open"
        info = engine.model_info()
        try:
            template = await self.service.call_engine(engine.chat_template)
        except EngineError as exc:  # an unreadable chat.json is a held error, not a crash
            chat_format: ChatFormat = NoFormat(f"chat.json unreadable: {exc}")
        else:
            try:
                chat_format = await self.call_tokenizer(
                    lambda: select_chat_format(tokenizer, template,
                                               image_placeholder_id=info.media_placeholder_id,
                                               vision=info.vision,
                                               chat_json_first=self.config.chat_json_first))
            except Unsupported as exc:
                self.no_tokenizer = f"the container has no tokenizer ({exc.detail})"
                chat_format = NoFormat((
                    f"No usable chat format: {self.no_tokenizer}, so neither the XTML markers "
                    "nor a chat.json can be tokenized"))
        self.chat_format = chat_format
        if self.grammar_factory is not None and chat_format.end_ids:
            # Cheap: the vocabulary is read on the first constrained request.
            self.grammar = self.grammar_factory(tokenizer, info, chat_format.end_ids[0])
        self.info = info  # last: /health says "ok" once everything above is known
        self._log_format()

    def _log_format(self) -> None:
        fmt = self.chat_format
        log.info("engine ready; chat format: %s", fmt.name or f"none ({fmt.error})")
        for warning in fmt.startup_warnings(default_thinking=self.config.thinking_default):
            log.warning("warning: %s", warning)

    @contextlib.contextmanager
    def upload_scope(self) -> Iterator[trio.CancelScope]:
        """A cancel scope around reading one body; shutdown cancels it (or it starts so)."""
        with trio.CancelScope() as scope:
            if self.shutting_down:
                scope.cancel()
            self.uploads.add(scope)
            try:
                yield scope
            finally:
                self.uploads.discard(scope)

    async def cut_uploads_on_shutdown(self) -> None:
        """Runs for the server's lifetime: on shutdown, every body still arriving is cut."""
        await self.service.wait_until(lambda service: service.shutting_down)
        for scope in list(self.uploads):
            scope.cancel()

    def require_loaded(self) -> ModelInfo:
        """docs/HTTP.md §2.1 step 5: the model, or why there is none."""
        if self.service.load_error is not None:
            raise EngineLoadFailed(self.service.load_error)
        if self.shutting_down:
            raise ShuttingDown()
        if self.info is None or not self.service.loaded:
            raise EngineLoading()
        return self.info

    def require_tokenizer(self, param: str) -> None:
        """A request that needs text tokenized, on a container without a tokenizer, is a 400."""
        if self.no_tokenizer is not None:
            raise InvalidRequest(f"{param} cannot be used: {self.no_tokenizer}, so text "
                                 "cannot be tokenized or detokenized; convert the checkpoint "
                                 "with its tokenizer files", param, "invalid_value")

    @property
    def engine(self) -> Engine:
        """The open engine (the routes that use it ran ``require_loaded`` first)."""
        if self.service.engine is None:
            raise EngineLoading()
        return self.service.engine

    @property
    def tokenizer(self) -> Tokenizer:
        """The open tokenizer (the routes that use it ran ``require_loaded`` first)."""
        if self.service.tokenizer is None:
            raise EngineLoading()
        return self.service.tokenizer

    @property
    def shutting_down(self) -> bool:
        return self.service.shutting_down

    async def tokenize_segments(self, segments: Sequence[Segment]) -> list[int]:
        """Encode each segment on its own and concatenate (never merge, docs/XTML.md §1)."""
        tokenizer = self.service.tokenizer
        assert tokenizer is not None, "called once the engine is open"

        def encode() -> list[int]:
            ids: list[int] = []
            for seg in segments:
                ids += tokenizer.tokenize_markup(seg.text) if seg.markup else tokenizer.tokenize(seg.text)
            return ids

        return await self.call_tokenizer(encode)

    async def call_tokenizer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One blocking tokenizer call in a worker thread, serialised with the others."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.service.tokenizer_limiter)
