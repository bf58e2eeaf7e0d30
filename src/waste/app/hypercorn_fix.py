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
   gone and got nothing. End-of-input after a whole request no longer ends the exchange:
   the server marks it (exchange.PeerEof), keeps answering, and finds a client that really
   left by writing. Until the answer's head goes out it writes empty ``103 Early Hints``
   responses on the probe schedule (exchange.probe_delays; never to HTTP/1.0, which must
   not get a 1xx); a stream's own writes probe after that. The first write to a departed
   client is answered with a reset, so a later one fails, and that failure is the
   disconnect the request's cancel scope carries to the engine (docs/DECISIONS.md).
"""

from __future__ import annotations

import functools
import json
from itertools import chain, islice
from math import inf

import h11
import trio
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

from waste.adapters.http.exchange import MAX_INTERIM_PROBES, PEER_EOF, probe_delays

_MARK = "_waste_patched"
_STREAM_CLOSED = "_waste_stream_closed"  # a trio.Event on the H11Protocol, set by _close_stream


def apply() -> None:
    if getattr(TCPServer._close, _MARK, False):
        return
    _shield_close()
    _shield_recycle()
    _signal_stream_closed()
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


def _signal_stream_closed() -> None:
    original = H11Protocol._close_stream

    @functools.wraps(original)
    async def _close_stream(self: H11Protocol) -> None:
        await original(self)
        closed = getattr(self, _STREAM_CLOSED, None)
        if closed is not None:
            closed.set()

    H11Protocol._close_stream = _close_stream  # type: ignore[method-assign]


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
    """The HTTP/1.1 protocol when a whole request was read and its answer is not done yet."""
    proto = getattr(server.protocol, "protocol", None)
    if not isinstance(proto, H11Protocol) or proto.stream is None:
        return None
    if proto.connection.their_state not in (h11.DONE, h11.CLOSED):  # CLOSED: h11 saw the EOF
        return None
    return proto


async def _read_data(self: TCPServer) -> None:
    """hypercorn's reader, except that end-of-input after a whole request is not a client
    that left: the answer goes on (HTTP allows a half-closed client) until it is done or a
    write finds the client gone."""
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
                    await _answer_half_closed(self, proto)
                break
    # The client is done sending: the keep-alive idle watcher (running again since fix 3)
    # must not hold the connection open until its timeout.
    await self.idle_task.stop()
    await self.protocol.handle(Closed())


async def _answer_half_closed(server: TCPServer, proto: H11Protocol) -> None:
    """Wait until the pending answer is done, or a write failed (hypercorn then closes the
    stream, which sends the app ``http.disconnect``), probing the client meanwhile."""
    closed = trio.Event()
    setattr(proto, _STREAM_CLOSED, closed)
    scope = getattr(proto.stream, "scope", {})
    peer = scope.get(PEER_EOF)
    if peer is not None:
        peer.set()
    async with trio.open_nursery() as nursery:
        if scope.get("http_version") != "1.0":
            nursery.start_soon(_probe_until_answered, server, proto)
        await closed.wait()
        nursery.cancel_scope.cancel()


async def _probe_until_answered(server: TCPServer, proto: H11Protocol) -> None:
    """Empty ``103 Early Hints`` responses while the answer's head has not gone out (a
    client must parse a 1xx it did not expect, RFC 9110 §15.2). They go through hypercorn's
    writer, whose failure closes the stream; h11 is asked first in the same step, so a 103
    can never follow the final response's head. At most MAX_INTERIM_PROBES of them: a
    client that half-closed and leaves later than that is not found, and its answer is
    generated to the end (bounded by max_tokens)."""
    for delay in islice(probe_delays(), MAX_INTERIM_PROBES):
        await trio.sleep(delay)
        if proto.connection.our_state is not h11.SEND_RESPONSE:
            return  # the head is out: the answer's own writes tell from here on
        data = proto.connection.send(h11.InformationalResponse(status_code=103, headers=[],
                                                          reason=b"Early Hints"))
        if data is not None:
            await server.protocol_send(RawData(data))
