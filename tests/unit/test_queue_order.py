"""The generation service's queue order (docs/HTTP.md §2.1): lower ``priority`` first, then
streaming (interactive) before non-streaming (batch), FIFO within each; the running job is
never preempted. Ordered with trio.testing.Sequencer and the service's own state changes:
no sleeps, no timing."""

from __future__ import annotations

import contextlib
import threading

import pytest
import trio
import trio.testing

from waste.domain.ports import EngineStats, GenerationResult, SamplingParams, TokenEvent
from waste.domain.reply.assembler import ReplyAssembler
from waste.domain.reply.text import TextReader
from waste.service import Finished, GenerationService, Job


class GateEngine:
    """Runs each prompt as one token; the first generation waits for ``release``."""

    def __init__(self) -> None:
        self.order: list[int] = []
        self.release = threading.Event()
        self.holding = True

    def generate(self, prompt, params, on_token, *, is_cancelled=None):
        if self.holding:
            self.holding = False
            assert self.release.wait(60), "the test never released the first generation"
        self.order.append(prompt.ids[0])
        on_token(TokenEvent(index=0, token=1, piece=b"x", logprob=0.0, is_stop=True))
        return GenerationResult(prompt_tokens=1, tokens_generated=1, stop_reason="token",
                                experts_hit=0, experts_missed=0, bytes_read=0, prefill_ms=0.0,
                                decode_ms=0.0, direct_io=True)

    def abort(self) -> None:
        pass

    def statistics(self) -> EngineStats:
        return EngineStats(tokens_generated=0, experts_hit=0, experts_missed=0, bytes_read=0,
                           direct_io=True, io_note=None, budget_bytes=0, peak_bytes=0)


def job(tag: int, *, stream: bool = False, priority: int = 0) -> Job:
    return Job(prompt=[tag], params=SamplingParams(), interactive=stream, priority=priority,
               assembler=ReplyAssembler.create(TextReader()))


async def run_queue(jobs_in_admission_order: list[Job]) -> tuple[list[int], list[dict]]:
    """Admit a first job that holds the engine, then the others in the given order (each
    from its own task, sequenced); release; the order the engine ran them in."""
    engine = GateEngine()

    @contextlib.asynccontextmanager
    async def opener():
        yield engine, engine

    service = GenerationService(opener=opener)
    depths: list[dict] = []
    seq = trio.testing.Sequencer()

    async def request(n: int, j: Job) -> None:
        async with seq(n):
            receive = service.admit(j)
        async for event in receive:
            if isinstance(event, Finished):
                j.completed = True
                break
        service.leave(j)

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.ready.wait()
        holder = job(0)
        nursery.start_soon(request, 0, holder)
        await service.wait_until(lambda s: holder.started)
        async with trio.open_nursery() as requests:
            for n, j in enumerate(jobs_in_admission_order, start=1):
                requests.start_soon(request, n, j)
            last = len(jobs_in_admission_order)
            async with seq(last + 1):  # every job is admitted, none has run
                depths.append(service.queue_depths())
                depths.append({"order": [j.prompt[0] for j in service.queue_order()]})
                engine.release.set()
        await service.aclose()
        nursery.cancel_scope.cancel()
    return engine.order[1:], depths


async def test_streaming_overtakes_queued_non_streaming_fifo_within_each_class():
    order, depths = await run_queue([job(1), job(2, stream=True), job(3), job(4, stream=True)])
    assert order == [2, 4, 1, 3]
    assert depths[0] == {"interactive": 2, "batch": 2}
    assert depths[1] == {"order": [2, 4, 1, 3]}


async def test_priority_orders_explicitly_before_the_class():
    order, _ = await run_queue([job(1, stream=True), job(2, priority=-1), job(3, priority=5, stream=True),
                                job(4), job(5, priority=-1, stream=True)])
    assert order == [5, 2, 1, 4, 3]


async def test_all_equal_is_fifo():
    order, _ = await run_queue([job(n) for n in range(1, 6)])
    assert order == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("value", ["1", 1.5, True, [0], 2**63])
def test_priority_must_be_an_integer(value):
    from waste.domain.errors import InvalidRequest
    from waste.domain.requests.parse import parse_chat_request, parse_completion_request

    for parse, body in ((parse_chat_request, {"messages": [{"role": "user", "content": "hi"}]}),
                        (parse_completion_request, {"prompt": "hi"})):
        with pytest.raises(InvalidRequest) as info:
            parse({**body, "priority": value})
        assert info.value.param == "priority"
    assert parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "priority": -3}).priority == -3
    assert parse_completion_request({"prompt": "hi"}).priority == 0
