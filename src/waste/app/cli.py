"""``python -m waste MODEL [flags]``: serve programmatically with hypercorn on Trio.

Serving in-process (not through the hypercorn CLI, which always forks a worker) keeps one
engine per server. Exit codes: 0 after a clean shutdown, 1 when the engine fails to load or
on a second signal, 2 on a usage error.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from typing import Sequence

import trio

from waste.app.settings import Settings, UsageError, load_settings

log = logging.getLogger("waste")
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(list(sys.argv[1:] if argv is None else argv), os.environ)
    except UsageError as exc:
        print(f"waste: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.version:
        return _print_version()
    if settings.plan:
        return _print_plan(settings)
    try:
        return trio.run(_serve, settings)
    except KeyboardInterrupt:
        return 1


def _print_version() -> int:
    import waste

    try:
        from waste.adapters.native import library_versions

        native = library_versions()
    except Exception as exc:  # the server still reports its own version
        native = f"libwaste unavailable ({exc})"
    print(f"waste {waste.__version__}; {native}")
    return 0


def _print_plan(settings: Settings) -> int:
    if settings.model is None:
        print("waste: --plan needs MODEL", file=sys.stderr)
        return 2
    from waste.adapters.native import plan_memory

    try:
        plan = plan_memory(settings.model, settings)
    except Exception as exc:
        print(f"waste: plan refused: {exc}", file=sys.stderr)
        return 1
    for key, value in plan.items():
        print(f"{key:>20}: {value}")
    return 0


def _bind(settings: Settings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


async def _serve(settings: Settings) -> int:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from waste.app.factory import create_app, engine_loader

    try:
        loader = engine_loader(settings)
    except Exception as exc:
        print(f"waste: {exc}", file=sys.stderr)
        return 2
    app = create_app(loader, settings)
    state = app.extensions["waste"]
    sock = _bind(settings)
    host, port = sock.getsockname()[:2]
    if settings.host not in _LOOPBACK and not settings.api_key:
        print(f"warning: serving on {settings.host} without --api-key; anyone who can reach "
              "it can use this server", file=sys.stderr)
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket now
    config.keep_alive_timeout = 75
    config.graceful_timeout = 5
    config.accesslog = None
    print(f"listening on http://{settings.host if ':' not in settings.host else f'[{settings.host}]'}:{port}",
          flush=True)
    exit_code = 0

    async def shutdown_trigger() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                async def load_watch():
                    nonlocal exit_code
                    await state.host.ready.wait()
                    if state.host.load_error is not None:
                        exit_code = 1
                        nursery.cancel_scope.cancel()

                nursery.start_soon(load_watch)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
            if exit_code == 0:
                async with trio.open_nursery() as nursery:
                    async def second_signal():
                        async for _ in signals:
                            os._exit(1)  # a second signal exits at once

                    nursery.start_soon(second_signal)
                    await state.host.begin_shutdown()
                    nursery.cancel_scope.cancel()

    await serve(app, config, shutdown_trigger=shutdown_trigger)
    return exit_code
