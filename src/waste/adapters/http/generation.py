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
from typing import Any, AsyncIterator, Callable, Iterator, TypeVar

import attrs
import trio
from quart import Response, request

from waste.adapters.http.errors import envelope, to_api_error
from waste.adapters.http.exchange import PeerEof, hold, outcome, peer_eof, probe_delays
from waste.adapters.http.metrics import RequestTimes
from waste.adapters.http.state import ServerState
from waste.adapters.http.wire import (SSE_KEEPALIVE, ChatChunks, CompletionChunks,
                                      chat_response, completion_response, dumps, new_id,
                                      response_body, sse, usage, waste_object)
from waste.domain.reply.assembler import ReplyAssembler
from waste.domain.reply.constraint import AnswerConstraint, ReplyConstraint
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
    jobs = []
    for index in range(req.n):
        assembler = ReplyAssembler.create(plan.new_reader(), req.stop)
        jobs.append(Job(prompt=prompt, params=_choice_params(params, index), images=tuple(images),
                        ctx_param="messages", interactive=req.stream, priority=req.priority,
                        assembler=assembler,
                        constraint=await _answer_constraint(state, req, plan, assembler)))
    return await _answer(state, jobs, req, "chatcmpl-", ChatChunks, chat_response)


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index`` of an ``n > 1`` request samples with seed + index (mod 2**64)."""
    return attrs.evolve(params, seed=(params.seed + index) % 2 ** 64)


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


async def _answer_constraint(state: ServerState, req, plan, assembler
                             ) -> AnswerConstraint | ReplyConstraint | None:
    """The grammar a json_object / json_schema response_format puts on the answer, or, with
    tools declared, the plan's grammar of the whole reply (docs/DECISIONS.md)."""
    if plan.reply_grammar is not None and state.grammar is None and req.tool_choice in (None, "auto"):
        # An engine that cannot apply our token mask (vLLM): with tool_choice auto the reply
        # is parsed as generated, unconstrained; a forced call is refused below, since it
        # could not be guaranteed (docs/DECISIONS.md, issue 15).
        plan = attrs.evolve(plan, reply_grammar=None)
    if plan.reply_grammar is not None:
        if state.grammar is None:
            raise InvalidRequest("This server's engine cannot force a tool call (it applies no token "
                                 "mask): use tool_choice auto or none.", "tool_choice", "unsupported_value")
        grammar = plan.reply_grammar
        factory = await state.call_tokenizer(state.grammar.lark, grammar.lark, grammar.schemas)
        return ReplyConstraint(matcher=factory())
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
    jobs = [Job(prompt=prompt, params=_choice_params(params, index), ctx_param="prompt",
                interactive=req.stream, priority=req.priority,
                assembler=ReplyAssembler.create(TextReader(stop_ids=frozenset(stop_ids)), req.stop))
            for index in range(req.n)]
    return await _answer(state, jobs, req, "cmpl-", CompletionChunks, completion_response)


async def _answer(state: ServerState, jobs: list[Job], req, id_prefix: str, chunks_type,
                  build_response) -> Response:
    """Admission (docs/HTTP.md §2.1 step 10) of every choice's job at once, then a stream or
    a blocking answer. The jobs run one after another (one engine); from the second on the
    engine's prefix cache restores the prompt's state, so only its last token is evaluated."""
    admitted: list[tuple[Job, Any]] = []
    try:
        for job in jobs:  # decided once; the places are held from here on
            admitted.append((job, state.service.admit(job)))
            hold(functools.partial(state.service.leave, job))
    except Exception:
        for job, _ in admitted:  # refused as a whole: the admitted choices were never asked for
            job.completed = True
            state.service.leave(job)
        raise
    ident = new_id(id_prefix)
    created = int(time.time())
    if req.stream:
        chunks = chunks_type(id=ident, created=created, model=state.config.model_id,
                             include_usage=req.include_usage, logprobs=req.logprobs)
        return _stream(state, admitted, chunks, ident)
    return await _blocking(state, admitted, ident, created, req.logprobs, build_response)


def _observe(state: ServerState, job: Job, done: Finished, queue_ms: float,
             arrived: float) -> None:
    """Count one finished choice in the metrics."""
    result = done.result
    first = job.first_token_at
    state.metrics.observe(RequestTimes(
        queue_s=queue_ms / 1000, prefill_s=result.prefill_ms / 1000,
        decode_s=result.decode_ms / 1000,
        first_token_s=None if first is None else first - arrived,
        e2e_s=time.perf_counter() - arrived, prompt_tokens=done.prompt_tokens,
        generated_tokens=result.tokens_generated))


def _account(state: ServerState, finished: list[tuple[Job, Finished]],
             queue_ms: float) -> tuple[dict, dict]:
    """Usage and the ``waste`` object for a request whose choices all finished: the prompt
    counted once, the completion tokens of every choice summed (so are the ``waste``
    counters; ``cached_tokens`` and ``seed`` are the first choice's)."""
    state.completed_requests += 1
    first_job, first = finished[0]
    results = [done.result for _, done in finished]
    result = attrs.evolve(
        first.result, tokens_generated=sum(r.tokens_generated for r in results),
        experts_hit=sum(r.experts_hit for r in results),
        experts_missed=sum(r.experts_missed for r in results),
        bytes_read=sum(r.bytes_read for r in results),
        guesses=sum(r.guesses for r in results), guess_hits=sum(r.guess_hits for r in results),
        wasted_bytes=sum(r.wasted_bytes for r in results),
        prefill_ms=sum(r.prefill_ms for r in results),
        decode_ms=sum(r.decode_ms for r in results))
    reader = first_job.assembler.reader
    reasoning = None if isinstance(reader, TextReader) else \
        sum(job.assembler.reasoning_tokens for job, _ in finished)
    usage_body = usage(first.prompt_tokens, result.tokens_generated, reasoning,
                       result.cached_tokens)
    waste = waste_object(prompt_tokens=first.prompt_tokens, result=result, queue_ms=queue_ms,
                         seed=first_job.params.seed, stats=state.engine.statistics(),
                         requests=state.completed_requests)
    return usage_body, waste


async def _blocking(state: ServerState, admitted: list[tuple[Job, Any]], ident: str,
                    created: int, logprobs: bool, build) -> Response:
    queue_ms = 0.0
    arrived = outcome()["arrived"]
    finished: list[tuple[Job, Finished]] = []
    try:
        for index, (job, events) in enumerate(admitted):
            async for event in events:
                if isinstance(event, Started):
                    if index == 0:
                        queue_ms = event.queue_ms
                elif isinstance(event, Failed):
                    job.completed = True
                    raise event.error
                elif isinstance(event, Finished):
                    job.completed = True
                    _observe(state, job, event, queue_ms, arrived)
                    finished.append((job, event))
                    break
            else:
                raise RuntimeError("the engine worker ended without an answer")
        usage_body, waste = _account(state, finished, queue_ms)
        choices = [build(index=index, assembler=job.assembler, logprobs=logprobs,
                         finish_reason=job.assembler.finish_reason(done.result.stop_reason))
                   for index, (job, done) in enumerate(finished)]
        body = response_body(id=ident, created=created, model=state.config.model_id,
                             object_name=build.object_name, choices=choices,
                             usage_body=usage_body, waste=waste)
        return Response(dumps(body), 200, {"x-request-id": ident},
                        content_type="application/json")
    finally:
        for job, _ in admitted:
            state.service.leave(job)


def _stream(state: ServerState, admitted: list[tuple[Job, Any]], chunks,
            ident: str) -> Response:
    # How the stream ends is its status in the metrics: 200 once [DONE] went out, an error
    # event's status, or (never set) the client left first. Choices stream one after another,
    # each chunk carrying its choice's ``index``.
    record = outcome()
    peer = peer_eof()
    timing: dict[str, Any] = {"queue_ms": 0.0, "arrived": record["arrived"], "finished": []}
    on_error = _record_error(record)

    def errored(exc: BaseException) -> None:
        timing["failed"] = True
        on_error(exc)

    async def body():
        try:
            for index, (job, events) in enumerate(admitted):
                chunks.start_choice(index)
                render = functools.partial(_render_event, state, job, chunks, timing,
                                           index == len(admitted) - 1)
                writes = sse_writes(events, render, keepalive_s=state.config.keepalive_s,
                                    first=chunks.first(), on_error=errored, peer=peer)
                async with contextlib.aclosing(writes):
                    async for text in writes:
                        yield text
                        if timing.get("done"):
                            record["status"] = timing["done"]
                if timing.get("failed"):
                    return
        finally:
            for job, _ in admitted:
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
                     on_error: Callable[[BaseException], None] | None = None,
                     peer: PeerEof | None = None) -> AsyncIterator[str]:
    """What one stream writes: ``first``, then each batch of rendered events, until an event
    renders as done; a late error becomes one SSE event (docs/HTTP.md §4.3).

    A ``: keep-alive`` comment goes out whenever ``keepalive_s`` pass with nothing written,
    measured from the last write: events that write nothing (the job leaving the queue)
    do not restart the interval. Once ``peer`` saw the client's end-of-input, a comment goes
    out whenever a probe delay (exchange.probe_delays) passes with nothing written: every
    write tells whether a half-closed client still reads, and a client that left is found
    by the write that fails, even while queued or prefilling.
    """
    try:
        if first:
            yield first
        probes: Iterator[float] | None = None
        interval = keepalive_s
        deadline = trio.current_time() + interval
        while True:
            if probes is None and peer is not None and peer.seen:
                probes = probe_delays()  # the client's end-of-input: probe it soon
                interval = min(keepalive_s, next(probes))
                deadline = min(deadline, trio.current_time() + interval)
            # Never yield inside a cancel scope: the consumer would run under it.
            event = None
            with trio.move_on_at(deadline) as waiting:
                with peer.waking(waiting) if peer is not None else contextlib.nullcontext():
                    event = await events.receive()
            if event is None:
                if probes is None and peer is not None and peer.seen:
                    continue  # woken by the end-of-input, not by the deadline
                yield SSE_KEEPALIVE
                if probes is not None:
                    interval = min(keepalive_s, next(probes))
                deadline = trio.current_time() + interval
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
                deadline = trio.current_time() + interval
            if done:
                return
    except Exception as exc:  # a late error is one SSE event, then the stream ends
        if on_error is not None:
            on_error(exc)
        yield sse(envelope(to_api_error(exc)))


def _render_event(state, job, chunks, timing: dict, last: bool, event) -> tuple[str, bool]:
    """One event as stream text, and whether this choice's events end with it."""
    if isinstance(event, Started):
        if not timing["finished"]:
            timing["queue_ms"] = event.queue_ms
        return "", False
    if isinstance(event, Released):
        return chunks.outputs(event.outputs), False
    if isinstance(event, Failed):
        job.completed = True
        error = to_api_error(event.error)
        timing["done"] = error.status
        timing["failed"] = True
        return sse(envelope(error)), True
    if isinstance(event, Finished):
        job.completed = True
        _observe(state, job, event, timing["queue_ms"], timing["arrived"])
        timing["finished"].append((job, event))
        text = chunks.outputs(event.outputs)
        finish = job.assembler.finish_reason(event.result.stop_reason)
        if not last:
            return text + chunks.finish(finish), True
        timing["done"] = 200
        usage_body, waste = _account(state, timing["finished"], timing["queue_ms"])
        return text + chunks.final(finish, waste, usage_body), True
    return "", False


__all__ = ["chat_completions", "completions"]
