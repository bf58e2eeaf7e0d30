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
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

import attrs
import trio

from waste.domain.ports import (Cancelled, EngineError, EngineStats, GenerationResult, Prompt,
                                SamplingParams, TokenCallback, TokenEvent, fit_to_context)

from waste.adapters.native.context import NativeContext, fail, ffi, int32_array, lib
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
            event = TokenEvent(index=info.index, token=info.token, piece=piece,
                               logprob=info.logprob, is_stop=bool(info.is_stop),
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


def _set_fields(struct: Any, **values: Any) -> None:
    for name, value in values.items():
        try:
            setattr(struct, name, value)
        except (OverflowError, TypeError) as exc:
            fail(lib.WASTE_E_ARG, f"sampling parameter {name}={value!r} is out of range: {exc}")


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
                 is_cancelled: Callable[[], bool] | None = None) -> NativeGenerationResult:
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
        return self.generate_ids(ids, params, on_token)

    def generate_ids(self, prompt: Sequence[int], params: SamplingParams,
                     on_token: TokenCallback) -> NativeGenerationResult:
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
        ids = int32_array(prompt, "prompt")
        stops = int32_array(params.stop_ids, "stop_ids")
        gen = ffi.new("waste_gen_params *")
        lib.waste_gen_params_init(gen)
        _set_fields(gen, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                    seed=params.seed, max_tokens=params.max_tokens,
                    n_stop_ids=len(params.stop_ids))
        gen.stop_ids = stops if params.stop_ids else ffi.NULL
        res = ffi.new("waste_gen_result *")
        lib.waste_gen_result_init(res)
        delivery = _Delivery(self, on_token)
        handle = ffi.new_handle(delivery)  # kept alive by this frame for the whole C call
        with self._call() as ctx:
            status = lib.waste_generate(ctx, ids, len(prompt), gen, lib._waste_on_token, handle, res)
            if delivery.error is None:
                self._check(status)
        if delivery.error is not None:
            raise delivery.error
        return NativeGenerationResult(
            prompt_tokens=res.prompt_tokens, tokens_generated=res.tokens_generated,
            stop_reason=STOP_REASONS.get(res.stop_reason, str(res.stop_reason)),
            experts_hit=res.experts_hit, experts_missed=res.experts_missed,
            bytes_read=res.bytes_read, prefill_ms=res.prefill_ms, decode_ms=res.decode_ms,
            direct_io=bool(res.direct_io), tail=ffi.unpack(res.tail, res.tail_len) if res.tail_len else b"")

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
                           budget_bytes=stats.budget_bytes, peak_bytes=stats.peak_bytes)


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
    engine = NativeEngine.open(path, options)
    _log_hotlist(engine)
    try:
        tokenizer = NativeTokenizer.open(path, options)
    except BaseException:
        engine.close()
        raise
    return engine, tokenizer


def _log_hotlist(engine: NativeEngine) -> None:
    """Say what the hotlist did at open: a hint the engine may have ignored, and why."""
    with engine._pointer:
        stats = engine._read_stats(engine._ctx)
        note = ffi.string(stats.usage_note).decode("utf-8", "replace")
        warm, entries = stats.warm_bytes, stats.usage_entries
    if note:
        log.warning("expert hotlist: %s", note)
    elif entries:
        log.info("expert hotlist: %d entries merged, %d bytes of experts warmed", entries, warm)
