"""Decode runs of libwaste at a given expert-cache size, timed token by token.

``decode_run`` opens the container at a budget worth a fraction of the experts (or all of
them, pre-warmed), decodes warm-up tokens, then the measured tokens in segments. Between
segments (outside the timed spans) a probe re-measures the machine, because on a shared VM
disk bandwidth drifts by 3-4x within seconds; each segment is compared with its own probes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import attrs
import numpy as np

from waste.adapters.native.context import plan_memory
from waste.adapters.native.engine import NativeEngine
from waste.adapters.native.options import NativeOptions
from waste.domain.ports import SamplingParams

PROMPT_TOKENS = 8


def prompt_ids(n_base_vocab: int, n: int, seed: int) -> list[int]:
    """``n`` deterministic plain-token ids (no specials)."""
    return [int(i) for i in np.random.default_rng(seed).integers(0, n_base_vocab, n)]


def budget_for(container: Path, base: NativeOptions, fraction: float | None) -> tuple[int, int]:
    """(budget bytes, slots) for a cache holding ``fraction`` of all expert records; None = all.

    Slots = ⌊(budget − floor + min cache)/record⌋ (docs/ENGINE.md §5), so the budget is
    floor − min cache + slots·record.
    """
    plan = plan_memory(container, base)
    records = plan.expert_bytes // plan.record_bytes
    slots = records if fraction is None else int(round(fraction * records))
    budget = plan.floor_bytes - plan.min_cache_bytes + slots * plan.record_bytes
    check = plan_memory(container, attrs.evolve(base, ram_budget_bytes=budget))
    if check.slots != slots:
        raise RuntimeError(f"budget {budget} gives {check.slots} slots, expected {slots}")
    return budget, slots


@attrs.frozen
class Segment:
    """Measured tokens decoded by one generate call: wall seconds, expert accesses, bytes."""

    tokens: int
    seconds: float
    hits: int
    misses: int
    bytes_read: int
    io_s: float  # the engine's own time in record reads (waste_stats.io_s)
    busy_s: float = 0.0  # time >= 1 record read was in flight (waste_stats.disk_busy_s)


def _raw_stats(engine: NativeEngine):
    # EngineStats does not carry io_s; read the C struct (get_stats is allowed between and
    # during calls, docs/ENGINE.md §2).
    return engine._read_stats(engine._ctx)  # noqa: SLF001


def decode(engine: NativeEngine, prompt: list[int], *, warmup: int, tokens: int,
           segment: int, seed: int, between: Callable[[int], None] | None = None) -> tuple[list[Segment], list[int]]:
    """Warm-up tokens, then ``tokens`` more in generate calls of ``segment`` tokens each.

    The last sampled token is never evaluated (docs/ENGINE.md §2), so each call continues from
    it: its first callback already reports one full decode pass. ``between(i)`` runs before
    segment i, outside the timing. Returns the segments and every sampled id.
    """
    ids: list[int] = []

    def call(ids_in: list[int], n: int, call_seed: int) -> tuple[list[tuple], float]:
        marks: list[tuple] = []

        def on_token(event) -> bool:
            marks.append((time.perf_counter(), event.experts_hit, event.experts_missed,
                          event.bytes_read))
            ids.append(event.token)
            return False
        started = time.perf_counter()
        result = engine.generate_ids(ids_in, SamplingParams(temperature=1.0, seed=call_seed,
                                                        max_tokens=n), on_token)
        if len(marks) != n:
            raise RuntimeError(f"asked for {n} tokens, got {len(marks)} ({result.stop_reason})")
        return marks, started

    call(prompt, warmup + 1, seed)  # the prefill, then `warmup` decode passes
    segments = []
    done = 0
    while done < tokens:
        if between is not None:
            between(len(segments))
        n = min(segment, tokens - done)
        before = _raw_stats(engine)
        io_before, busy_before = before.io_s, before.disk_busy_s
        marks, started = call([ids[-1]], n, seed + 1 + len(segments))
        after = _raw_stats(engine)
        segments.append(Segment(tokens=n, seconds=marks[-1][0] - started,
                                hits=sum(m[1] for m in marks), misses=sum(m[2] for m in marks),
                                bytes_read=sum(m[3] for m in marks),
                                io_s=after.io_s - io_before, busy_s=after.disk_busy_s - busy_before))
        done += n
    return segments, ids


def decode_run(container: Path, base: NativeOptions, *, fraction: float | None, warmup: int,
               tokens: int, segment: int, seed: int,
               between: Callable[[int], None] | None = None) -> dict:
    """One decode measurement; ``fraction`` None means room for every expert, pre-warmed by
    an identical first pass (logits do not depend on the cache, so it routes to exactly
    the experts the measured pass uses, and every measured access hits).
    """
    budget, slots = budget_for(container, base, fraction)
    # Prompt token by token: a small cache then never needs a chunk's distinct experts at once.
    options = attrs.evolve(base, ram_budget_bytes=budget, prefill_chunk=1)
    opened = time.perf_counter()
    engine = NativeEngine.open(container, options)
    open_s = time.perf_counter() - opened
    try:
        prompt = prompt_ids(engine.model_info().n_base_vocab, PROMPT_TOKENS, seed)
        kwargs = dict(warmup=warmup, tokens=tokens, segment=segment, seed=seed)
        warm = {}
        if fraction is None:
            started = time.perf_counter()
            decode(engine, prompt, **kwargs)
            warm = {"prewarm_s": round(time.perf_counter() - started, 3),
                    "prewarm_records_loaded": engine.statistics().experts_missed}
            engine.reset()  # the cache is kept (docs/ENGINE.md §2)
        s0 = _raw_stats(engine)
        segments, ids = decode(engine, prompt, **kwargs, between=between)
        stats = engine.statistics()
        s1 = _raw_stats(engine)  # reading ahead, over warm-up + measured tokens
        guesses, guess_hits = s1.guesses - s0.guesses, s1.guess_hits - s0.guess_hits
        ahead = {"io_threads": s1.io_threads, "lookahead": s1.lookahead, "guesses": guesses,
                 "guess_hits": guess_hits,
                 "lookahead_accuracy": guess_hits / guesses if guesses else None,
                 "wasted_bytes": s1.wasted_bytes - s0.wasted_bytes,
                 "queue_depth_max": s1.queue_depth_max,
                 # the computing thread's waits for records, over warm-up + measured tokens
                 "io_wait_s": round(s1.io_wait_s - s0.io_wait_s, 3)}
    finally:
        engine.close()
    seconds = sum(s.seconds for s in segments)
    hits, misses = sum(s.hits for s in segments), sum(s.misses for s in segments)
    read = sum(s.bytes_read for s in segments)
    io_s = sum(s.io_s for s in segments)
    busy_s = sum(s.busy_s for s in segments)
    return {
        "row": "decode", "cache": "all" if fraction is None else fraction,
        "slots": slots, "budget_bytes": budget, "open_s": round(open_s, 3), **warm,
        "prompt_tokens": PROMPT_TOKENS, "warmup_tokens": warmup, "tokens": tokens,
        "segments": len(segments), "seconds": round(seconds, 3), "tok_per_s": tokens / seconds,
        "h": hits / max(hits + misses, 1), "hits": hits, "misses": misses,
        "accesses_per_token": (hits + misses) / tokens, "bytes_read_per_token": read / tokens,
        "io_s": round(io_s, 3), "io_share": io_s / seconds, **ahead,
        "disk_busy_s": round(busy_s, 3), "disk_busy_share": busy_s / seconds,
        "engine_read_bytes_per_s": read / busy_s if busy_s > 0 else None,
        "direct_io": stats.direct_io, "io_note": stats.io_note,
        "token_ids": ids, "segment_list": segments,
    }
