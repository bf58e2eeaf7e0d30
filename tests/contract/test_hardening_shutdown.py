"""Shutdown does not wait for idle or stalled connections (issue 11, fault 5).

A container stop gives the server ~10 s; hypercorn used to wait its whole graceful timeout
(the grace plus 5 s) for one idle keep-alive connection or a half-uploaded body, and was
killed before it saved the hotlist. The server here runs with the CLI's hypercorn config
and a 600 s grace: the old server sat out ~605 s, so finishing at all (within the safety
net) shows nothing waited on the connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import trio
from hypercorn.trio import serve

from tests.contract.serving import fake, state_of
from waste.app import Settings, create_app
from waste.app.cli import _hypercorn_config

EXIT_WAIT_S = 20.0  # a safety net, not a speed check: the old wait was ~605 s


@contextlib.contextmanager
def cli_like_server():
    """Serve as ``python -m waste`` does; yield (address, stop, done) where ``stop()`` does
    what the first SIGTERM does and ``done`` is set once serve() has returned."""
    settings = Settings(fake_engine="builtin", shutdown_grace_s=600)
    app = create_app(fake(), settings)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    address = sock.getsockname()
    config = _hypercorn_config(sock, settings)
    config.errorlog = None
    box: dict = {}
    ready = threading.Event()
    done = threading.Event()

    async def main() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        box["stop"] = trio.Event()
        ready.set()
        await serve(app, config, shutdown_trigger=box["stop"].wait)

    def run() -> None:
        try:
            trio.run(main)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10)
    service = state_of(app).service
    trio.from_thread.run(service.ready.wait, trio_token=box["token"])

    def stop() -> None:
        def first_signal() -> None:
            service.request_shutdown()
            box["stop"].set()

        box["token"].run_sync_soon(first_signal)

    yield address, stop, done


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


def test_an_idle_keep_alive_connection_closes_at_once():
    with cli_like_server() as (address, stop, done):
        sock = socket.create_connection(address, timeout=EXIT_WAIT_S)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # answered; now it idles
        stop()
        assert b"HTTP/1.1" not in read_all(sock)  # the rest of /health, then the server's EOF
        assert done.wait(EXIT_WAIT_S), "serve() waited on the idle connection"
        sock.close()


def test_a_half_uploaded_body_gets_503_shutting_down():
    with cli_like_server() as (address, stop, done):
        sock = socket.create_connection(address, timeout=EXIT_WAIT_S)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\": [")
        # The first request's head is parsed before /health answers on a second connection.
        with socket.create_connection(address, timeout=EXIT_WAIT_S) as probe:
            probe.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_all(probe).startswith(b"HTTP/1.1 200")
        stop()
        reply = read_all(sock)
        assert reply.startswith(b"HTTP/1.1 503"), reply[:300]
        assert b'"shutting_down"' in reply
        assert done.wait(EXIT_WAIT_S), "serve() waited on the unfinished upload"
        sock.close()
