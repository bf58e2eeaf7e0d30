"""The two completion routes: validate, plan, admit, and answer blocking or as SSE.

Admission happens once, in the route, before any header (docs/HTTP.md §2.1 step 10), so every
refusal is plain JSON. The admitted job's place is then held until the HTTP exchange ends:
the body generator leaves the queue when it finishes or is closed, and ``exchange.hold``
covers a body that never started (docs/STACK.md pitfall 4: it would run no ``finally``).
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import time
from typing import AsyncIterator, Callable

import trio
from quart import Response, request

from waste.adapters.http.errors import envelope, to_api_error
from waste.adapters.http.exchange import hold
from waste.adapters.http.state import ServerState
from waste.adapters.http.wire import (SSE_KEEPALIVE, ChatChunks, CompletionChunks,
                                      chat_response, completion_response, dumps, new_id, sse,
                                      usage, waste_object)
from waste.domain.reply.assembler import ReplyAssembler
from waste.domain.reply.text import TextReader
from waste.domain.ports import SamplingParams
from waste.domain.errors import ContextLengthExceeded, InvalidRequest
from waste.domain.requests import parse_chat_request, parse_completion_request, parse_json_body
from waste.service import Failed, Finished, Job, Released, Started


async def read_json_body() -> dict:
    raw = await request.get_data(cache=False, as_text=False)
    return parse_json_body(raw if isinstance(raw, bytes) else raw.encode("utf-8"))


def _sampling(req, prompt_len: int, ctx: int, default_max: int, stop_ids, param: str):
    if prompt_len >= ctx:
        raise ContextLengthExceeded(prompt_len, ctx, param)
    seed = req.seed if req.seed is not None else secrets.randbelow(2 ** 53)
    cap = min(req.max_tokens or default_max, ctx - prompt_len)
    return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                          seed=seed, max_tokens=cap, stop_ids=tuple(stop_ids))


async def chat_completions(state: ServerState) -> Response:
    body = await read_json_body()
    info = state.require_loaded()
    fmt = state.chat_format
    fmt.require_usable()
    req = parse_chat_request(body)
    fmt.check_request(req)
    # Decoding up to 8 × 50 MP must not stall the event loop (/health answers at once).
    images = await trio.to_thread.run_sync(functools.partial(
        state.decode_images, req.image_parts, vision=state.config.vision and info.vision,
        allow_local=state.config.allow_local_images))
    plan = fmt.plan(req, default_thinking=state.config.thinking_default,
                    image_sizes=[(i.width, i.height) for i in images])
    prompt = await state.tokenize_segments(plan.segments)
    params = _sampling(req, len(prompt), info.ctx_tokens, state.config.max_tokens,
                       plan.stop_ids, "messages")
    job = Job(prompt=prompt, params=params, images=tuple(images), ctx_param="messages",
              assembler=ReplyAssembler.create(plan.new_reader(), req.stop))
    return await _answer(state, job, req, "chatcmpl-", ChatChunks, chat_response)


async def completions(state: ServerState) -> Response:
    body = await read_json_body()
    info = state.require_loaded()
    req = parse_completion_request(body)
    state.require_tokenizer("prompt")
    tokenizer = state.tokenizer
    prompt = await state.call_tokenizer(tokenizer.tokenize, req.prompt)
    if not prompt:
        raise InvalidRequest("prompt must not be empty", "prompt", "invalid_value")
    stop_ids = {info.eos_id} if info.eos_id is not None else set()
    stop_ids.update(state.chat_format.end_ids)
    params = _sampling(req, len(prompt), info.ctx_tokens, state.config.max_tokens,
                       sorted(stop_ids), "prompt")
    reader = TextReader(stop_ids=frozenset(stop_ids))
    job = Job(prompt=prompt, params=params, ctx_param="prompt",
              assembler=ReplyAssembler.create(reader, req.stop))
    return await _answer(state, job, req, "cmpl-", CompletionChunks, completion_response)


async def _answer(state: ServerState, job: Job, req, id_prefix: str, chunks_type,
                  build_response) -> Response:
    """Admission (docs/HTTP.md §2.1 step 10), then a stream or a blocking answer."""
    events = state.service.admit(job)  # decided once; the place is held from here on
    hold(functools.partial(state.service.leave, job))
    ident = new_id(id_prefix)
    created = int(time.time())
    if req.stream:
        chunks = chunks_type(id=ident, created=created, model=state.config.model_id,
                             include_usage=req.include_usage, logprobs=req.logprobs)
        return _stream(state, job, events, chunks, ident)
    return await _blocking(state, job, events, ident, created, req.logprobs, build_response)


def _account(state: ServerState, job: Job, done: Finished, queue_ms: float) -> tuple[dict, dict]:
    """Usage and the ``waste`` object for a finished job; counts it in the metrics."""
    result = done.result
    state.completed_requests += 1
    m = state.metrics
    m.prompt_tokens += done.prompt_tokens
    m.generated_tokens += result.tokens_generated
    m.queue_s += queue_ms / 1000
    m.prefill_s += result.prefill_ms / 1000
    m.decode_s += result.decode_ms / 1000
    reader = job.assembler.reader
    reasoning = None if isinstance(reader, TextReader) else job.assembler.reasoning_tokens
    usage_body = usage(done.prompt_tokens, result.tokens_generated, reasoning)
    waste = waste_object(prompt_tokens=done.prompt_tokens, result=result, queue_ms=queue_ms,
                         seed=job.params.seed, stats=state.engine.statistics(),
                         requests=state.completed_requests)
    return usage_body, waste


async def _blocking(state: ServerState, job: Job, events, ident: str, created: int,
                    logprobs: bool, build) -> Response:
    queue_ms = 0.0
    try:
        async for event in events:
            if isinstance(event, Started):
                queue_ms = event.queue_ms
            elif isinstance(event, Failed):
                job.completed = True
                raise event.error
            elif isinstance(event, Finished):
                job.completed = True
                usage_body, waste = _account(state, job, event, queue_ms)
                finish = job.assembler.finish_reason(event.result.stop_reason)
                body = build(id=ident, created=created, model=state.config.model_id,
                             assembler=job.assembler, finish_reason=finish,
                             usage_body=usage_body, waste=waste, logprobs=logprobs)
                return Response(dumps(body), 200, {"x-request-id": ident},
                                content_type="application/json")
    finally:
        state.service.leave(job)
    raise RuntimeError("the engine worker ended without an answer")


def _stream(state: ServerState, job: Job, events, chunks, ident: str) -> Response:
    render = functools.partial(_render_event, state, job, chunks, {"queue_ms": 0.0})

    async def body():
        try:
            writes = sse_writes(events, render, keepalive_s=state.config.keepalive_s,
                                first=chunks.first())
            async with contextlib.aclosing(writes):
                async for text in writes:
                    yield text
        finally:
            state.service.leave(job)

    response = Response(body(), 200, {
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no", "x-request-id": ident})
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long generations
    return response


async def sse_writes(events: trio.MemoryReceiveChannel,
                     render: Callable[[object], tuple[str, bool]], *, keepalive_s: float,
                     first: str = "") -> AsyncIterator[str]:
    """What one stream writes: ``first``, then each batch of rendered events, until an event
    renders as done; a late error becomes one SSE event (docs/HTTP.md §4.3).

    A ``: keep-alive`` comment goes out whenever ``keepalive_s`` pass with nothing written,
    measured from the last write: events that write nothing (the job leaving the queue)
    do not restart the interval.
    """
    try:
        if first:
            yield first
        deadline = trio.current_time() + keepalive_s
        while True:
            # Never yield inside a cancel scope: the consumer would run under it.
            event = None
            with trio.move_on_at(deadline):
                event = await events.receive()
            if event is None:
                yield SSE_KEEPALIVE
                deadline = trio.current_time() + keepalive_s
                continue
            text, done = render(event)
            while not done:  # batch whatever else is already queued
                try:
                    more = events.receive_nowait()
                except trio.WouldBlock:
                    break
                extra, done = render(more)
                text += extra
            if text:
                yield text
                deadline = trio.current_time() + keepalive_s
            if done:
                return
    except Exception as exc:  # a late error is one SSE event, then the stream ends
        yield sse(envelope(to_api_error(exc)))


def _render_event(state, job, chunks, timing: dict, event) -> tuple[str, bool]:
    """One event as stream text, and whether the stream ends with it."""
    if isinstance(event, Started):
        timing["queue_ms"] = event.queue_ms
        return "", False
    if isinstance(event, Released):
        return chunks.outputs(event.outputs), False
    if isinstance(event, Failed):
        job.completed = True
        return sse(envelope(to_api_error(event.error))), True
    if isinstance(event, Finished):
        job.completed = True
        usage_body, waste = _account(state, job, event, timing["queue_ms"])
        text = chunks.outputs(event.outputs)
        finish = job.assembler.finish_reason(event.result.stop_reason)
        return text + chunks.final(finish, waste, usage_body), True
    return "", False


__all__ = ["chat_completions", "completions"]
