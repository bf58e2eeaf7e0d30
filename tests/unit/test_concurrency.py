"""The generation service with ``max_concurrency`` > 1 (a remote batching engine): up to N
jobs run at once, each in its own worker thread; the rest wait in the usual order; a request
that leaves aborts its own call alone (``abort(key)``); shutdown aborts every running call
after the grace. Ordered with the service's own state changes and threading events: no
sleeps, no timing."""

from __future__ import annotations

import contextlib
import threading

import pytest
import trio

from waste.domain.ports import (Cancelled, EngineStats, GenerationResult, SamplingParams,
                                TokenEvent)
from waste.domain.reply.assembler import ReplyAssembler
from waste.domain.reply.text import TextReader
from waste.service import Failed, Finished, GenerationService, Job, ShuttingDown

LIMIT_S = 30.0  # a safety net for a broken contract, never a synchronisation


class KeyedGateEngine:
    """Each generation waits at its gate until released (one token) or aborted by key."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.gates: dict[int, threading.Event] = {}  # prompt tag -> its gate
        self.aborted: list[int] = []  # tags whose call was aborted, in order
        self.abort_keys: list[object] = []
        self.keys: dict[int, object] = {}
        self.running = 0
        self.most_at_once = 0

    def gate(self, tag: int) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(tag, threading.Event())

    def generate(self, prompt, params, on_token, *, is_cancelled=None, key=None):
        tag = prompt.ids[0]
        with self.lock:
            self.keys[tag] = key
            self.lock.notify_all()
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            assert self.gate(tag).wait(LIMIT_S), f"generation {tag} was never released"
            if tag in self.aborted:
                raise Cancelled(f"generation {tag} aborted")
            on_token(TokenEvent(index=0, token=1, piece=b"x", logprob=0.0, is_stop=True))
            return GenerationResult(prompt_tokens=1, tokens_generated=1, stop_reason="token",
                                    experts_hit=0, experts_missed=0, bytes_read=0,
                                    prefill_ms=0.0, decode_ms=0.0, direct_io=False)
        finally:
            with self.lock:
                self.running -= 1

    def wait_entered(self, n: int) -> None:
        """Block until ``n`` generations have entered ``generate``."""
        with self.lock:
            assert self.lock.wait_for(lambda: len(self.keys) >= n, LIMIT_S)

    def abort(self, key: object = None) -> None:
        self.abort_keys.append(key)
        with self.lock:
            tags = [t for t, k in self.keys.items() if key is None or k is key]
        for tag in tags:
            self.aborted.append(tag)
            self.gate(tag).set()

    def statistics(self) -> EngineStats:
        return EngineStats(tokens_generated=0, experts_hit=0, experts_missed=0, bytes_read=0,
                           direct_io=False, io_note=None, budget_bytes=0, peak_bytes=0)


def job(tag: int) -> Job:
    return Job(prompt=[tag], params=SamplingParams(), interactive=True,
               assembler=ReplyAssembler.create(TextReader()))


@contextlib.asynccontextmanager
async def serving(engine: KeyedGateEngine, **kwargs):
    @contextlib.asynccontextmanager
    async def opener():
        yield engine, engine

    service = GenerationService(opener=opener, **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.ready.wait()
        yield service, nursery
        await service.aclose()


async def request(service: GenerationService, j: Job, outcomes: dict) -> None:
    receive = service.admit(j)
    try:
        async for event in receive:
            if isinstance(event, (Finished, Failed)):
                j.completed = True
                outcomes[j.prompt[0]] = event
                break
    finally:
        service.leave(j)


async def test_n_run_at_once_the_rest_wait_in_order():
    engine = KeyedGateEngine()
    outcomes: dict = {}
    async with serving(engine, max_concurrency=3) as (service, nursery):
        jobs = [job(tag) for tag in range(5)]
        for j in jobs:
            nursery.start_soon(request, service, j, outcomes)
            await service.wait_until(lambda s, j=j: j in s.active or j in s.queue_order())
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: sum(j.started for j in jobs) == 3)
        assert [j.started for j in jobs] == [True, True, True, False, False]
        assert service.queue_depth == 2 and len(service.active) == 3
        assert service.running is jobs[0]
        # started is the service's word; the engine counts calls that entered generate
        await trio.to_thread.run_sync(engine.wait_entered, 3)
        engine.gate(1).set()  # the second finishes: the fourth takes its place
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: jobs[3].started and 1 in outcomes)
        assert not jobs[4].started and service.queue_depth == 1
        await trio.to_thread.run_sync(engine.wait_entered, 4)
        for tag in (0, 2, 3, 4):
            engine.gate(tag).set()
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: len(outcomes) == 5)
    assert all(isinstance(outcomes[t], Finished) for t in range(5))
    assert engine.most_at_once == 3 and engine.abort_keys == []
    # each call got its own key: the job
    assert [engine.keys[t] for t in range(5)] == jobs


async def test_a_request_that_leaves_aborts_its_own_call_only():
    engine = KeyedGateEngine()
    outcomes: dict = {}
    async with serving(engine, max_concurrency=4) as (service, nursery):
        jobs = [job(tag) for tag in range(3)]
        scopes = []
        for j in jobs:
            scope = trio.CancelScope()
            scopes.append(scope)

            async def one(j=j, scope=scope) -> None:
                with scope:
                    await request(service, j, outcomes)

            nursery.start_soon(one)
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: all(j.started for j in jobs))
            await trio.to_thread.run_sync(engine.wait_entered, 3)
        scopes[1].cancel()  # the client of the second request disconnects
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: jobs[1] not in s.active)
        assert engine.abort_keys == [jobs[1]] and engine.aborted == [1]
        assert service.requests_cancelled == 1
        for tag in (0, 2):
            engine.gate(tag).set()
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: not s.active)
    assert isinstance(outcomes[0], Finished) and isinstance(outcomes[2], Finished)
    assert 1 not in outcomes


async def test_shutdown_aborts_every_running_call_after_the_grace():
    engine = KeyedGateEngine()
    outcomes: dict = {}
    async with serving(engine, max_concurrency=2, shutdown_grace_s=0.0) as (service, nursery):
        jobs = [job(tag) for tag in range(3)]
        for j in jobs:
            nursery.start_soon(request, service, j, outcomes)
            await service.wait_until(lambda s, j=j: j in s.active or j in s.queue_order())
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: jobs[0].started and jobs[1].started)
            await trio.to_thread.run_sync(engine.wait_entered, 2)
        service.request_shutdown()
        with trio.fail_after(LIMIT_S):
            await service.wait_until(lambda s: len(outcomes) == 3)
    assert sorted(engine.aborted) == [0, 1] and set(engine.abort_keys) == {jobs[0], jobs[1]}
    assert all(isinstance(outcomes[t], Failed) and isinstance(outcomes[t].error, ShuttingDown)
               for t in range(3))


def test_concurrency_below_one_is_refused():
    with pytest.raises(ValueError, match="max_concurrency"):
        GenerationService(opener=lambda: None, max_concurrency=0)
