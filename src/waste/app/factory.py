"""The composition root: build an app from an engine (or an engine opener) and settings.

This is the only place adapters are chosen: the engine (fake or native), the image decoder,
the HTTP adapter. Nothing opens at import: the engine loads in the serving lifecycle, in the
background, while /health answers 503 "loading".
"""

from __future__ import annotations

import functools

import contextlib
import logging
import os
from typing import Any, AsyncIterator

import attrs
import trio
from quart_trio import QuartTrio

from waste.adapters.fake import load_script, open_fake_engine
from waste.adapters.http.config import HttpConfig
from waste.adapters.http.routes import register
from waste.adapters.http.state import ServerState
from waste.adapters.images import decode_images
from waste.app import hypercorn_fix
from waste.app.settings import Settings, concurrency, load_settings
from waste.domain.ports import Engine, Tokenizer
from waste.service import EngineOpener, GenerationService

log = logging.getLogger("waste")
hypercorn_fix.apply()


def engine_opener(settings: Settings) -> EngineOpener:
    """The opener ``settings`` asks for: the scripted fake, vLLM, or libwaste on a container."""
    if settings.vllm is not None:
        from waste.adapters.vllm import VllmOptions, open_vllm_engine

        options = VllmOptions(url=settings.vllm, api_key=settings.vllm_api_key,
                              model=settings.vllm_model, chat_format=settings.chat_format,
                              ctx_tokens=settings.ctx)
        return lambda: open_vllm_engine(options)
    if settings.fake_engine is not None:
        script = load_script(settings.fake_engine)  # a bad script fails at startup
        return lambda: open_fake_engine(script, ctx_tokens=settings.ctx, vision=settings.vision,
                                        prefix_cache=settings.prefix_cache,
                                        prefix_interval=settings.prefix_interval)

    model = settings.model
    if model is None:
        raise ValueError("MODEL is required (a container directory), or pass --fake-engine")

    def open_native() -> contextlib.AbstractAsyncContextManager[tuple[Engine, Tokenizer]]:
        # Imported here, not at the top: the cffi extension exists only once libwaste is
        # built, and the fake engine must serve without it.
        from waste.adapters.native import open_native_engine

        return open_native_engine(model, settings)

    return open_native


async def resolve_remote_model(settings: Settings) -> Settings:
    """``settings`` with ``vllm_model`` set: the only model vLLM serves when none was named
    (the served id must be known before the app is built). Raises EngineError (unreachable,
    none or several models: the message says which)."""
    if settings.vllm is None or settings.vllm_model is not None:
        return settings
    from waste.adapters.vllm import VllmOptions, discover_model

    options = VllmOptions(url=settings.vllm, api_key=settings.vllm_api_key)
    model = await trio.to_thread.run_sync(discover_model, options)
    return attrs.evolve(settings, vllm_model=model)


@contextlib.asynccontextmanager
async def _already_open(engine: Any) -> AsyncIterator[tuple[Engine, Tokenizer]]:
    # An engine the caller opened (and will close); it is its own tokenizer.
    yield engine, engine


# The fake engine's plain vocabulary is every Unicode code point (1.1M ids): reading all of
# them for llguidance takes ~25 s per server. Under a grammar it offers only the first 2,048
# (ASCII through Cyrillic and Arabic), which builds in under a second (docs/DECISIONS.md).
FAKE_GRAMMAR_PLAIN_LIMIT = 0x800


def _llguidance(tokenizer: Tokenizer, info: Any, eos_id: int, *,
                plain_limit: int | None = None) -> Any:
    from waste.adapters.grammar import LlguidanceCompiler

    return LlguidanceCompiler(tokenizer, info.vocab, info.n_base_vocab, eos_id,
                              plain_limit=plain_limit)


def create_app(engine: Any, settings: Settings) -> QuartTrio:
    """An ASGI app serving ``engine``.

    Args:
        engine: an open Engine that is also its own Tokenizer (as ``FakeEngine`` is; the
            caller keeps owning it), or an ``EngineOpener``: a zero-argument callable
            returning an async context manager that opens ``(engine, tokenizer)`` when
            serving starts and closes them when it ends.
        settings: the server's settings.
    """
    if hasattr(engine, "generate"):
        opened = engine
        opener: EngineOpener = lambda: _already_open(opened)  # noqa: E731
    else:
        opener = engine
    config = HttpConfig(
        model_id=settings.served_model_id, api_key=settings.api_key,
        max_tokens=settings.max_tokens, thinking_default=settings.thinking,
        allow_local_images=settings.allow_local_images, vision=settings.vision,
        cors_origins=settings.cors_origins, fake_engine=settings.fake_engine is not None,
        keepalive_s=settings.keepalive_s, body_timeout_s=settings.body_timeout_s,
        chat_json_first=settings.chat_format is not None)
    running = concurrency(settings)
    service = GenerationService(opener=opener, max_queue=settings.max_queue,
                                max_concurrency=running,
                                # a remote tokenizer answers over HTTP, several at once
                                tokenizer_limiter=trio.CapacityLimiter(running),
                                shutdown_grace_s=settings.shutdown_grace_s)
    # Our answer grammar is a token mask inside the engine: vLLM cannot apply it, so a
    # response_format is refused (400) there rather than failing at generation.
    state = ServerState(config=config, service=service, decode_images=decode_images,
                        grammar_factory=None if settings.vllm else
                        _llguidance if settings.fake_engine is None else
                        functools.partial(_llguidance, plain_limit=FAKE_GRAMMAR_PLAIN_LIMIT))
    service.on_open = state.resolve_chat_format
    app = QuartTrio("waste")
    app.config["RESPONSE_TIMEOUT"] = None  # long generations must not be cut at 60 s
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.config["BODY_TIMEOUT"] = settings.body_timeout_s
    app.config["BACKGROUND_TASK_SHUTDOWN_TIMEOUT"] = settings.shutdown_grace_s + 5
    app.config["JSON_SORT_KEYS"] = False
    app.extensions["waste"] = state
    register(app, state)

    @app.before_serving
    async def start_engine() -> None:
        await app.nursery.start(service.run)

    @app.after_serving
    async def stop_engine() -> None:
        # Shielded: a load still in progress is waited for, past the lifecycle's deadline.
        with trio.CancelScope(shield=True):
            await service.aclose()

    return app


def app_from_environment() -> QuartTrio:
    """The ``waste.app:app`` object for ``hypercorn waste.app:app`` (WASTE_* variables)."""
    settings = load_settings(None, os.environ, asgi=True)
    if not settings.api_key:
        log.warning("warning: no API key is set (WASTE_API_KEY); anyone who can reach the "
                    "bind address can use this server")
    return create_app(engine_opener(settings), settings)
