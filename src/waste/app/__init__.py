"""The composition root: ``create_app(engine, settings)`` and ``app`` for hypercorn.

``hypercorn waste.app:app`` reads ``WASTE_MODEL`` and the other ``WASTE_*`` variables; the
``app`` object is built on first access, and its engine opens in the serving lifecycle.
"""

from __future__ import annotations

from waste.app.factory import create_app, engine_loader
from waste.app.settings import Settings, load_settings

__all__ = ["create_app", "engine_loader", "Settings", "load_settings", "app"]


def __getattr__(name: str):
    if name == "app":
        from waste.app.factory import app_from_environment

        globals()["app"] = app_from_environment()
        return globals()["app"]
    raise AttributeError(name)
