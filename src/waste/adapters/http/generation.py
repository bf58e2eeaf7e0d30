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
from typing import Any, AsyncIterator, Callable, TypeVar

import trio
from quart import Response, request

from waste.adapters.http.errors import envelope, to_api_error
from waste.adapters.http.exchange import hold, outcome
from waste.adapters.http.metrics import RequestTimes
from waste.adapters.http.state import ServerState
from waste.adapters.http.wire import (SSE_KEEPALIVE, ChatChunks, CompletionChunks,
                                      chat_response, completion_response, dumps, new_id, sse,
                                      usage, waste_object)
from waste.domain.reply.assembler import ReplyAssembler
from waste.domain.reply.constraint import AnswerConstraint
from waste.domain.reply.text import TextReader
from waste.domain.ports import SamplingParams
from waste.domain.errors import ContextLengthExceeded, InvalidRequest
from waste.domain.requests import parse_chat_request, parse_completion_request, parse_json_body
from waste.domain.requests.fields import check_logit_bias_ids
from waste.service import Failed, Finished, Job, Released, ShuttingDown, Started


T = TypeVar("T")
LARGE_BODY_BYTES = 256 * 1024  # above this, parse_work leaves the event loop


async def read_json_body(state: ServerState) -> dict:
    """The request's JSON object. An upload still arriving when shutdown starts is cut off
    with 503 ``shutting_down`` (a stalled client must not hold the server past its stop)."""
    with state.upload_scope() as scope:
        raw = await request.get_data(cache=False, as_text=False)
    if scope.cancelled_caught:
        raise ShuttingDown()
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8")
    outcome()["body_bytes"] = len(data)
    return await parse_work(state, parse_json_body, data)


async def parse_work(state: ServerState, fn: Callable[..., T], *args: Any) -> T:
    """Parsing, validating or rendering this request's body: inline for a small body; for
    a large one (a 7 MB, 200k-message body took 20 s) in a worker thread under the parse
    limiter, so the event loop keeps answering and large bodies are handled one at a time
    (memory stays proportional to one of them)."""
    if outcome().get("body_bytes", 0) <= LARGE_BODY_BYTES:
        return fn(*args)
    return await trio.to_thread.run_sync(functools.partial(fn, *args),
                                         limiter=state.parse_limiter)


def _sampling(req, prompt_len: int, ctx: int, default_max: int, stop_ids, param: str):
    if prompt_len >= ctx:
        raise ContextLengthExceeded(prompt_len, ctx, param)
    seed = req.seed if req.seed is not None else secrets.randbelow(2 ** 53)
    cap = min(req.max_tokens or default_max, ctx - prompt_len)
    return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                          seed=seed, max_tokens=cap, stop_ids=tuple(stop_ids),
                          logit_bias=req.logit_bias, presence_penalty=req.presence_penalty,
                          frequency_penalty=req.frequency_penalty,
                          repetition_penalty=req.repetition_penalty, min_p=req.min_p,
                          top_logprobs=req.top_logprobs)


async def chat_completions(state: ServerState) -> Response:
    body = await read_json_body(state)
    info = state.require_loaded()
    fmt = state.chat_format
    fmt.require_usable()
    req = await parse_work(state, _parse_chat, fmt, body)
    check_logit_bias_ids(req.logit_bias, info.vocab)
    images = await _decode_images(state, req, vision=info.vision) if req.image_parts else []
    plan = await parse_work(state, functools.partial(
        fmt.plan, req, default_thinking=state.config.thinking_default,
        image_sizes=[(i.width, i.height) for i in images]))
    prompt = await state.tokenize_segments(plan.segments)
    params = _sampling(req, len(prompt), info.ctx_tokens, state.config.max_tokens,
                       plan.stop_ids, "messages")
    assembler = ReplyAssembler.create(plan.new_reader(), req.stop)
    job = Job(prompt=prompt, params=params, images=tuple(images), ctx_param="messages",
              interactive=req.stream, priority=req.priority, assembler=assembler,
              constraint=await _answer_constraint(state, req, plan, assembler))
    return await _answer(state, job, req, "chatcmpl-", ChatChunks, chat_response)


def _parse_chat(fmt, body: dict):
    req = parse_chat_request(body)
    fmt.check_request(req)
    return req


async def _decode_images(state: ServerState, req, *, vision: bool) -> list:
    """Decoding up to 8 × 50 MP runs in a worker thread (the event loop keeps answering),
    under the image path's own limiter: a slow image borrows no thread that text-only
    requests or the tokenizer need. A text-only request never comes here."""
    return await trio.to_thread.run_sync(functools.partial(
        state.decode_images, req.image_parts, vision=state.config.vision and vision,
        allow_local=state.config.allow_local_images), limiter=state.image_limiter)


async def _answer_constraint(state: ServerState, req, plan, assembler) -> AnswerConstraint | None:
    """The grammar a json_object / json_schema response_format puts on the answer."""
    kind = (req.response_format or {}).get("type")
    if kind not in ("json_object", "json_schema"):
        return None
    if state.grammar is None or not plan.stop_ids:
        raise InvalidRequest("This model's chat format cannot constrain a response_format answer.",
                             "response_format", "unsupported_value")
    schema = None
    param = "response_format"
    if kind == "json_schema":
        spec = req.response_format.get("json_schema") or {}
        schema = spec.get("schema")
        param = "response_format.json_schema.schema"
        if schema is None:
            raise InvalidRequest("response_format.json_schema.schema is required for a json_schema "
                                 "response.", param, "missing_required_parameter")
    factory = await state.call_tokenizer(state.grammar.json_schema, schema, param)
    tokenizer = state.service.tokenizer
    assert tokenizer is not None, "a chat format resolved, so the engine is open"
    end = tuple(await state.call_tokenizer(tokenizer.tokenize_markup, plan.answer_end)) \
        if plan.answer_end else plan.stop_ids[:1]
    return AnswerConstraint(reader=assembler.reader, matcher=factory(end[:1]), end_sequence=end)


async def completions(state: ServerState) -> Response:
    body = await read_json_body(state)
    info = state.require_loaded()
    req = await parse_work(state, parse_completion_request, body)
    check_logit_bias_ids(req.logit_bias, info.vocab)
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
              interactive=req.stream, priority=req.priority, assembler=ReplyAssembler.create(reader, req.stop))
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


def _account(state: ServerState, job: Job, done: Finished, queue_ms: float,
             arrived: float) -> tuple[dict, dict]:
    """Usage and the ``waste`` object for a finished job; counts it in the metrics."""
    result = done.result
    state.completed_requests += 1
    first = job.first_token_at
    state.metrics.observe(RequestTimes(
        queue_s=queue_ms / 1000, prefill_s=result.prefill_ms / 1000,
        decode_s=result.decode_ms / 1000,
        first_token_s=None if first is None else first - arrived,
        e2e_s=time.perf_counter() - arrived, prompt_tokens=done.prompt_tokens,
        generated_tokens=result.tokens_generated))
    reader = job.assembler.reader
    reasoning = None if isinstance(reader, TextReader) else job.assembler.reasoning_tokens
    usage_body = usage(done.prompt_tokens, result.tokens_generated, reasoning,
                       result.cached_tokens)
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
                usage_body, waste = _account(state, job, event, queue_ms,
                                             outcome()["arrived"])
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
    # How the stream ends is its status in the metrics: 200 once [DONE] went out, an error
    # event's status, or (never set) the client left first.
    record = outcome()
    timing = {"queue_ms": 0.0, "arrived": record["arrived"]}
    render = functools.partial(_render_event, state, job, chunks, timing)

    async def body():
        try:
            writes = sse_writes(events, render, keepalive_s=state.config.keepalive_s,
                                first=chunks.first(), on_error=_record_error(record))
            async with contextlib.aclosing(writes):
                async for text in writes:
                    yield text
                    if timing.get("done"):
                        record["status"] = timing["done"]
        finally:
            state.service.leave(job)

    response = Response(body(), 200, {
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no", "x-request-id": ident})
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long generations
    return response


def _record_error(record: dict) -> Callable[[BaseException], None]:
    def on_error(exc: BaseException) -> None:
        record["status"] = to_api_error(exc).status

    return on_error


async def sse_writes(events: trio.MemoryReceiveChannel,
                     render: Callable[[object], tuple[str, bool]], *, keepalive_s: float,
                     first: str = "",
                     on_error: Callable[[BaseException], None] | None = None
                     ) -> AsyncIterator[str]:
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
        if on_error is not None:
            on_error(exc)
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
        error = to_api_error(event.error)
        timing["done"] = error.status
        return sse(envelope(error)), True
    if isinstance(event, Finished):
        job.completed = True
        timing["done"] = 200
        usage_body, waste = _account(state, job, event, timing["queue_ms"], timing["arrived"])
        text = chunks.outputs(event.outputs)
        finish = job.assembler.finish_reason(event.result.stop_reason)
        return text + chunks.final(finish, waste, usage_body), True
    return "", False


__all__ = ["chat_completions", "completions"]
