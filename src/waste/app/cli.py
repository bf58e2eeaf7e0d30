"""``python -m waste MODEL [flags]``: serve programmatically with hypercorn on Trio.

Serving in-process (not through the hypercorn CLI, which always forks a worker) keeps one
engine per server. Exit codes: 0 after a clean shutdown, 1 when the engine fails to load or
on a second signal, 2 on a usage error.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
from typing import Any, Sequence

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import waste
from waste.app.factory import create_app, engine_opener, resolve_remote_model
from waste.domain.ports import EngineError
from waste.app.settings import Settings, UsageError, load_settings
from waste.service import GenerationService

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
    try:
        # Here, not at the top: the cffi extension exists only once libwaste is built.
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
    # needs libwaste built (see above)
    from waste.adapters.native import NativeOptions, plan_memory, plan_prefix_cache
    from waste.tools.plan_config import cold_token_lines, plan_anyway, plannable

    refused = None
    try:
        # A config.json (or a checkpoint directory without weights) is planned as the
        # container its conversion would write, on any machine (waste.tools.plan_config).
        with plannable(settings.model) as (path, manifest):
            if manifest is None:
                plan = plan_memory(path, settings)
            else:
                plan, refused = plan_anyway(path, settings)
        # The prefix cache's share of that budget (docs/ENGINE.md §2 "Prefix cache").
        prefix = plan_prefix_cache(plan, NativeOptions.from_settings(settings))
    except Exception as exc:
        print(f"waste: plan refused: {exc}", file=sys.stderr)
        return 1
    for key, value in [*plan.items(), *cold_token_lines(plan, manifest, 7.0)]:
        print(f"{key:>20}: {value}")
    print(f"{'prefix_cache_bytes':>20}: {prefix.bytes}" + (f" ({prefix.note})" if prefix.note else ""))
    print(f"{'prefix_entry_bytes':>20}: {prefix.entry_bytes}")
    print(f"{'engine_budget_bytes':>20}: {prefix.engine_budget_bytes}")
    if refused:
        print(f"{'this_machine':>20}: does not fit ({refused})")
    # How the experts would be read (docs/ENGINE.md §5): the policy and the read-ahead flags.
    print(f"{'cache_policy':>20}: {settings.cache}")
    print(f"{'io_threads':>20}: {settings.io_threads}"
          + (" (reads on the computing thread)" if not settings.io_threads
             else f" (up to {settings.io_threads} record reads in flight)"))
    print(f"{'lookahead':>20}: {'on (next MoE layer guessed while decoding)' if settings.lookahead else 'off'}")
    print(f"{'activations':>20}: {settings.activations}"
          + (" (int8 per 32 for int8/int4/mxfp4 weights: integer dot products)" if settings.activations == "q8"
             else " (exact f32: the reference)"))
    return 0


def _bind(settings: Settings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _hypercorn_config(sock: socket.socket, settings: Settings) -> Config:
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket now
    config.keep_alive_timeout = 75
    # The listener closes on the first signal; open exchanges then get this long. It must
    # outlast the running generation's grace, or hypercorn would cut the stream first.
    config.graceful_timeout = settings.shutdown_grace_s + 5
    # after_serving waits for a load in progress (waste_open cannot be aborted); hypercorn
    # must not give up on it and crash out of serve(). A second signal still exits at once.
    config.shutdown_timeout = math.inf
    config.accesslog = None
    # A Logger (not "-") makes hypercorn log through ours instead of adding a second stderr
    # handler, which printed every line twice in two formats.
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


async def _serve(settings: Settings) -> int:
    try:
        settings = await resolve_remote_model(settings)
    except EngineError as exc:
        print(f"waste: {exc.detail}", file=sys.stderr)
        return 1
    try:
        opener = engine_opener(settings)
    except Exception as exc:
        print(f"waste: {exc}", file=sys.stderr)
        return 2
    app = create_app(opener, settings)
    service = app.extensions["waste"].service
    sock = _bind(settings)
    port = sock.getsockname()[1]
    if settings.host not in _LOOPBACK and not settings.api_key:
        print(f"warning: serving on {settings.host} without --api-key; anyone who can reach "
              "it can use this server", file=sys.stderr)
    stop = trio.Event()
    load_failed = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(_handle_signals, service, stop)
        nursery.start_soon(_stop_on_load_failure, service, stop, load_failed)
        shown = settings.host if ":" not in settings.host else f"[{settings.host}]"
        print(_banner(f"http://{shown}:{port}", settings), flush=True)
        await serve(app, _hypercorn_config(sock, settings), shutdown_trigger=stop.wait)
        nursery.cancel_scope.cancel()
    return 1 if load_failed.is_set() else 0


def _banner(url: str, settings: Settings) -> str:
    """What a person sees once the server listens: where, one request that shows an answer,
    and the URL for Open-WebUI. The first line stays ``listening on URL`` (scripts read it)."""
    key = " -H 'Authorization: Bearer YOUR_API_KEY'" if settings.api_key else ""
    return (f"listening on {url}\n"
            f"  try:        curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{key} \\\n"
            f"                -d '{{\"temperature\":0,\"messages\":[{{\"role\":\"user\",\"content\":\"What is 47 plus 38?\"}}]}}'\n"
            f"  Open-WebUI: connection URL {url}/v1 (Settings > Connections > OpenAI API)")


async def _handle_signals(service: GenerationService, stop: trio.Event, *,
                          task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """The first SIGINT/SIGTERM starts the shutdown of docs/HTTP.md §6; a second exits 1 at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            if stop.is_set():
                print("waste: second signal: exiting now", file=sys.stderr, flush=True)
                os._exit(1)
            if service.ready.is_set():
                log.info("shutting down: no new connections; the running generation gets "
                         "%.0f s", service.shutdown_grace_s)
            else:
                log.warning("shutting down once the engine has finished loading (a load "
                            "cannot be interrupted); a second signal exits at once")
            service.request_shutdown()
            stop.set()  # hypercorn closes the listener now (step 1)


async def _stop_on_load_failure(service: GenerationService, stop: trio.Event,
                                load_failed: trio.Event) -> None:
    await service.ready.wait()
    if service.load_error is not None:
        load_failed.set()
        stop.set()
