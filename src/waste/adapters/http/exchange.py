"""Releases that must run when an HTTP exchange ends, however it ends.

A streaming response's body generator cannot own what the route reserved: Quart closes the
body only from ``async with response.response`` inside ``_send_response``, so a body that
never started (the client left while the headers were going out, or before) is never
entered, and a never-started async generator runs no ``finally`` (docs/STACK.md pitfall 4).
The ASGI call itself always ends, by return, exception or cancellation, so a ``finally``
around it is the one place that provably runs. ``hold`` registers a release there.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, cast

from quart import request

_HOLDS = "waste.holds"

ASGIApp = Callable[[dict, Any, Any], Awaitable[None]]


def release_when_exchange_ends(asgi_app: ASGIApp) -> ASGIApp:
    """Wrap ``app.asgi_app``: run every release ``hold`` registered once the exchange ends."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        releases: list[Callable[[], None]] = []
        scope[_HOLDS] = releases
        try:
            await asgi_app(scope, receive, send)
        finally:
            # Synchronous on purpose: this may run while cancelled, where an await raises.
            for release in releases:
                release()

    return app


def hold(release: Callable[[], None]) -> None:
    """Run ``release()`` when the current request's exchange ends (it must be idempotent)."""
    releases = cast("list[Callable[[], None]] | None", request.scope.get(_HOLDS))
    if releases is None:
        raise RuntimeError("the app's asgi_app is not wrapped by release_when_exchange_ends")
    releases.append(release)
