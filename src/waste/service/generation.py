"""The generation service: one Trio task owns the engine and runs jobs in a worker thread.

Queue order (docs/HTTP.md §2.1): the lowest ``priority`` first (vLLM's convention, default
0); at equal priority interactive (streaming) jobs before batch (non-streaming) ones; FIFO
within each. A running generation is never preempted.

A request is admitted once (``admit``: the place is held from then on) and reads its events
from an unbounded per-job channel, so a client that stops reading never blocks the engine
(docs/STACK.md pitfall 6). A request that ends — finished, failed or disconnected — calls
``leave``: a waiting job leaves the queue at once without touching the engine, and a running
one is stopped at the next token (callback) or prefill chunk (``Engine.abort``). It depends
on the ports only: the engine arrives through an opener the composition root chooses.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import time
from typing import Any, AsyncContextManager, Awaitable, Callable, cast

import attrs
import trio

from waste.domain.errors import ContextLengthExceeded
from waste.domain.ports import (Cancelled, ConcurrentEngine, ContextFull, Engine,
                                GenerationResult, Prompt, PromptImage, SamplingParams,
                                TokenEvent, Tokenizer)
from waste.domain.reply.assembler import Output, ReplyAssembler
from waste.domain.reply.constraint import AnswerConstraint, ReplyConstraint

log = logging.getLogger("waste.engine")
SHUTDOWN_GRACE_S = 10.0


class QueueFull(Exception):
    """``max_queue`` requests are already waiting."""


class ShuttingDown(Exception):
    """The server is shutting down; queued and aborted work gets this."""


class EngineLoading(Exception):
    """The engine has not finished opening."""


class EngineLoadFailed(Exception):
    """The engine could not be opened; every route but /health and /metrics says why."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


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


@attrs.define(kw_only=True, eq=False)
class Job:
    """One generation request. ``cancelled`` is read by the worker thread between tokens."""

    prompt: list[int]
    params: SamplingParams
    assembler: ReplyAssembler
    images: tuple[PromptImage, ...] = ()
    ctx_param: str = "messages"
    interactive: bool = False  # a streaming request: it overtakes queued batch ones
    priority: int = 0  # lower runs sooner
    cancelled: bool = False
    completed: bool = False  # set by the request once it has read Finished or Failed
    started: bool = False  # handed to the engine thread
    left: bool = False  # the request called ``leave``
    enqueued_at: float = attrs.field(factory=time.perf_counter)
    first_token_at: float | None = None  # perf_counter when the engine delivered token 0
    send: trio.MemorySendChannel | None = None
    # A response_format grammar on the answer, or a tool-call grammar on the whole reply:
    # the engine's mask, told every sampled token.
    constraint: AnswerConstraint | ReplyConstraint | None = None
    order: int = 0  # admission order, set by ``admit``: FIFO within a class

    @property
    def queue_class(self) -> str:
        return "interactive" if self.interactive else "batch"

    def sort_key(self) -> tuple[int, int, int]:
        return (self.priority, 0 if self.interactive else 1, self.order)


def _deliver(send: trio.MemorySendChannel, item: object) -> None:
    # Runs on the Trio thread via run_sync_soon: an exception here would crash trio.run.
    try:
        send.send_nowait(item)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


# Opens the engine and its tokenizer for the server's lifetime, and closes them on exit
# (the adapters' ``open_*`` async context managers; the blocking open runs in a thread).
EngineOpener = Callable[[], AsyncContextManager["tuple[Engine, Tokenizer]"]]


@attrs.define(eq=False)
class GenerationService:
    """Owns the engine for the server's lifetime: opening, the ordered queue, shutdown.

    ``running`` is the job that owns the engine (or is about to: it is assigned the moment
    an idle engine admits it); ``queue_depth`` counts only the jobs waiting behind it.
    With ``max_concurrency`` N > 1 (a ``ConcurrentEngine``: a remote batching server), up to
    N jobs run at once, each in its own worker thread and abortable on its own; ``active``
    lists them and ``running`` is the oldest.
    """

    opener: EngineOpener
    max_queue: int = 64
    max_concurrency: int = 1
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    # Runs after the engine opened and before it is declared loaded (the chat format).
    on_open: Callable[[], Awaitable[None]] | None = None
    engine: Engine | None = None
    tokenizer: Tokenizer | None = None
    load_error: BaseException | None = None
    opened_at: float | None = None
    active: list[Job] = attrs.field(factory=list)
    requests_cancelled: int = 0
    shutting_down: bool = False
    ready: trio.Event = attrs.field(factory=trio.Event)  # the load ended, either way
    trio_token: trio.lowlevel.TrioToken | None = None
    # One limiter per native context: its blocking calls are serialised in worker threads.
    engine_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    tokenizer_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    aborting: bool = False  # the shutdown grace ran out: the running job is being stopped
    _waiting: collections.deque = attrs.field(factory=collections.deque)
    _admitted: int = 0
    _changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _shutdown_requested: trio.Event = attrs.field(factory=trio.Event)
    _stopped: trio.Event = attrs.field(factory=trio.Event)
    _close_requested: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        self.engine_limiter.total_tokens = self.max_concurrency

    @property
    def running(self) -> Job | None:
        """The oldest running job (None when the engine is idle)."""
        return self.active[0] if self.active else None

    @property
    def loaded(self) -> bool:
        return self.opened_at is not None

    @property
    def queue_depth(self) -> int:
        """Jobs waiting for the engine (not the one that owns it)."""
        return len(self._waiting)

    def queue_depths(self) -> dict[str, int]:
        """Waiting jobs per class: ``interactive`` (streaming) and ``batch``."""
        depths = {"interactive": 0, "batch": 0}
        for job in self._waiting:
            depths[job.queue_class] += 1
        return depths

    def queue_order(self) -> list[Job]:
        """The waiting jobs in the order they will run."""
        return sorted(self._waiting, key=Job.sort_key)

    def _next_job(self) -> Job | None:
        if not self._waiting:
            return None
        job = min(self._waiting, key=Job.sort_key)
        self._waiting.remove(job)
        return job

    async def wait_until(self, predicate: Callable[["GenerationService"], bool]) -> None:
        """Return once ``predicate(self)`` holds; re-checked after every change of state."""
        while not predicate(self):
            await self._changed.park()

    def _notify(self) -> None:
        self._changed.unpark_all()

    # -- lifetime ------------------------------------------------------------------------
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Open the engine, serve jobs until shutdown, then close it (the opener's exit)."""
        self.trio_token = trio.lowlevel.current_trio_token()
        task_status.started()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if await self._open(stack):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._enforce_grace)
                        await self._serve_jobs()
                        nursery.cancel_scope.cancel()
                    # The engine stays open (statistics, tokenizer) until the server stops.
                    await self._close_requested.wait()
        finally:
            self._stopped.set()
            self._notify()

    async def _open(self, stack: contextlib.AsyncExitStack) -> bool:
        # The opener waits for a load in progress even when cancelled (waste_open cannot be
        # aborted, and an abandoned thread would outlive the engine).
        try:
            self.engine, self.tokenizer = await stack.enter_async_context(self.opener())
            if self.on_open is not None:
                await self.on_open()
        except Exception as exc:  # reported by /health, every route and the CLI
            self.load_error = exc
            log.error("engine failed to open: %s", exc)
            return False
        else:
            self.opened_at = time.time()
            return True
        finally:
            self.ready.set()
            self._notify()

    async def call_engine(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one blocking engine call in the worker thread, after any running one."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.engine_limiter)

    async def _serve_jobs(self) -> None:
        dispatched: set[int] = set()  # ids of the active jobs whose task has started
        async with trio.open_nursery() as nursery:
            while True:
                for job in self.active:
                    if id(job) not in dispatched:
                        dispatched.add(id(job))
                        nursery.start_soon(self._serve_job, job, dispatched)
                if not self.active and self.shutting_down:
                    return
                await self._changed.park()

    async def _serve_job(self, job: Job, dispatched: set[int]) -> None:
        if not job.cancelled:  # a client that left before its turn: the engine never sees it
            job.started = True
            self._notify()
            token = trio.lowlevel.current_trio_token()
            await trio.to_thread.run_sync(self._run_job, job, token,
                                          limiter=self.engine_limiter)
        self.active.remove(job)
        dispatched.discard(id(job))
        following = self._next_job()
        if following is not None:
            self.active.append(following)
        self._notify()

    # -- admission -----------------------------------------------------------------------
    def admit(self, job: Job) -> trio.MemoryReceiveChannel:
        """Give ``job`` its place (docs/HTTP.md §2.1 step 10); the channel of its events.

        Synchronous, and decided once: from here the place is held until ``leave(job)``.
        A request to an idle engine does not wait, so it never counts against ``max_queue``.

        Raises:
            ShuttingDown, EngineLoading, QueueFull.
        """
        if self.shutting_down:
            raise ShuttingDown()
        if not self.loaded:
            raise EngineLoading()
        full = len(self.active) >= self.max_concurrency
        if full and len(self._waiting) >= self.max_queue:
            raise QueueFull()
        send, receive = trio.open_memory_channel(math.inf)
        job.send = send
        self._admitted += 1
        job.order = self._admitted
        if not full:
            self.active.append(job)
        else:
            self._waiting.append(job)
        self._notify()
        return receive

    def leave(self, job: Job) -> None:
        """The request for ``job`` ended. Idempotent and synchronous (it runs in cleanup).

        A waiting job gives up its place at once; a running one is stopped at the next token
        or prefill chunk. A job whose answer was not read counts as cancelled.
        """
        if job.left:
            return
        job.left = True
        if not job.completed:
            self.requests_cancelled += 1
        job.cancelled = True
        if job in self._waiting:
            self._waiting.remove(job)
        elif job in self.active and job.started and not job.completed:
            self._abort(job)
        self._notify()

    # -- shutdown ------------------------------------------------------------------------
    def request_shutdown(self) -> None:
        """Refuse new jobs, fail the waiting ones, and start the running one's grace.

        Synchronous; the grace (``shutdown_grace_s``, then an abort) runs in the worker.
        """
        if self.shutting_down:
            return
        self.shutting_down = True
        while self._waiting:
            job = self._waiting.popleft()
            job.cancelled = True  # never reaches the engine
            if job.send is not None:
                _deliver(job.send, Failed(ShuttingDown()))
        self._shutdown_requested.set()
        self._notify()

    async def _enforce_grace(self) -> None:
        await self._shutdown_requested.wait()
        with trio.move_on_after(self.shutdown_grace_s):
            await self.wait_until(lambda host: not host.active)
        if self.active:
            log.warning("shutdown: the running generation(s) are aborted after %.0f s",
                        self.shutdown_grace_s)
            self.aborting = True  # the callback returns stop, and abort covers prefill
            for job in list(self.active):
                self._abort(job)
            self._notify()

    async def aclose(self) -> None:
        """Shut down and wait until the worker has stopped and the engine is closed.

        Waits for a load in progress to end (it cannot be aborted). Run shielded: it must
        finish even when the serving lifecycle's own deadline has passed.
        """
        self.request_shutdown()
        self._close_requested.set()
        await self.ready.wait()
        await self._stopped.wait()

    def _abort(self, job: Job) -> None:
        """Stop ``job``'s generation: the only one on a one-at-a-time engine, else by key."""
        if self.max_concurrency == 1:
            self._engine().abort()
        else:
            cast(ConcurrentEngine, self._engine()).abort(job)

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("the engine is not open")
        return self.engine

    # -- the worker thread --------------------------------------------------------------
    def _run_job(self, job: Job, token: trio.lowlevel.TrioToken) -> None:
        engine = self._engine()
        send = job.send
        assert send is not None, "admit gave the job its channel"

        def deliver(item: object) -> None:
            token.run_sync_soon(_deliver, send, item)

        def on_token(event: TokenEvent) -> bool:
            if job.first_token_at is None:
                job.first_token_at = time.perf_counter()
            outputs = job.assembler.on_token(event)
            if job.constraint is not None:
                job.constraint.observe(event.token)
            if outputs:
                deliver(Released(tuple(outputs)))
            return job.cancelled or self.aborting or job.assembler.should_stop

        deliver(Started((time.perf_counter() - job.enqueued_at) * 1000))
        try:
            # ``leave`` sets ``cancelled`` before it calls ``abort``: an abort that lands
            # before the engine's fresh start is seen through ``is_cancelled`` instead.
            masked: dict[str, Any] = {"mask": job.constraint} if job.constraint is not None else {}
            if self.max_concurrency > 1:
                masked["key"] = job  # a ConcurrentEngine: ``_abort`` stops this call alone
            result = engine.generate(Prompt(ids=tuple(job.prompt), images=job.images),
                                     job.params, on_token, is_cancelled=lambda: job.cancelled,
                                     **masked)
        except Cancelled:
            result = None  # aborted: the client left, or the shutdown grace ran out
        except ContextFull as exc:  # the prompt outgrew the context once images expanded
            if exc.prompt_tokens is None or exc.ctx_tokens is None:
                return self._fail(deliver, exc)
            return self._fail(deliver, ContextLengthExceeded(exc.prompt_tokens, exc.ctx_tokens,
                                                             job.ctx_param))
        except BaseException as exc:  # every failure reaches its request, never the loop
            return self._fail(deliver, exc)
        stopped_from_outside = result is None or (
            result.stop_reason == "callback" and not job.assembler.should_stop)
        if result is None or stopped_from_outside:
            if self.aborting and not job.cancelled:
                deliver(Failed(ShuttingDown()))
            return  # a client that left reads nothing more
        deliver(Finished(result, tuple(job.assembler.finish()), result.prompt_tokens))

    @staticmethod
    def _fail(deliver: Callable[[object], None], exc: BaseException) -> None:
        # The engine starts every generation from a fresh state, so nothing is reset here.
        log.warning("generation failed: %s", exc)
        deliver(Failed(exc))


__all__ = ["GenerationService", "EngineOpener", "Job", "Started", "Released", "Finished",
           "Failed", "QueueFull", "ShuttingDown", "EngineLoading", "EngineLoadFailed"]
