"""Half-closed clients on the generation routes (issue 11, fault 6), over real sockets.

A client that shuts down its write side after its request still reads, so it gets its whole
answer, blocking or streamed. Its end-of-input looks the same as a client that left, so the
server writes to find out (docs/HTTP.md §6, "Half-closed clients"): empty ``103 Early Hints``
while a blocking answer is being generated, ``: keep-alive`` comments on a quiet stream.
A client that then really leaves is found by those writes and the engine stops within a
token, shown by the recording engine's counts while it waits at a pause (never by timing).
The responses are parsed by h11 as a client, an independent HTTP/1.1 parser.
"""

from __future__ import annotations

import json
import socket

import types

import h11
import httpx
import pytest
import trio

from tests.contract.engines import serve
from tests.contract.test_hardening_metrics import requests_total
from tests.contract.test_http_concurrency import LONG
from waste.app import hypercorn_fix

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROBE = b": keep-alive\n\n"


def body_for(path: str, text: str, **extra) -> dict:
    if path == CHAT:
        return {"messages": [{"role": "user", "content": text}], "temperature": 0, "seed": 7,
                **extra}
    return {"prompt": text, "temperature": 0, "seed": 7, **extra}


class RawClient:
    """One request on a raw socket, its answer read through an h11 client connection."""

    def __init__(self, base: str, path: str, body: dict, *, http_10: bool = False) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.conn = h11.Connection(h11.CLIENT)
        data = json.dumps(body).encode()
        request = h11.Request(method="POST", target=path,
                              headers=[("Host", "x"), ("Content-Type", "application/json"),
                                       ("Content-Length", str(len(data)))])
        raw = self.conn.send(request) + self.conn.send(h11.Data(data=data)) \
            + self.conn.send(h11.EndOfMessage())
        if http_10:  # h11 writes only HTTP/1.1; the answer it parses the same
            raw = raw.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1)
        self.sock.sendall(raw)
        self.informational: list[int] = []
        self.status: int | None = None
        self.body = b""
        self.ended = False

    def half_close(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()

    def _next(self):
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.conn.receive_data(self.sock.recv(65536))

    def _step(self) -> None:
        event = self._next()
        if isinstance(event, h11.InformationalResponse):
            self.informational.append(event.status_code)
        elif isinstance(event, h11.Response):
            self.status = event.status_code
        elif isinstance(event, h11.Data):
            self.body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            self.ended = True
        else:
            raise AssertionError(f"the connection ended before the answer did: {event!r}")

    def read_informational(self) -> None:
        """Read until a 1xx response arrived (the probe of a blocking answer)."""
        while not self.informational:
            self._step()

    def read_until(self, marker: bytes) -> None:
        """Read the streamed body until ``marker`` is in it."""
        while marker not in self.body:
            self._step()

    def read_to_end(self) -> None:
        while not self.ended:
            self._step()


def sse_content(body: bytes, path: str) -> str:
    """The text a streamed answer carried; it must end with [DONE]."""
    events = [e for e in body.decode().split("\n\n") if e and not e.startswith(":")]
    assert events[-1] == "data: [DONE]", events[-3:]
    text = []
    for raw in events[:-1]:
        chunk = json.loads(raw.removeprefix("data: "))
        for choice in chunk.get("choices") or []:
            text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(text)


def answer_text(reply: dict, path: str) -> str:
    choice = reply["choices"][0]
    return choice["message"]["content"] if path == CHAT else choice["text"]


def normal_answer(base: str, path: str, body: dict) -> str:
    """What a client that keeps its socket open gets for the same request."""
    with httpx.Client(base_url=base, timeout=60) as c:
        if body.get("stream"):
            with c.stream("POST", path, json=body) as r:
                assert r.status_code == 200
                return sse_content(r.read(), path)
        r = c.post(path, json=body)
        assert r.status_code == 200
        return answer_text(r.json(), path)


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "stream"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_half_closed_client_gets_the_whole_answer(engine_kind, request, path, stream):
    with serve(engine_kind, request, script=LONG, thinking=False) as served:
        body = body_for(path, "long answer", max_tokens=12, stream=stream)
        expected = normal_answer(served.base, path, body)
        served.engine.pause_at(2)
        client = RawClient(served.base, path, body)
        client.half_close()
        assert served.engine.paused.wait(20)
        # while the engine waits, the server probes the client (which stays connected)
        if stream:
            client.read_until(PROBE)
        else:
            client.read_informational()
            assert set(client.informational) == {103}
        served.engine.resume()
        client.read_to_end()
        client.close()
        assert client.status == 200
        if stream:
            assert sse_content(client.body, path) == expected
        else:
            reply = json.loads(client.body)
            assert answer_text(reply, path) == expected
            assert reply["usage"]["completion_tokens"] == served.engine.record.generated[-1]
        assert served.service.requests_cancelled == 0
        record = served.engine.record  # the same generation as the client that stayed
        assert record.generated[0] == record.generated[1]
        assert record.stop_reasons[0] == record.stop_reasons[1]


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "stream"])
def test_a_half_closed_client_that_then_leaves_stops_the_engine_within_a_token(
        engine_kind, request, stream):
    with serve(engine_kind, request, script=LONG, thinking=False) as served:
        engine = served.engine
        engine.pause_at(3)
        client = RawClient(served.base, CHAT, body_for(CHAT, "long go", max_tokens=400,
                                                       stream=stream))
        client.half_close()
        assert engine.paused.wait(20)
        if stream:
            client.read_until(PROBE)  # still served after its end-of-input
        else:
            client.read_informational()
        client.close()  # now it is gone; no token is written while the engine waits
        served.wait_for(lambda s: s.requests_cancelled == 1)  # found by a probe alone
        engine.resume()
        served.wait_for(lambda s: s.running is None)
        # tokens 0–2, then token 3 whose callback (or the abort it raced) stopped generation
        assert engine.record.generated == [4], engine.record
        assert engine.record.stop_reasons[-1] in ("callback", "E_CANCELLED")
        assert requests_total(served.base, "499") == 1
        assert requests_total(served.base, "200") == 0


def test_a_stream_whose_client_leaves_during_prefill_is_aborted(request):
    """The client reads what was written (so its close is a plain FIN, not a reset) and
    leaves while the prompt is prefilled: the stream's probes find it, the prefill stops."""
    with serve("fake", request, script={"prefill_delay_s": 60}) as served:
        client = RawClient(served.base, CHAT, body_for(CHAT, "slow prefill", stream=True))
        client.read_until(b"\n\n")  # the role chunk: admitted, and nothing left unread
        assert served.engine.generating.wait(20)
        client.close()
        served.wait_for(lambda s: s.running is None)  # without an abort: 60 s from now
        assert served.engine.record.stop_reasons == ["E_CANCELLED"]
        assert served.engine.record.generated == [0]


def test_a_blocking_client_that_leaves_while_queued_frees_its_place(request):
    """A plain close (FIN) of a queued blocking request: the 103 probes find it gone."""
    with serve("fake", request, script=LONG) as served:
        served.engine.pause_at(0)
        holder = RawClient(served.base, CHAT, body_for(CHAT, "long hold", max_tokens=4))
        assert served.engine.paused.wait(20)
        ghost = RawClient(served.base, CHAT, body_for(CHAT, "ghost-request"))
        served.wait_for(lambda s: s.queue_depth == 1)
        ghost.close()
        served.wait_for(lambda s: s.queue_depth == 0 and s.requests_cancelled == 1)
        served.engine.resume()
        holder.read_to_end()
        holder.close()
        assert holder.status == 200 and holder.informational == []
        assert len(served.engine.record.prompts) == 1  # the ghost never reached the engine


def test_an_http_10_half_closed_client_gets_its_answer_without_a_1xx(request):
    """HTTP/1.0 must not get a 1xx (RFC 9110 §15.2): its blocking answer is generated to
    the end and written, with no probe before it. A half-closed HTTP/1.1 request queued
    behind it is probed meanwhile, so probes were due for the first one too."""
    with serve("fake", request, script=LONG) as served:
        served.engine.pause_at(2)
        old = RawClient(served.base, CHAT, body_for(CHAT, "long answer", max_tokens=12),
                        http_10=True)
        old.half_close()
        assert served.engine.paused.wait(20)
        later = RawClient(served.base, CHAT, body_for(CHAT, "long after", max_tokens=3))
        later.half_close()
        served.wait_for(lambda s: s.queue_depth == 1)
        later.read_informational()
        served.engine.resume()
        for client in (old, later):
            client.read_to_end()
            client.close()
        assert old.status == 200 and old.informational == []
        assert json.loads(old.body)["usage"]["completion_tokens"] == 12
        assert later.status == 200 and set(later.informational) == {103}


async def test_at_most_five_103_probes_go_out_before_an_answer(autojump_clock):
    """On Trio's virtual clock: the probe schedule of a blocking answer, and its cap (Go's
    HTTP/1.1 client refuses a sixth 1xx)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    assert isinstance(conn.next_event(), h11.EndOfMessage)
    conn.receive_data(b"")  # the client's end-of-input
    start = trio.current_time()
    writes: list[tuple[float, bytes]] = []

    async def protocol_send(event) -> None:
        writes.append((round(trio.current_time() - start, 6), event.data))

    await hypercorn_fix._probe_until_answered(types.SimpleNamespace(protocol_send=protocol_send),
                                              types.SimpleNamespace(connection=conn))
    assert [at for at, _ in writes] == [0.02, 0.08, 0.26, 0.8, 2.42]
    assert {data for _, data in writes} == {b"HTTP/1.1 103 Early Hints\r\n\r\n"}


async def test_no_103_follows_the_head_of_the_answer(autojump_clock):
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
    writes: list = []

    async def protocol_send(event) -> None:
        writes.append(event)

    await hypercorn_fix._probe_until_answered(types.SimpleNamespace(protocol_send=protocol_send),
                                              types.SimpleNamespace(connection=conn))
    assert writes == []
