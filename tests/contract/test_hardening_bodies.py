"""A huge body does not freeze the event loop (issue 11, fault 3).

200k messages (7 MB) took ~20 s to parse and validate on the event loop, stalling /health
and running streams. Large bodies are now parsed in a worker thread under a limiter of
one. The test holds that limiter, so the big request is provably still in progress while
/health answers (ordering by events, not by clocks), then lets it finish.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import trio

from tests.contract.serving import fake, running, state_of
from waste.app import Settings


def big_body() -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"}
                for i in range(200_000)]
    return json.dumps({"messages": messages, "max_tokens": 1}).encode()


def test_health_answers_while_a_7_mb_body_is_being_processed():
    body = big_body()
    assert len(body) > 7_000_000
    with running(fake(), Settings(fake_engine="builtin")) as (base, app):
        state = state_of(app)
        token = state.service.trio_token
        limiter = state.parse_limiter
        holder = object()
        trio.from_thread.run_sync(limiter.acquire_on_behalf_of_nowait, holder, trio_token=token)
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
            # The big request reaches the parse limiter (a bounded wait: a safety net).
            for _ in range(600):
                waiting = trio.from_thread.run_sync(
                    lambda: limiter.statistics().tasks_waiting, trio_token=token)
                if waiting:
                    break
                time.sleep(0.05)
            assert waiting == 1, "the big body never reached the parse limiter"
            health = httpx.get(base + "/health", timeout=30)
            assert health.status_code == 200 and health.json()["status"] == "ok"
            sock.setblocking(False)
            try:
                early = sock.recv(1)
            except BlockingIOError:
                early = b""
            assert early == b"", "the big request answered before its parse could run"
            sock.setblocking(True)
            trio.from_thread.run_sync(limiter.release_on_behalf_of, holder, trio_token=token)
            reply = b""
            while b"\r\n\r\n" not in reply:
                reply += sock.recv(65536)
        status = int(reply.split()[1])
        assert status in (200, 400), reply[:300]  # answered (or refused as too long), not lost
