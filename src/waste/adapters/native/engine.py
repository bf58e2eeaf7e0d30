"""``NativeEngine``: the Engine port on libwaste, plus the tokenizer-only ``NativeTokenizer``.

Generation runs ``waste_generate`` with a cffi ``extern "Python"`` callback; a Python
exception raised by ``on_token`` stops the C loop (the callback returns 1) and is re-raised
once ``waste_generate`` has returned, so no exception ever crosses C. ``open_native_engine``
owns both contexts for a server's lifetime: it opens them, and saves the hotlist and closes
them on exit. Besides the port, ``NativeEngine`` exposes libwaste's own steps (``reset``,
``generate_ids``, ``eval``, images, ``save_usage``) for tools and tests.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

import attrs
import trio

from waste.domain.ports import (BudgetExceeded, Cancelled, EngineError, EngineStats,
                                GenerationResult, MaskFiller, Prompt, SamplingParams,
                                TokenCallback, TokenEvent, fit_to_context)
from waste.domain.prefix_cache import Entry, Key, PrefixCache, checkpoints

from waste.adapters.native.context import (MemoryPlan, NativeContext, fail, ffi, int32_array,
                                           lib, plan_memory)
from waste.adapters.native.options import NativeOptions

STOP_REASONS = {
    lib.WASTE_STOP_NONE: "none", lib.WASTE_STOP_TOKEN: "token",
    lib.WASTE_STOP_MAX_TOKENS: "max_tokens", lib.WASTE_STOP_CTX_FULL: "ctx_full",
    lib.WASTE_STOP_CALLBACK: "callback",
}
_CALLBACK_STOP = 1
log = logging.getLogger("waste.engine")


@attrs.frozen(kw_only=True)
class NativeGenerationResult(GenerationResult):
    """``GenerationResult`` plus ``tail``: the UTF-8 bytes libwaste still held back when
    generation ended without a final flush (``on_token`` stopped it in the middle of a
    multi-byte character), so that the pieces plus ``tail`` equal ``detokenize`` of the
    delivered ids. Empty after a stop id, ``max_tokens`` or a full context."""

    tail: bytes = b""


class _Delivery:
    """One generate call's callback state; passed to C through ``ffi.new_handle``."""

    def __init__(self, engine: "NativeEngine", on_token: TokenCallback) -> None:
        self.engine = engine
        self.on_token = on_token
        self.error: BaseException | None = None

    def deliver(self, info: Any) -> int:
        try:
            piece = ffi.unpack(info.piece, info.piece_len) if info.piece_len else b""
            table = self.engine._token_table
            top = tuple((info.top_ids[i], table[info.top_ids[i]], info.top_logprobs[i])
                        for i in range(info.n_top))
            event = TokenEvent(index=info.index, token=info.token, piece=piece,
                               logprob=info.logprob, is_stop=bool(info.is_stop), top=top,
                               experts_hit=info.experts_hit, experts_missed=info.experts_missed,
                               bytes_read=info.bytes_read)
            self.engine._tokens_generated += 1
            return _CALLBACK_STOP if self.on_token(event) else 0
        except BaseException as exc:  # re-raised by generate after C returns
            self.error = exc
            return _CALLBACK_STOP


# error=1: should anything escape deliver(), C is told to stop (0 would mean "continue").
@ffi.def_extern(error=_CALLBACK_STOP)
def _waste_on_token(info: Any, user: Any) -> int:
    return ffi.from_handle(user).deliver(info)


#: The smallest positive float32 (2^-149).
FLOAT32_TRUE_MIN = 2.0 ** -149


class _Mask:
    """One generate call's mask state: ``fill(index, words)`` writes the allowed-token
    bitset (a writable memoryview of uint32 words, every id allowed on entry) and returns
    True to stop before the token. An exception is kept and re-raised by generate."""

    def __init__(self, fill: MaskFiller) -> None:
        self.fill = fill
        self.error: BaseException | None = None

    def run(self, index: int, allowed: Any, n_words: int) -> int:
        try:
            words = ffi.buffer(allowed, 4 * n_words)
            return _CALLBACK_STOP if self.fill(index, memoryview(words).cast("I")) else 0
        except BaseException as exc:
            self.error = exc
            return _CALLBACK_STOP


@ffi.def_extern(error=_CALLBACK_STOP)
def _waste_on_mask(index: int, allowed: Any, n_words: int, user: Any) -> int:
    return ffi.from_handle(user).run(index, allowed, n_words)




def _set_fields(struct: Any, **values: Any) -> None:
    for name, value in values.items():
        try:
            setattr(struct, name, value)
        except (OverflowError, TypeError) as exc:
            fail(lib.WASTE_E_ARG, f"sampling parameter {name}={value!r} is out of range: {exc}")


@attrs.frozen(eq=False)
class _Segment:
    """A prefix-cache entry's value: its snapshot segment in a private anonymous mapping
    (``length`` bytes of it; the mapping rounds up to whole pages), and the bytes a whole
    snapshot of the same state would take (to report what sharing saves).

    A mapping rather than malloc: an evicted entry's pages go back to the system at once,
    where malloc would keep freed buffers in its heap (the process would outgrow the budget
    the cache counts; bench/bench_prefix.py measures it)."""

    pages: mmap.mmap
    length: int
    whole_bytes: int

    @classmethod
    def allocate(cls, length: int, whole_bytes: int) -> "_Segment":
        return cls(mmap.mmap(-1, max(length, 1), flags=mmap.MAP_PRIVATE), length, whole_bytes)

    @staticmethod
    def footprint(length: int) -> int:
        """The bytes the cache counts for a segment: its pages."""
        return -(-max(length, 1) // mmap.PAGESIZE) * mmap.PAGESIZE

    def pointer(self) -> Any:
        return ffi.from_buffer(self.pages)


# The default prefix cache: this share of the budget, when the engine's floor leaves room.
PREFIX_CACHE_SHARE = 8
# What one stored key position costs this process: a tuple slot (8 B) and the token id's
# int object (28 B, 32 with pymalloc's rounding; ids above 256 are not shared), measured
# with tracemalloc. The cache counts it inside its capacity, so keys stay in the budget.
KEY_POSITION_BYTES = 40
_DEFAULT_CTX = 4096


@attrs.frozen
class PrefixCachePlan:
    """How much of the budget the prefix cache takes (``--plan`` prints it).

    ``entry_bytes`` is one stored state at a full context (the most one entry can need);
    ``note`` says why the cache is off, when it is."""

    bytes: int
    entry_bytes: int
    engine_budget_bytes: int
    note: str = ""


def plan_prefix_cache(plan: MemoryPlan, options: NativeOptions) -> PrefixCachePlan:
    """The prefix cache's share of ``plan``'s budget (docs/ENGINE.md §2 "Prefix cache").

    ``options.prefix_cache`` None is the default: 1/8 of the budget, at most what the
    floor leaves. A size too small for one full-context entry turns the cache off.

    Raises:
        BudgetExceeded: an explicit size that leaves the engine below its floor.
    """
    ctx = options.ctx_tokens or _DEFAULT_CTX
    # docs/FORMAT.md §7.1: a root segment at position ctx, in whole pages
    entry = _Segment.footprint(plan.state_bytes + 4 * ctx + 52) + KEY_POSITION_BYTES * ctx
    budget, room = plan.budget_bytes, max(0, plan.budget_bytes - plan.floor_bytes)
    requested = options.prefix_cache
    if requested == 0:
        return PrefixCachePlan(0, entry, budget, "off (--prefix-cache 0)")
    if requested is None:
        size = min(budget // PREFIX_CACHE_SHARE, room)
    elif requested > room:
        raise BudgetExceeded(
            f"--prefix-cache {requested} bytes leaves the engine {budget - requested} bytes, "
            f"below its floor of {plan.floor_bytes} (budget {budget}); at most {room} fit")
    else:
        size = requested
    if size < entry:
        return PrefixCachePlan(0, entry, budget,
                               f"off: {size} bytes cannot hold one entry of {entry} bytes "
                               f"(the state at a full context of {ctx} tokens)")
    return PrefixCachePlan(size, entry, budget - size)


class NativeEngine(NativeContext):
    """The Engine port on one libwaste context. Blocking; one call at a time.

    Every blocking method raises EngineError E_BUSY when another call on this context is
    running (a concurrent thread, or the token callback re-entering) and E_STATE once the
    context is closed; each docstring lists only the statuses beyond those two.
    ``model_info``, ``n_base_vocab``, ``statistics``, ``abort`` and ``close`` are the
    exceptions: they may be called from any thread at any time (``close`` not from inside
    this context's own token callback: E_BUSY).
    """

    def __init__(self, path: str | Path, options: NativeOptions) -> None:
        self._tokens_generated = 0
        self._token_table: list[bytes] = []
        self.prefix_plan = PrefixCachePlan(0, 0, options.ram_budget_bytes,
                                           "off (--prefix-cache 0)")
        if options.prefix_cache != 0 and not options.tokenizer_only:
            # The cache's buffers live outside libwaste: its bytes come out of the budget.
            self.prefix_plan = plan_prefix_cache(plan_memory(path, options), options)
            if self.prefix_plan.bytes:
                options = attrs.evolve(options,
                                       ram_budget_bytes=self.prefix_plan.engine_budget_bytes)
        self.prefix_cache: PrefixCache[_Segment] = PrefixCache(capacity=self.prefix_plan.bytes,
                                                                position_bytes=KEY_POSITION_BYTES)
        # The entry libwaste's segment anchor is (the last stored or restored), or None.
        self._anchor: Entry[_Segment] | None = None
        super().__init__(path, options)

    @classmethod
    def open(cls, path: str | Path, options: NativeOptions | None = None) -> "NativeEngine":
        """Open the container at ``path``.

        Raises:
            EngineError: E_IO, E_FORMAT, E_BUDGET, E_BUSY (locked), E_UNSUPPORTED (an
                unsupported option, or a library whose API version differs from the header's).
        """
        return cls(path, options or NativeOptions())

    def chat_template(self) -> str | None:
        """The container's ``chat.json`` text (the engine itself ignores it), or None.

        Raises:
            EngineError: E_IO (unreadable), E_FORMAT (not UTF-8). Works after close too.
        """
        path = self.path / "chat.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            fail(lib.WASTE_E_IO, f"{path}: {exc.strerror or exc}")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail(lib.WASTE_E_FORMAT, f"{path}: not UTF-8 ({exc})")

    def reset(self) -> None:
        """Back to position 0 (state, KV, image queue, abort and poison cleared).

        Raises:
            EngineError: only E_BUSY and E_STATE (see the class docstring).
        """
        with self._call() as ctx:
            self._check(lib.waste_reset(ctx))
        self._anchor = None

    def position(self) -> int:
        """Tokens evaluated since the last reset.

        Raises:
            EngineError: only E_BUSY and E_STATE (see the class docstring).
        """
        with self._call() as ctx:
            return int(lib.waste_position(ctx))

    def eval(self, ids: Sequence[int]) -> list[float]:
        """Append ``ids`` to the state and return the last position's logits (``vocab`` floats).

        Not part of the Engine port: for tools (``waste.tools.eval``) and tests.

        Raises:
            EngineError: E_ARG (empty ``ids``, or an id outside ``0..vocab-1``, naming its
                index), E_CTX (does not fit ``ctx_tokens``; nothing evaluated), E_CANCELLED
                (``abort``), E_UNSUPPORTED (a tokenizer-only context), E_IO/E_FORMAT/E_NOMEM
                (the state is then poisoned: E_STATE until ``reset``).
        """
        array = int32_array(ids, "ids")
        vocab = self._info.vocab
        logits = ffi.new("float[]", vocab)
        with self._call() as ctx:
            self._check(lib.waste_eval(ctx, array, len(ids), logits, vocab))
        return ffi.unpack(logits, vocab)

    def generate(self, prompt: Prompt, params: SamplingParams, on_token: TokenCallback, *,
                 is_cancelled: Callable[[], bool] | None = None,
                 mask: MaskFiller | None = None) -> NativeGenerationResult:
        """The Engine port's ``generate``: reset, queue and expand the images, cut
        ``max_tokens`` to the room left, then ``generate_ids``.

        Raises:
            EngineError: as ``Engine.generate`` says (ContextFull carries both numbers when
                the expanded prompt does not fit).
        """
        self.reset()
        if is_cancelled is not None and is_cancelled():
            raise Cancelled("the request was cancelled before generation started")
        ids = list(prompt.ids)
        if prompt.images:
            for image in prompt.images:
                self.add_image(image.rgb, image.width, image.height)
            ids = self.expand_images(ids)
        params = fit_to_context(params, len(ids), self._info.ctx_tokens)
        if not self.prefix_cache.enabled or prompt.images:
            # Images never reach the cache: libwaste has no vision tower yet (E_UNSUPPORTED
            # above), and the fake engine's keys show how digests would enter the key.
            return self.generate_ids(ids, params, on_token, mask=mask)
        return self._generate_cached(ids, params, on_token, mask)

    def _generate_cached(self, ids: list[int], params: SamplingParams,
                         on_token: TokenCallback,
                         mask: MaskFiller | None = None) -> NativeGenerationResult:
        """Restore the longest stored prefix, prefill the rest storing states at the
        checkpoints, generate, then store the state at the end of the generation."""
        before = self._read_stats_locked()
        started = time.perf_counter()
        key: Key = tuple(ids)
        cached = self.restore_prefix(key)
        self.prefix_cache.count_reuse(cached)
        position = cached
        for point in checkpoints(cached, len(ids) - 1, self.options.prefix_interval):
            self._eval_quiet(ids[position:point])
            position = point
            self.store_prefix(key[:point])
        prefill_ms = (time.perf_counter() - started) * 1000
        delivered: list[int] = []

        def collect(event: TokenEvent) -> bool:
            delivered.append(event.token)
            return on_token(event)

        result = self.generate_ids(ids[position:], params, collect, mask=mask)
        reply_key = key + tuple(delivered[:-1])
        if delivered and self.position() == len(reply_key):
            self.store_prefix(reply_key)
        after = self._read_stats_locked()
        return attrs.evolve(
            result, prompt_tokens=len(ids), cached_tokens=cached,
            prefill_ms=result.prefill_ms + prefill_ms,
            experts_hit=after.hits - before.hits, experts_missed=after.misses - before.misses,
            bytes_read=after.bytes_read - before.bytes_read,
            guesses=after.guesses - before.guesses, guess_hits=after.guess_hits - before.guess_hits,
            wasted_bytes=after.wasted_bytes - before.wasted_bytes)

    def restore_prefix(self, key: Key) -> int:
        """Restore the longest stored prefix of ``key`` that leaves at least one position
        to evaluate (a snapshot carries no logits): its chain of segments, root first. The
        positions restored, 0 when none is stored (the state is then untouched). Call it on
        a fresh state (after ``reset``).

        Raises:
            EngineError: as ``waste_snapshot_chain_load`` (E_STATE on a poisoned context).
        """
        entry = self.prefix_cache.longest_prefix(tuple(key), below=len(key) - 1)
        if entry is None:
            return 0
        chain = entry.chain()
        pointers = [link.value.pointer() for link in chain]  # alive through the call
        segments = ffi.new("void *[]", pointers)
        lens = ffi.new("uint64_t[]", [link.value.length for link in chain])
        with self._call() as ctx:
            self._check(lib.waste_snapshot_chain_load(ctx, segments, lens, len(chain)))
        self._anchor = entry
        return entry.length

    def _read_stats_locked(self) -> Any:
        with self._pointer:
            return self._read_stats(self._ctx)

    def _eval_quiet(self, ids: Sequence[int]) -> None:
        array = int32_array(ids, "ids")
        with self._call() as ctx:
            self._check(lib.waste_eval(ctx, array, len(ids), ffi.NULL, 0))

    def store_prefix(self, key: Key) -> bool:
        """Store the current state in the prefix cache under ``key`` (the ids evaluated
        since the reset); False when the cache is off, already holds it, or it cannot fit.

        The entry is a segment (docs/FORMAT.md §7.1) extending the entry last stored or
        restored (libwaste's anchor): it holds only the MLA latents since, so entries of one
        conversation share theirs. When that parent is gone, or the parent's chain leaves no
        room, it is a root holding the whole state. Evicts before it allocates, so the cache
        never holds more than its bytes.
        """
        cache = self.prefix_cache
        if not cache.enabled or key in cache:
            return False
        parent = self._anchor if self._anchor is not None and cache.holds(self._anchor) else None
        n, base = self._segment_size(whole=parent is None)
        if parent is not None and (base != parent.length or not cache.make_room(
                _Segment.footprint(n) + cache.key_bytes(len(key) - base), keep=parent)):
            parent = None  # libwaste's anchor is not this entry, or its chain fills the cache
            n, base = self._segment_size(whole=True)
        if parent is None and not cache.make_room(_Segment.footprint(n)
                                                  + cache.key_bytes(len(key))):
            return False
        whole, written = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        with self._call() as ctx:
            self._check(lib.waste_snapshot_size(ctx, whole))
        segment = _Segment.allocate(n, int(whole[0]))
        with self._call() as ctx:
            self._check(lib.waste_snapshot_segment_save(ctx, int(parent is None),
                                                        segment.pointer(), n, written))
        entry = cache.put(key, segment, _Segment.footprint(n), parent=parent)
        self._anchor = entry
        return entry is not None

    def _segment_size(self, *, whole: bool) -> tuple[int, int]:
        size, base = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        with self._call() as ctx:
            self._check(lib.waste_snapshot_segment_size(ctx, int(whole), size, base))
        return int(size[0]), int(base[0])

    def prefix_cache_sharing(self) -> tuple[int, int]:
        """(bytes the cache's entries count, bytes they would count as whole snapshots, each
        in whole pages, and keys): what sharing MLA latents and key positions between
        entries saves."""
        cache = self.prefix_cache
        return cache.bytes, sum(_Segment.footprint(e.value.whole_bytes) + cache.key_bytes(e.length)
                                for e in cache)

    def generate_ids(self, prompt: Sequence[int], params: SamplingParams,
                     on_token: TokenCallback, *, mask: MaskFiller | None = None) -> NativeGenerationResult:
        """From the current position (no reset): prefill ``prompt``, then sample until a stop id, ``max_tokens``, a full context or
        ``on_token`` returning True (``stop_reason`` "callback"). The result's ``tail``
        holds the bytes of a multi-byte character the stop cut (see NativeGenerationResult).

        Raises:
            EngineError: E_ARG (empty prompt, bad id or parameter), E_CTX (does not fit;
                nothing evaluated), E_CANCELLED (``abort``), E_UNSUPPORTED (a tokenizer-only
                context), E_IO/E_FORMAT/E_NOMEM/E_BUDGET (the state is then poisoned: E_STATE
                until ``reset``).
            BaseException: whatever ``on_token`` raised, after the C call has returned.
        """
        if params.top_logprobs and not self._token_table:
            self._token_table = self._build_token_table()  # the callback may not call C
        ids = int32_array(prompt, "prompt")
        stops = int32_array(params.stop_ids, "stop_ids")
        gen = ffi.new("waste_gen_params *")
        lib.waste_gen_params_init(gen)
        # waste_gen_params.top_p is a float: a p in (0, 2^-150] would round to 0.0f, which
        # libwaste refuses. Any p below the top token's mass keeps the top token alone, so the
        # smallest positive float means the same.
        top_p = max(params.top_p, FLOAT32_TRUE_MIN)
        # The same for repetition_penalty in (0, 2^-150]: the nearest float32 in range
        # (docs/HTTP.md §2.2: (0, 10]) rather than 0.0f, which libwaste refuses with E_ARG.
        # Zero or less is still sent as is, for libwaste's own E_ARG.
        repetition = params.repetition_penalty
        if 0 < repetition < FLOAT32_TRUE_MIN:
            repetition = FLOAT32_TRUE_MIN
        _set_fields(gen, temperature=params.temperature, top_p=top_p, top_k=params.top_k,
                    seed=params.seed, max_tokens=params.max_tokens,
                    n_stop_ids=len(params.stop_ids))
        gen.stop_ids = stops if params.stop_ids else ffi.NULL
        _set_fields(gen, presence_penalty=params.presence_penalty,
                    frequency_penalty=params.frequency_penalty,
                    repetition_penalty=repetition, min_p=params.min_p,
                    n_top_logprobs=params.top_logprobs, n_logit_bias=len(params.logit_bias))
        bias_ids = int32_array([token for token, _ in params.logit_bias], "logit_bias")
        bias_values = ffi.new("float[]", [bias for _, bias in params.logit_bias])
        if params.logit_bias:
            gen.logit_bias_ids = bias_ids
            gen.logit_bias = bias_values
        masking = _Mask(mask) if mask is not None else None
        if masking is not None:
            mask_state = ffi.new_handle(masking)  # kept alive by this frame for the whole C call
            gen.mask_cb = lib._waste_on_mask
            gen.mask_user = mask_state
        res = ffi.new("waste_gen_result *")
        lib.waste_gen_result_init(res)
        delivery = _Delivery(self, on_token)
        handle = ffi.new_handle(delivery)  # kept alive by this frame for the whole C call
        with self._call() as ctx:
            status = lib.waste_generate(ctx, ids, len(prompt), gen, lib._waste_on_token, handle, res)
            mask_error = masking.error if masking is not None else None
            if delivery.error is None and mask_error is None:
                self._check(status)
        if delivery.error is not None:
            raise delivery.error
        if mask_error is not None:
            raise mask_error
        return NativeGenerationResult(
            prompt_tokens=res.prompt_tokens, tokens_generated=res.tokens_generated,
            stop_reason=STOP_REASONS.get(res.stop_reason, str(res.stop_reason)),
            experts_hit=res.experts_hit, experts_missed=res.experts_missed,
            bytes_read=res.bytes_read, prefill_ms=res.prefill_ms, decode_ms=res.decode_ms,
            direct_io=bool(res.direct_io), guesses=res.guesses, guess_hits=res.guess_hits,
            wasted_bytes=res.wasted_bytes, tail=ffi.unpack(res.tail, res.tail_len) if res.tail_len else b"")

    def _build_token_table(self) -> list[bytes]:
        """Every id's raw bytes (b"" for an id with no text), for the top logprobs: built
        once, on the first generate that asks for them (the token callback may not call
        detokenize)."""
        table = []
        for token in range(self._info.vocab):
            try:
                table.append(self.detokenize([token]))
            except EngineError:
                table.append(b"")
        return table

    def add_image(self, rgb: bytes, width: int, height: int) -> int:
        """Queue an RGB8 image; returns its placeholder's position count.

        Raises:
            EngineError: E_ARG when ``rgb`` is not ``width*height*3`` bytes, E_UNSUPPORTED
                without a vision tower.
        """
        if width <= 0 or height <= 0 or len(rgb) != width * height * 3:
            fail(lib.WASTE_E_ARG, f"image rgb: {len(rgb)} bytes is not {width}x{height} RGB8")
        n_pos = ffi.new("uint32_t *")
        with self._call() as ctx:
            self._check(lib.waste_image_add(ctx, ffi.from_buffer(rgb), width, height, n_pos))
        return int(n_pos[0])

    def expand_images(self, ids: Sequence[int]) -> list[int]:
        """Each media placeholder id becomes its positions, in queue order.

        Raises:
            EngineError: E_ARG (a placeholder count that differs from the queue, or an id
                outside int32), E_UNSUPPORTED (no vision tower).
        """
        array = int32_array(ids, "ids")
        with self._call() as ctx:
            out, n = self._grow("int32_t", len(ids) + 64,
                                lambda buf, cap, n_out: lib.waste_image_expand(ctx, array, len(ids), buf, cap, n_out))
        return list(out[0:n])

    def clear_images(self) -> None:
        """Empty the image queue.

        Raises:
            EngineError: E_UNSUPPORTED (no vision tower).
        """
        with self._call() as ctx:
            self._check(lib.waste_image_clear(ctx))

    def save_usage(self, path: str | None = None) -> None:
        """Write the expert hotlist to ``path``; None means ``--usage`` (``usage_path``): the
        container's ``usage.waste`` when that is unset, nothing at all when it is ``""``.

        Raises:
            EngineError: E_IO (the file or its directory cannot be written; naming the path),
                E_ARG (``path`` is ""), E_UNSUPPORTED (a tokenizer-only context).
        """
        if path is None:
            path = self.options.usage_path
            if path == "":
                return
        target = str(path if path is not None else self.path / "usage.waste").encode("utf-8")
        with self._call() as ctx:
            self._check(lib.waste_save_usage(ctx, target))

    def statistics(self) -> EngineStats:
        """Cumulative statistics since open; safe from any thread, also during a call.

        ``tokens_generated`` counts tokens delivered to callbacks (libwaste's own ``tokens``
        counts every evaluated position, prompts included). After close: the final values.

        Raises:
            EngineError: E_ARG only if libwaste refuses ``waste_get_stats`` itself, which
                needs a library built from another header (``open`` refuses that first).
        """
        with self._pointer:
            stats = self._final_stats if self.closed else self._read_stats(self._ctx)
        note = ffi.string(stats.io_note).decode("utf-8", "replace")
        return EngineStats(tokens_generated=self._tokens_generated, experts_hit=stats.hits,
                           experts_missed=stats.misses, bytes_read=stats.bytes_read,
                           direct_io=bool(stats.direct_io), io_note=note or None,
                           budget_bytes=stats.budget_bytes + self.prefix_cache.capacity,
                           peak_bytes=stats.peak_bytes,
                           io_threads=stats.io_threads, lookahead=stats.lookahead, guesses=stats.guesses,
                           guess_hits=stats.guess_hits, wasted_bytes=stats.wasted_bytes,
                           io_queue_depth_max=stats.queue_depth_max, disk_busy_s=stats.disk_busy_s,
                           activations="q8" if stats.activations == lib.WASTE_ACT_Q8 else "f32",
                           prefix_cache=self.prefix_cache.stats())


class NativeTokenizer(NativeContext):
    """A tokenizer-only context (``tokenizer_only=1``) on the same container.

    The server uses it for /tokenize and prompt building while the engine's own context
    is busy generating; it loads no weights.
    """

    @classmethod
    def open(cls, path: str | Path, options: NativeOptions | None = None) -> "NativeTokenizer":
        """Open ``path`` for tokenization only; ``options`` are reduced by ``for_tokenizer``.

        Raises:
            EngineError: as ``NativeEngine.open`` (weights are not loaded, so no E_BUDGET).
        """
        return cls(path, (options or NativeOptions()).for_tokenizer())


@contextlib.asynccontextmanager
async def open_native_engine(path: str | Path, options: Any
                             ) -> AsyncIterator[tuple[NativeEngine, NativeTokenizer]]:
    """Own the engine and its tokenizer for a server's lifetime (see ``open_native``).

    The blocking open runs in a thread and is waited for even when cancelled (``waste_open``
    cannot be aborted, and an abandoned thread would outlive the engine). On exit the expert
    hotlist is saved (a failure is logged only, docs/HTTP.md §6) and both contexts close,
    shielded from cancellation.

    Raises:
        EngineError: as ``open_native``.
    """
    with trio.CancelScope(shield=True):
        engine, tokenizer = await trio.to_thread.run_sync(open_native, path, options)
    try:
        yield engine, tokenizer
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_save_and_close, engine, tokenizer)


def _save_and_close(engine: NativeEngine, tokenizer: NativeTokenizer) -> None:
    try:
        engine.save_usage()
    except EngineError as exc:
        log.warning("expert hotlist not saved: %s", exc)
    engine.close()
    tokenizer.close()


def open_native(path: str | Path, options: Any) -> tuple[NativeEngine, NativeTokenizer]:
    """Open the engine and its tokenizer-only twin on the container at ``path``.

    Args:
        path: the ``model.waste`` directory.
        options: a ``NativeOptions``, or a settings object with the server's flags
            (see ``NativeOptions.from_settings``).

    Raises:
        EngineError: as ``NativeEngine.open``; the engine is closed again when the
            tokenizer's open fails.
        AttributeError, ValueError: a settings object lacking a flag or with a bad value.
    """
    options = NativeOptions.coerce(options)
    # waste_open loads the trunk and warms the expert cache inside one call (no progress
    # callback crosses the C API), so the log says what it is about to read, then the result.
    usage = Path(path) / "usage.waste" if options.usage_path is None else options.usage_path
    entries = _hotlist_entries(usage) if usage else 0
    log.info("opening %s: loading the trunk, then warming the expert cache from %s "
             "(%d hotlist entries); this reads from the SSD", path, usage or "no hotlist",
             entries)
    started = time.perf_counter()
    engine = NativeEngine.open(path, options)
    _log_hotlist(engine, time.perf_counter() - started)
    plan = engine.prefix_plan
    if plan.bytes:
        log.info("prefix cache: %d bytes of the budget (one full-context entry is %d bytes)",
                 plan.bytes, plan.entry_bytes)
    else:
        log.warning("prefix cache %s", plan.note)
    try:
        tokenizer = NativeTokenizer.open(path, options)
    except BaseException:
        engine.close()
        raise
    return engine, tokenizer


def _hotlist_entries(usage: str | Path) -> int:
    """The entry count a usage.waste's size implies (docs/FORMAT.md §8: a 24-byte header,
    16 bytes an entry); 0 when it is absent or unreadable (the engine says why, if at all)."""
    try:
        size = os.stat(usage).st_size
    except OSError:
        return 0
    return max(size - 24, 0) // 16


def _log_hotlist(engine: NativeEngine, seconds: float) -> None:
    """Say what the open did: slots warmed from the hotlist, and a hint it ignored, and why."""
    with engine._pointer:
        stats = engine._read_stats(engine._ctx)
        note = ffi.string(stats.usage_note).decode("utf-8", "replace")
        warm, entries, slots = stats.warm_bytes, stats.usage_entries, stats.warm_slots
    log.info("engine open in %.1f s: %d expert slots warmed (%.1f MiB) from %d hotlist "
             "entries", seconds, slots, warm / 2**20, entries)
    if note:
        log.warning("expert hotlist: %s", note)
