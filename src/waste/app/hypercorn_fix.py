"""Fixes for hypercorn 0.18.0 (pinned: these touch its internals), applied once at import.

1. ``TCPServer._close()`` runs in a task quart-trio has just cancelled, so the EOF is never
   sent (docs/STACK.md pitfall 1): ``Connection: close``, HTTP/1.0 streams and early 4xx
   answers then hang. Running it shielded sends the EOF.
2. Malformed HTTP (a bad Content-Length, a garbage request line, a NUL in a header, an
   oversized head) was answered with an empty-body 400/431; it gets the OpenAI error
   envelope like every other error (docs/HTTP.md §5).
3. ``H11Protocol._maybe_recycle()`` runs in that same cancelled task, so restarting the
   keep-alive idle watcher (a ``nursery.start``) was cancelled: an idle keep-alive connection
   then never closed on shutdown, and hypercorn waited its whole graceful timeout for it.
   Running it shielded restarts the watcher, which closes idle connections at once.
4. A client that half-closes its write side after sending a whole request was treated as
   gone and got nothing. Unless the request is a generation (where end-of-input is how a
   departed client shows itself, docs/DECISIONS.md), the answer is now sent first.
"""

from __future__ import annotations

import functools
import json
from itertools import chain
from math import inf

import h11
import trio
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

_MARK = "_waste_patched"
# A FIN from these is a client that left: the generation stops (docs/HTTP.md §4.3).
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


def apply() -> None:
    if getattr(TCPServer._close, _MARK, False):
        return
    _shield_close()
    _shield_recycle()
    H11Protocol._send_error_response = _send_error_response  # type: ignore[method-assign]
    TCPServer._read_data = _read_data  # type: ignore[method-assign]


def _shield_close() -> None:
    original = TCPServer._close

    @functools.wraps(original)
    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            await original(self)

    setattr(_close, _MARK, True)
    TCPServer._close = _close  # type: ignore[method-assign]  # the patch is the point


def _shield_recycle() -> None:
    original = H11Protocol._maybe_recycle

    @functools.wraps(original)
    async def _maybe_recycle(self: H11Protocol) -> None:
        with trio.CancelScope(shield=True):
            await original(self)

    H11Protocol._maybe_recycle = _maybe_recycle  # type: ignore[method-assign]


def malformed_body(status: int) -> bytes:
    """The envelope for HTTP the parser refused (h11's status hint: 400 or 431)."""
    if status == 431:
        code, message = "headers_too_large", ("The request line and headers are too large "
                                              "(over 16 KiB in all).")
    else:
        code, message = "malformed_http", ("The request is not valid HTTP/1.1 (its request "
                                           "line, a header or Content-Length is malformed).")
    return json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()


async def _send_error_response(self: H11Protocol, status_code: int) -> None:
    body = malformed_body(status_code)
    await self._send_h11_event(h11.Response(
        status_code=status_code,
        headers=list(chain([(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")],
                           self.config.response_headers("h11")))))
    await self._send_h11_event(h11.Data(data=body))
    await self._send_h11_event(h11.EndOfMessage())


def _answer_pending(server: TCPServer) -> H11Protocol | None:
    """The HTTP/1.1 protocol when a whole request was read and its answer is not done yet
    (and it is not a generation)."""
    proto = getattr(server.protocol, "protocol", None)
    if not isinstance(proto, H11Protocol) or proto.stream is None:
        return None
    if proto.connection.their_state not in (h11.DONE, h11.CLOSED):  # CLOSED: h11 saw the EOF
        return None
    path = getattr(proto.stream, "scope", {}).get("path", "")
    return None if path in GENERATION_PATHS else proto


async def _read_data(self: TCPServer) -> None:
    """hypercorn's reader, except that end-of-input after a whole request waits for the
    answer before the stream is closed (HTTP allows a half-closed client)."""
    while True:
        try:
            with trio.fail_after(self.config.read_timeout or inf):
                data = await self.stream.receive_some(MAX_RECV)
        except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
            break
        else:
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                proto = _answer_pending(self)
                if proto is not None:
                    # _maybe_recycle sets can_read once the answer is sent and the stream closed.
                    await proto.can_read.clear()
                    while proto.stream is not None:
                        await proto.can_read.wait()
                break
    # The client is done sending: the keep-alive idle watcher (running again since fix 3)
    # must not hold the connection open until its timeout.
    await self.idle_task.stop()
    await self.protocol.handle(Closed())
