"""Releases that must run when an HTTP exchange ends, however it ends.

A streaming response's body generator cannot own what the route reserved: Quart closes the
body only from ``async with response.response`` inside ``_send_response``, so a body that
never started (the client left while the headers were going out, or before) is never
entered, and a never-started async generator runs no ``finally`` (docs/STACK.md pitfall 4).
The ASGI call itself always ends, by return, exception or cancellation, so a ``finally``
around it is the one place that provably runs. ``hold`` registers a release there.

The exchange also carries its ``PeerEof``: the HTTP server marks it when the client ends its
side of the connection after a whole request, and a quiet stream then probes the client.
"""

from __future__ import annotations

import contextlib
from typing import Any, Awaitable, Callable, Iterator, cast

import trio
from quart import request

_HOLDS = "waste.holds"
PEER_EOF = "waste.peer_eof"  # the scope key of the exchange's PeerEof
# After a client's end-of-input, when the server writes to find out whether it still reads:
# the first write 20 ms after it, each next wait three times longer, at most 2 s
# (docs/HTTP.md §6, "Half-closed clients").
PROBE_FIRST_S = 0.02
PROBE_GROWTH = 3
PROBE_MAX_S = 2.0
# At most this many 1xx probes before one answer: Go's HTTP/1.1 client refuses a sixth 1xx.
MAX_INTERIM_PROBES = 5

ASGIApp = Callable[[dict, Any, Any], Awaitable[None]]


def release_when_exchange_ends(asgi_app: ASGIApp) -> ASGIApp:
    """Wrap ``app.asgi_app``: run every release ``hold`` registered once the exchange ends."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        releases: list[Callable[[], None]] = []
        scope[_HOLDS] = releases
        scope[PEER_EOF] = PeerEof()
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


def outcome() -> dict[str, Any]:
    """The current request's outcome record (route, status, arrival; metrics.OUTCOME)."""
    from waste.adapters.http.metrics import OUTCOME

    return cast("dict[str, Any]", request.scope)[OUTCOME]


def probe_delays() -> Iterator[float]:
    """The waits between the writes that probe a half-closed client: 20, 60, 180, 540 ms,
    1.62 s, then 2 s. A client that left answers a write with a reset, which makes a later
    one fail: on a local network it is found 80 ms after it left."""
    delay = PROBE_FIRST_S
    while True:
        yield delay
        delay = min(delay * PROBE_GROWTH, PROBE_MAX_S)


class PeerEof:
    """The client ended its side of the connection after a whole request (a FIN).

    That is a client that half-closed and still reads, or one that left: only a write tells
    them apart (a departed client's kernel answers it with a reset, and the next write
    fails). The HTTP server sets this and keeps the exchange going instead of reporting a
    disconnect; a stream that has nothing to write wakes up to write probes."""

    def __init__(self) -> None:
        self.seen = False
        self._wake: trio.CancelScope | None = None

    def set(self) -> None:
        self.seen = True
        if self._wake is not None:
            self._wake.cancel()

    @contextlib.contextmanager
    def waking(self, scope: trio.CancelScope) -> Iterator[None]:
        """Cancel ``scope`` (a wait for something to write) when the end-of-input comes."""
        self._wake = scope
        try:
            yield
        finally:
            self._wake = None


def peer_eof() -> PeerEof:
    """The current request's PeerEof."""
    return cast("PeerEof", cast("dict[str, Any]", request.scope)[PEER_EOF])
