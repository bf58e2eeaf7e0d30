"""A fix for hypercorn 0.18.0's trio worker: connections that should close stay open.

hypercorn's ``TCPServer._close()`` runs in a task quart-trio has just cancelled, so the EOF
is never sent (docs/STACK.md pitfall 1): ``Connection: close``, HTTP/1.0 streams and early
4xx answers then hang. Running it shielded sends the EOF. Applied once, when the app imports.
"""

from __future__ import annotations

import functools

import trio
from hypercorn.trio.tcp_server import TCPServer

_MARK = "_waste_shielded"


def apply() -> None:
    original = TCPServer._close
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            await original(self)

    setattr(_close, _MARK, True)
    TCPServer._close = _close  # type: ignore[method-assign]  # the patch is the point
