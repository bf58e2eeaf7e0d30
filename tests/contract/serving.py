"""Serve an app with hypercorn on a real loopback socket, in a thread, for contract tests.

The server runs its own Trio loop in a background thread so tests can drive it with
ordinary blocking clients (httpx, the openai SDK, raw sockets) exactly as users do.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from waste.adapters.fake import FakeEngine, parse_script
from waste.app import Settings, create_app


@contextlib.contextmanager
def running(engine_or_opener, settings: Settings | None = None, *, wait_ready: bool = True):
    """Yield ``(base_url, app)`` while the app is served on 127.0.0.1:<free port>."""
    settings = settings or Settings(fake_engine="builtin")
    app = create_app(engine_or_opener, settings)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket now
    config.keep_alive_timeout = 75
    config.graceful_timeout = 2
    config.accesslog = None
    config.errorlog = None
    box: dict = {}
    started = threading.Event()

    async def main() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        box["stop"] = trio.Event()
        started.set()
        await serve(app, config, shutdown_trigger=box["stop"].wait)

    def thread_main() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # surfaced by the fixture's teardown
            box["error"] = exc
            started.set()

    thread = threading.Thread(target=thread_main, name="test-server", daemon=True)
    thread.start()
    started.wait(10)
    base = f"http://127.0.0.1:{port}"
    try:
        if wait_ready:
            _wait_ready(app, box["token"])
        yield base, app
    finally:
        if "token" in box:
            box["token"].run_sync_soon(box["stop"].set)
        thread.join(30)
        assert not thread.is_alive(), "the server did not shut down"
        if "error" in box:
            raise box["error"]


def _wait_ready(app, token) -> None:
    # The engine loads in the background; wait for the load to end, either way.
    state = state_of(app)

    async def loaded() -> None:
        with trio.fail_after(30):  # a safety net, not a synchronisation
            await state.service.ready.wait()

    trio.from_thread.run(loaded, trio_token=token)


def fake(script: dict | None = None, **kwargs) -> FakeEngine:
    return FakeEngine(parse_script(script or {}), **kwargs)


def state_of(app):
    return app.extensions["waste"]
