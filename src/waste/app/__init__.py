"""The composition root: ``create_app(engine, settings)`` and ``app`` for hypercorn.

``hypercorn --worker-class trio waste.app:app`` reads ``WASTE_MODEL`` and the other
``WASTE_*`` variables. ``app`` is a thin ASGI object that builds the real app from the
environment on its first event, so importing this package never reads the environment or
opens anything; the engine opens in the serving lifecycle.
"""

from __future__ import annotations

from typing import Any

from waste.app.factory import app_from_environment, create_app, engine_opener
from waste.app.settings import Settings, load_settings

__all__ = ["create_app", "engine_opener", "Settings", "load_settings", "app"]


class _AppFromEnvironment:
    """ASGI entry point configured from ``WASTE_*`` variables, built on first use."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            self._app = app_from_environment()
        await self._app(scope, receive, send)


app = _AppFromEnvironment()
