"""OpenAI wire shapes: response bodies, SSE chunks, usage, logprobs and the ``waste`` object.

Pure builders over domain values; the routes decide when each is sent.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from waste.domain.reply.assembler import Output, ReplyAssembler
from waste.domain.ports import EngineStats, GenerationResult
from waste.domain.reply.stop_strings import ContentPiece


def dumps(obj: object) -> str:
    """Compact JSON with non-ASCII kept literal (docs/HTTP.md §0)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


# Line breaks to some line splitters (httpx's iter_lines, str.splitlines) that JSON allows
# raw: inside a ``data:`` line they would cut the event in two, so SSE escapes them.
_SSE_ESCAPES = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})


def sse(obj: object) -> str:
    return f"data: {dumps(obj).translate(_SSE_ESCAPES)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
SSE_KEEPALIVE = ": keep-alive\n\n"


def hit_rate(hit: int, miss: int) -> float | None:
    return hit / (hit + miss) if hit + miss else None


def waste_object(*, prompt_tokens: int, result: GenerationResult | None, queue_ms: float,
                 seed: int, stats: EngineStats, requests: int) -> dict:
    """The per-request ``waste`` object (docs/HTTP.md §3.4)."""
    generated = result.tokens_generated if result else 0
    hit = result.experts_hit if result else 0
    miss = result.experts_missed if result else 0
    decode_ms = result.decode_ms if result else 0.0
    return {
        "prompt_tokens": prompt_tokens, "tokens_generated": generated,
        "experts_hit": hit, "experts_missed": miss, "expert_hit_rate": hit_rate(hit, miss),
        "bytes_read": result.bytes_read if result else 0,
        "cached_tokens": result.cached_tokens if result else 0,
        "lookahead_guesses": result.guesses if result else 0,
        "lookahead_hits": result.guess_hits if result else 0,
        "lookahead_accuracy": result.guess_hits / result.guesses if result and result.guesses else None,
        "lookahead_wasted_bytes": result.wasted_bytes if result else 0,
        "direct_io": bool(result.direct_io) if result else stats.direct_io,
        "queue_ms": round(queue_ms, 3), "prefill_ms": round(result.prefill_ms, 3) if result else 0.0,
        "decode_ms": round(decode_ms, 3),
        "tokens_per_second": (generated / (decode_ms / 1000)) if decode_ms > 0 else None,
        "seed": seed,
        "since_start": {
            "requests": requests, "tokens_generated": stats.tokens_generated,
            "experts_hit": stats.experts_hit, "experts_missed": stats.experts_missed,
            "expert_hit_rate": hit_rate(stats.experts_hit, stats.experts_missed),
            "bytes_read": stats.bytes_read, "direct_io": stats.direct_io,
            "io_note": stats.io_note,
            "io_threads": stats.io_threads, "lookahead": stats.lookahead,
            "activations": stats.activations,
            "lookahead_guesses": stats.guesses, "lookahead_hits": stats.guess_hits,
            "lookahead_accuracy": stats.guess_hits / stats.guesses if stats.guesses else None,
            "lookahead_wasted_bytes": stats.wasted_bytes,
            "io_queue_depth_max": stats.io_queue_depth_max, "disk_busy_s": round(stats.disk_busy_s, 6),
            "prefix_cache": {
                "reused_tokens": stats.prefix_cache.reused_tokens,
                "hits": stats.prefix_cache.hits, "entries": stats.prefix_cache.entries,
                "bytes": stats.prefix_cache.bytes,
                "capacity_bytes": stats.prefix_cache.capacity_bytes,
                "evictions": stats.prefix_cache.evictions,
            },
        },
    }


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None,
          cached_tokens: int = 0) -> dict:
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


def logprob_entries(pieces: tuple[ContentPiece, ...] | list[ContentPiece]) -> list[dict]:
    """Chat logprob entries: one per token that added content (docs/HTTP.md §3.3)."""
    return [{"token": p.text, "logprob": p.logprob if p.logprob is not None else 0.0,
             "bytes": list(p.text.encode("utf-8")),
             "top_logprobs": [{"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}
                              for raw, lp in p.top]} for p in pieces]


def completion_logprobs(pieces, offset: int = 0) -> dict:
    """Completions-style logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, offsets, tops = [], [], [], []
    for piece in pieces:
        tokens.append(piece.text)
        lps.append(piece.logprob if piece.logprob is not None else 0.0)
        offsets.append(offset)
        offset += len(piece.text)
        tops.append({raw.decode("utf-8", "replace"): lp for raw, lp in piece.top})
    top = tops if any(piece.top for piece in pieces) else None
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}


# -- streams -----------------------------------------------------------------------------------

class _Chunks:
    """The chunks of one stream: the same id, created and model on every one."""

    object_name = ""

    def __init__(self, *, id: str, created: int, model: str, include_usage: bool,
                 logprobs: bool) -> None:
        self.base = {"id": id, "object": self.object_name, "created": created, "model": model}
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.index = 0  # the choice the next chunks belong to (n > 1 streams them in turn)

    def _event(self, choice: dict, extra: dict | None = None) -> str:
        body = dict(self.base, choices=[dict(index=self.index, **choice)])
        if self.include_usage:
            body["usage"] = None
        if extra:
            body.update(extra)
        return sse(body)

    def start_choice(self, index: int) -> None:
        """The next chunks belong to choice ``index`` (n > 1 streams the choices in turn)."""
        self.index = index

    def first(self) -> str:
        """What goes out at admission (chat: the role chunk)."""
        return ""

    def _finish(self, finish_reason: str, extra: dict[str, Any]) -> str:
        """The chunk that carries ``finish_reason`` (each stream kind shapes its own)."""
        raise NotImplementedError

    def finish(self, finish_reason: str) -> str:
        """The finish chunk of a choice that is not the last."""
        return self._finish(finish_reason, {})

    def final(self, finish_reason: str, waste: dict, usage_body: dict) -> str:
        """The last choice's finish chunk (carrying ``waste``), the optional usage chunk,
        then [DONE]."""
        text = self._finish(finish_reason, {"waste": waste})
        if self.include_usage:
            text += sse(dict(self.base, choices=[], usage=usage_body, waste=waste))
        return text + SSE_DONE


class ChatChunks(_Chunks):
    object_name = "chat.completion.chunk"

    def chunk(self, delta: dict, *, finish_reason: str | None = None, logprobs=None,
              extra: dict | None = None) -> str:
        return self._event({"delta": delta, "logprobs": logprobs,
                            "finish_reason": finish_reason}, extra)

    def first(self) -> str:
        return self.chunk({"role": "assistant", "content": ""})

    def _finish(self, finish_reason: str, extra: dict) -> str:
        return self.chunk({}, finish_reason=finish_reason, extra=extra)

    def outputs(self, outputs: tuple[Output, ...] | list[Output]) -> str:
        parts = []
        for out in outputs:
            if out.kind == "reasoning":
                parts.append(self.chunk({"reasoning_content": out.text}))
            elif out.kind == "content":
                lp = {"content": logprob_entries(out.pieces)} if self.logprobs else None
                parts.append(self.chunk({"content": out.text}, logprobs=lp))
            elif out.kind == "tool_call" and out.call is not None:
                call = out.call
                parts.append(self.chunk({"tool_calls": [{
                    "index": out.index, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}]}))
                parts.append(self.chunk({"tool_calls": [{
                    "index": out.index, "function": {"arguments": call.arguments}}]}))
        return "".join(parts)


class CompletionChunks(_Chunks):
    """/v1/completions chunks: text only, no role chunk."""

    object_name = "text_completion"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.offset = 0

    def start_choice(self, index: int) -> None:
        super().start_choice(index)
        self.offset = 0

    def chunk(self, text: str, *, finish_reason: str | None = None, logprobs=None,
              extra: dict | None = None) -> str:
        return self._event({"text": text, "logprobs": logprobs,
                            "finish_reason": finish_reason}, extra)

    def _finish(self, finish_reason: str, extra: dict) -> str:
        return self.chunk("", finish_reason=finish_reason, extra=extra)

    def outputs(self, outputs) -> str:
        parts = []
        for out in outputs:
            if out.kind != "content":
                continue
            lp = completion_logprobs(out.pieces, self.offset) if self.logprobs else None
            self.offset += len(out.text)
            parts.append(self.chunk(out.text, logprobs=lp))
        return "".join(parts)


def chat_response(*, index: int, assembler: ReplyAssembler, finish_reason: str,
                  logprobs: bool) -> dict:
    """One chat choice."""
    lp = None
    if logprobs:
        content = assembler.message().get("content")
        lp = {"content": logprob_entries(assembler.content_pieces) if content else []}
    return {"index": index, "message": assembler.message(), "logprobs": lp,
            "finish_reason": finish_reason}


chat_response.object_name = "chat.completion"  # type: ignore[attr-defined]


def completion_response(*, index: int, assembler: ReplyAssembler, finish_reason: str,
                        logprobs: bool) -> dict:
    """One completions choice."""
    lp = completion_logprobs(assembler.content_pieces) if logprobs else None
    return {"index": index, "text": assembler.text, "logprobs": lp,
            "finish_reason": finish_reason}


completion_response.object_name = "text_completion"  # type: ignore[attr-defined]


def response_body(*, id: str, created: int, model: str, object_name: str, choices: list[dict],
                  usage_body: dict, waste: dict) -> dict:
    """A blocking answer: its choices in index order, one usage for them all."""
    return {"id": id, "object": object_name, "created": created, "model": model,
            "choices": choices, "usage": usage_body, "waste": waste}
