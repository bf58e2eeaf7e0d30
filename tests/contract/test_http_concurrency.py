"""Queueing, disconnects, admission, keep-alive and shutdown over real sockets (docs/HTTP.md §4.3,
§6), against each engine.

Order comes from events, never from sleeps: the recording engine pauses a generation inside
its token callback, and the service wakes ``Served.wait_for`` on every change of its state.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket

import httpx
import pytest
import trio

from tests.contract.engines import serve
from tests.contract.sse import join_deltas, read_events

LONG = {"replies": [{"when": "long", "content": "x" * 400}]}


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def post(base: str, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    with httpx.Client(base_url=base, timeout=60) as c:
        return c.post(path, json=body)


def ask(base: str, body: dict) -> tuple[int, str]:
    """Status and the answer's content, blocking or streamed as ``body`` says."""
    with httpx.Client(base_url=base, timeout=60) as c:
        if body.get("stream"):
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                return r.status_code, join_deltas(read_events(r))["content"]
        r = c.post("/v1/chat/completions", json=body)
        return r.status_code, r.json()["choices"][0]["message"]["content"] or ""


def open_request(base: str, body: dict) -> socket.socket:
    """A request sent on a raw socket that the test closes when the client should leave."""
    host, port = base.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def metric(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


@pytest.fixture
def holding(engine_kind, request):
    """A server whose engine is held: one blocking request paused inside generation."""
    def start(**settings):
        stack = serve(engine_kind, request, script=LONG, **settings)
        served = stack.__enter__()
        served.engine.pause_at(0)
        pool = concurrent.futures.ThreadPoolExecutor(16)
        holder = pool.submit(post, served.base, chat("long hold", max_tokens=4))
        assert served.engine.paused.wait(20), "the held generation never started"
        opened.append((stack, pool))
        return served, holder

    opened: list = []
    yield start
    for stack, pool in opened:
        stack.__exit__(None, None, None)
        pool.shutdown(wait=True)


def test_disconnect_mid_stream_stops_the_engine_within_a_token(engine_kind, request):
    with serve(engine_kind, request, script=LONG, thinking=False) as served:
        engine, service = served.engine, served.service
        engine.pause_at(3)
        with httpx.Client(base_url=served.base, timeout=30) as c:
            with c.stream("POST", "/v1/chat/completions",
                          json=chat("long go", stream=True, max_tokens=400)) as r:
                lines = r.iter_lines()  # one iterator: dropping it would close the stream
                assert next(lines).startswith("data: ")  # admitted: the role chunk arrived
                assert engine.paused.wait(20)
            # leaving the block closed the connection while the engine waits at token 3
        served.wait_for(lambda h: h.requests_cancelled == 1)
        engine.resume()
        served.wait_for(lambda h: h.running is None)
        # tokens 0–2, then token 3 whose callback (or the abort it raced) stopped generation
        assert engine.record.generated == [4], engine.record
        assert engine.record.stop_reasons[-1] in ("callback", "E_CANCELLED")
        assert post(served.base, chat("next", max_tokens=3)).status_code == 200
        assert service.requests_cancelled == 1


def test_disconnect_during_prefill_aborts_it(request):
    script = {"prefill_delay_s": 60}
    with serve("fake", request, script=script) as served:
        sock = open_request(served.base, chat("slow prefill", stream=True))
        assert served.engine.generating.wait(20)  # inside generate: prefilling
        sock.close()
        served.wait_for(lambda h: h.running is None)  # without an abort: 60 s from now
        assert served.engine.record.stop_reasons == ["E_CANCELLED"]
        assert served.engine.record.generated == [0]


def test_a_client_that_leaves_the_queue_frees_its_place_at_once(holding):
    served, holder = holding(max_queue=1)
    ghost = open_request(served.base, chat("ghost-request"))
    served.wait_for(lambda h: h.queue_depth == 1)
    assert httpx.get(served.base + "/health").json()["queue_depth"] == 1
    assert metric(served.base, "waste_queue_depth") == 1
    ghost.close()
    served.wait_for(lambda h: h.queue_depth == 0 and h.requests_cancelled == 1)
    assert httpx.get(served.base + "/health").json()["queue_depth"] == 0
    assert metric(served.base, "waste_queue_depth") == 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        after = pool.submit(post, served.base, chat("after", max_tokens=2))
        served.wait_for(lambda h: h.queue_depth == 1)  # the freed place (--max-queue 1)
        served.engine.resume()
        assert after.result().status_code == 200
    assert holder.result().status_code == 200
    record = served.engine.record
    assert len(record.prompts) == 2  # the ghost never reached the engine
    assert not any("ghost-request" in served.engine.text(p) for p in record.prompts)


def test_concurrent_clients_are_answered_in_arrival_order(holding):
    served, holder = holding()
    bodies = [chat(f"client {i}", stream=bool(i % 2), max_tokens=24, thinking=False)
              for i in range(1, 8)]
    with concurrent.futures.ThreadPoolExecutor(7) as pool:
        futures = []
        for k, body in enumerate(bodies, start=1):
            futures.append(pool.submit(ask, served.base, body))
            served.wait_for(lambda h, k=k: h.queue_depth == k)  # request k queued before k+1
        served.engine.resume()
        answers = [f.result() for f in futures]
    assert holder.result().status_code == 200
    record = served.engine.record
    order = [next((i for i in range(1, 8) if f"client {i}" in served.engine.text(p)), None)
             for p in record.prompts[1:]]
    assert order == list(range(1, 8))
    assert len(record.prompts) == 8  # each generation once (the engine resets per prompt)
    # each answer is the one the request gets alone (greedy): nothing leaked between them
    for body, (status, content) in zip(bodies, answers):
        assert status == 200
        assert ask(served.base, body) == (200, content)
    if served.kind == "fake":
        assert [c for _, c in answers] == [f"Echo: client {i}" for i in range(1, 8)]


def test_max_queue_counts_only_waiting_requests(engine_kind, request):
    with serve(engine_kind, request, script=LONG, max_queue=0) as served:
        # an idle engine does not make a request wait: --max-queue 0 still serves it
        assert post(served.base, chat("idle", max_tokens=2)).status_code == 200
        served.engine.pause_at(0)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            holder = pool.submit(post, served.base, chat("long", max_tokens=2))
            assert served.engine.paused.wait(20)
            r = post(served.base, chat("would wait"))
            assert r.status_code == 503
            err = r.json()["error"]
            assert (err["code"], err["type"]) == ("queue_full", "unavailable_error")
            assert r.headers["Retry-After"] == "30"
            served.engine.resume()
            assert holder.result().status_code == 200


def test_queue_refusals_are_plain_json_never_sse(holding):
    """docs/HTTP.md §4.3: refusals at checks 1–10 are JSON; admission is decided once."""
    served, holder = holding(max_queue=2)

    def open_stream(i: int):
        c = httpx.Client(base_url=served.base, timeout=30)
        r = c.send(c.build_request("POST", "/v1/chat/completions",
                                   json=chat(f"s{i}", stream=True, max_tokens=2)), stream=True)
        return c, r

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        opened = list(pool.map(open_stream, range(6)))
    kinds = sorted((r.status_code, r.headers["content-type"].split(";")[0]) for _, r in opened)
    assert kinds == [(200, "text/event-stream")] * 2 + [(503, "application/json")] * 4
    served.engine.resume()
    for c, r in opened:
        if r.status_code == 200:
            assert read_events(r)[-1] == "[DONE]"
        else:
            r.read()
            assert r.json()["error"]["code"] == "queue_full"
        r.close()
        c.close()
    assert holder.result().status_code == 200


def test_keepalive_while_queued_and_prefilling(request):
    with serve("fake", request, script={**LONG, "prefill_delay_s": 0.5}, keepalive_s=0.05) as served:
        served.engine.pause_at(0)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            holder = pool.submit(post, served.base, chat("long", max_tokens=2))
            assert served.engine.paused.wait(20)
            with httpx.Client(base_url=served.base, timeout=30) as c:
                with c.stream("POST", "/v1/chat/completions",
                              json=chat("queued", stream=True, max_tokens=3)) as r:
                    lines = r.iter_lines()
                    assert next(lines).startswith("data: ")  # the role chunk
                    assert next(l for l in lines if l) == ": keep-alive"  # while queued
                    served.engine.resume()
                    rest = [line for line in lines if line]
            assert holder.result().status_code == 200
        # after the resume: the queued request waited out its own 0.5 s prefill, with
        # keep-alives (20 intervals of 0.05 s) before its first token
        first_data = next(i for i, line in enumerate(rest) if line.startswith("data: "))
        assert ": keep-alive" in rest[:first_data]
        assert rest[-1] == "data: [DONE]"


def test_a_stream_outlives_the_response_timeout(request):
    script = {"token_delay_s": 0.01, "replies": [{"content": "y" * 30}]}
    with serve("fake", request, script=script, thinking=False) as served:
        served.app.config["RESPONSE_TIMEOUT"] = 0.1  # each stream must switch it off
        with httpx.Client(base_url=served.base, timeout=30) as c:
            with c.stream("POST", "/v1/chat/completions", json=chat("x", stream=True)) as r:
                events = read_events(r)
    assert events[-1] == "[DONE]"  # 30 tokens of >= 10 ms each: longer than 0.1 s
    assert join_deltas(events)["content"] == "y" * 30


def test_shutdown_fails_the_queue_and_aborts_the_running_generation_after_the_grace(holding):
    served, holder = holding(shutdown_grace_s=0.2)
    service = served.service
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        queued_blocking = pool.submit(post, served.base, chat("q1"))
        served.wait_for(lambda h: h.queue_depth == 1)
        c = httpx.Client(base_url=served.base, timeout=30)
        queued_stream = c.send(c.build_request(
            "POST", "/v1/chat/completions", json=chat("q2", stream=True)), stream=True)
        served.wait_for(lambda h: h.queue_depth == 2)
        served.call(service.request_shutdown)
        blocked = queued_blocking.result()
        assert blocked.status_code == 503 and blocked.json()["error"]["code"] == "shutting_down"
        events = read_events(queued_stream)  # its headers were out: the SSE error event
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert events[-1]["error"]["code"] == "shutting_down"
        queued_stream.close()
        c.close()
        health = httpx.get(served.base + "/health")
        assert health.status_code == 503 and health.json()["status"] == "shutting_down"
        refused = post(served.base, chat("new"))
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        served.wait_for(lambda h: h.aborting)  # the grace ran out while it was still running
        served.engine.resume()
        aborted = holder.result()
    assert aborted.status_code == 503 and aborted.json()["error"]["code"] == "shutting_down"
    assert [served.engine.text(p).count("q1") for p in served.engine.record.prompts] == [0]


async def _leave_while_the_headers_go_out(app, body: bytes) -> list[str]:
    """One request, driven through the ASGI app by hand: the client disconnects while the
    response start is being sent, so the body generator is never started."""
    sent: list[str] = []
    headers_started = trio.Event()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"x"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 9), "server": ("127.0.0.1", 80), "extensions": {}}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await headers_started.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message["type"])
        if message["type"] == "http.response.start":
            headers_started.set()
            await trio.sleep_forever()  # a client that is gone never reads them

    with trio.fail_after(20):
        await app(scope, receive, send)
    return sent


def test_a_client_that_leaves_before_the_body_starts_holds_no_place(holding):
    """docs/STACK.md pitfall 4: the never-started body generator runs no finally; the exchange
    releases the admitted job anyway."""
    served, holder = holding()
    body = json.dumps(chat("never started", stream=True)).encode()
    sent = trio.from_thread.run(_leave_while_the_headers_go_out, served.app, body,
                                trio_token=served.service.trio_token)
    assert sent == ["http.response.start"]  # admitted (200 headers), no body byte sent
    served.wait_for(lambda h: h.queue_depth == 0 and h.requests_cancelled == 1)
    served.engine.resume()
    assert holder.result().status_code == 200
    served.wait_for(lambda h: h.running is None)
    assert len(served.engine.record.prompts) == 1  # the engine never saw it
