"""What the HTTP adapter needs to know about the server's configuration."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class HttpConfig:
    model_id: str
    api_key: str | None = None
    max_tokens: int = 4096
    thinking_default: bool = True
    allow_local_images: bool = False
    vision: bool = False
    cors_origins: tuple[str, ...] = ()
    fake_engine: bool = False
    chat_json_first: bool = False  # --chat-format was given: its chat.json wins over XTML
    max_body_bytes: int = 64 * 1024 * 1024
    keepalive_s: float = 10.0  # SSE comment after this long with nothing written (§4.3)
    body_timeout_s: float = 60.0  # a body incomplete after this long is 408 (§5)
