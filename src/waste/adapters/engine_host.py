"""The engine worker: one Trio task owns the engine and runs jobs FIFO in a worker thread.

Requests submit jobs and read their events from an unbounded per-job channel, so a client
that stops reading never blocks the engine (stack-notes pitfall 6). A request that ends —
finished, failed or disconnected — marks its job cancelled: a queued job is then skipped
without touching the engine, and a running one stops at the next token callback.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from typing import Any, Callable

import attrs
import trio

from waste.domain.completion import Output, ReplyAssembler
from waste.domain.engine import Engine, EngineError, GenerationResult, SamplingParams
from waste.domain.errors import ContextLengthExceeded

log = logging.getLogger("waste.engine")
SHUTDOWN_GRACE_S = 10.0


class QueueFull(Exception):
    """More than ``max_queue`` requests are waiting."""


class ShuttingDown(Exception):
    """The server is shutting down; queued and aborted work gets this."""


class EngineLoading(Exception):
    """The engine has not finished opening."""


@attrs.frozen
class Started:
    """The job left the queue and owns the engine."""

    queue_ms: float


@attrs.frozen
class Released:
    """Output the assembler released for one or more tokens."""

    outputs: tuple[Output, ...]


@attrs.frozen
class Finished:
    result: GenerationResult
    outputs: tuple[Output, ...]
    prompt_tokens: int


@attrs.frozen
class Failed:
    error: BaseException


@attrs.frozen(kw_only=True)
class DecodedImage:
    rgb: bytes
    width: int
    height: int


@attrs.define(kw_only=True, eq=False)
class Job:
    """One generation request. ``cancelled`` is read by the worker thread between tokens."""

    prompt: list[int]
    params: SamplingParams
    assembler: ReplyAssembler
    images: tuple[DecodedImage, ...] = ()
    ctx_param: str = "messages"
    cancelled: bool = False
    completed: bool = False  # set by the request once it has read Finished or Failed
    enqueued_at: float = attrs.field(factory=time.perf_counter)
    send: Any = None


def _deliver(send: trio.MemorySendChannel, item: object) -> None:
    # Runs on the Trio thread via run_sync_soon: an exception here would crash trio.run.
    try:
        send.send_nowait(item)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


@attrs.define(eq=False)
class EngineHost:
    """Owns the engine for the server's lifetime: loading, the FIFO queue, shutdown."""

    loader: Callable[[], tuple[Engine, Any]]
    max_queue: int = 64
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    engine: Engine | None = None
    tokenizer: Any = None
    load_error: BaseException | None = None
    opened_at: float | None = None
    queue_depth: int = 0
    running: Job | None = None
    requests_cancelled: int = 0
    shutting_down: bool = False
    ready: trio.Event = attrs.field(factory=trio.Event)
    trio_token: Any = None
    tokenizer_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    _abort: bool = False
    _jobs_send: Any = None
    _jobs_recv: Any = None
    _queued: list[Job] = attrs.field(factory=list)
    _idle: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self._jobs_send, self._jobs_recv = trio.open_memory_channel(math.inf)
        self._idle.set()

    @property
    def loaded(self) -> bool:
        return self.engine is not None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open the engine in a thread, then serve jobs until the queue is closed."""
        self.trio_token = trio.lowlevel.current_trio_token()
        task_status.started()
        try:
            self.engine, self.tokenizer = await trio.to_thread.run_sync(self.loader)
        except Exception as exc:  # reported by /health and the CLI; the detail is logged
            self.load_error = exc
            log.error("engine failed to open: %s", exc)
            self.ready.set()
            return
        self.opened_at = time.time()
        self.ready.set()
        async with self._jobs_recv:
            async for job in self._jobs_recv:
                self._queued.remove(job)
                self.queue_depth -= 1
                if job.cancelled:
                    continue  # its client left while queued: the engine never sees it
                self.running, self._idle = job, trio.Event()
                try:
                    await trio.to_thread.run_sync(self._run_job, job, trio.lowlevel.current_trio_token())
                finally:
                    self.running = None
                    self._idle.set()

    def check_admission(self) -> None:
        """Raise unless a new job could be queued now (http.md §2.1 step 10)."""
        if self.shutting_down:
            raise ShuttingDown()
        if not self.loaded:
            raise EngineLoading()
        if self.queue_depth >= self.max_queue:
            raise QueueFull()

    @contextmanager
    def open_job(self, job: Job):
        """Queue ``job``; yield the channel of its events. Leaving cancels the job.

        Synchronous on purpose: its cleanup runs inside a body generator that may be closing
        on a client's disconnect, where any ``await`` would raise again.
        """
        self.check_admission()
        send, recv = trio.open_memory_channel(math.inf)
        job.send = send
        self.queue_depth += 1
        self._queued.append(job)
        self._jobs_send.send_nowait(job)
        try:
            yield recv
        finally:
            recv.close()
            if not job.completed:
                self.requests_cancelled += 1
            job.cancelled = True

    async def begin_shutdown(self) -> None:
        """Fail queued jobs, give the running one ``shutdown_grace_s``, then abort it."""
        self.shutting_down = True
        for job in list(self._queued):
            job.cancelled = True
            if job.send is not None:
                _deliver(job.send, Failed(ShuttingDown()))
        with trio.move_on_after(self.shutdown_grace_s):
            await self._idle.wait()
        self._abort = True
        await self._idle.wait()

    def close(self) -> None:
        """Stop the worker loop, save the expert hotlist, close the engine (after serving)."""
        self._jobs_send.close()
        if self.engine is None:
            return
        save_usage = getattr(self.engine, "save_usage", None)
        if save_usage is not None:
            try:
                save_usage()
            except Exception as exc:  # http.md §6: a failure to save is logged only
                log.warning("expert hotlist not saved: %s", exc)
        self.engine.close()
        self.engine = None
        if self.tokenizer is not None and hasattr(self.tokenizer, "close"):
            self.tokenizer.close()

    # -- the worker thread --------------------------------------------------------------
    def _run_job(self, job: Job, token: trio.lowlevel.TrioToken) -> None:
        engine = self.engine
        assert engine is not None

        def deliver(item: object) -> None:
            token.run_sync_soon(_deliver, job.send, item)

        def on_token(event) -> bool:
            outputs = job.assembler.on_token(event)
            if outputs:
                deliver(Released(tuple(outputs)))
            return job.cancelled or self._abort or job.assembler.should_stop

        try:
            engine.reset()
            prompt = self._expand_images(engine, job)
            deliver(Started((time.perf_counter() - job.enqueued_at) * 1000))
            result = engine.generate(prompt, job.params, on_token)
            if self._abort and not job.cancelled and result.stop_reason == "callback" \
                    and not job.assembler.should_stop:
                deliver(Failed(ShuttingDown()))
                return
            deliver(Finished(result, tuple(job.assembler.finish()), len(prompt)))
        except BaseException as exc:  # every failure reaches its request, never the loop
            log.warning("generation failed: %s", exc)
            engine.reset()  # after a failure the next request starts clean (http.md §5)
            deliver(Failed(exc))

    @staticmethod
    def _expand_images(engine: Engine, job: Job) -> list[int]:
        if not job.images:
            return job.prompt
        for image in job.images:
            engine.add_image(image.rgb, image.width, image.height)
        prompt = engine.expand_images(job.prompt)
        ctx = engine.model_info().ctx_tokens
        if len(prompt) >= ctx:
            raise ContextLengthExceeded(len(prompt), ctx, job.ctx_param)
        room = ctx - len(prompt)
        if job.params.max_tokens > room:
            job.params = attrs.evolve(job.params, max_tokens=room)
        return prompt


__all__ = ["EngineHost", "Job", "Started", "Released", "Finished", "Failed", "QueueFull",
           "ShuttingDown", "EngineLoading", "DecodedImage", "EngineError"]
