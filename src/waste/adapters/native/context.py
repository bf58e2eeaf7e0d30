"""One open libwaste context (``waste_ctx``) and its tokenizer calls, through cffi.

``fail`` is the single place where a libwaste status becomes one of the port's named
``EngineError`` exceptions (``ERRORS``); no status integer leaves this package. A
context serialises its blocking calls (a second concurrent call gets E_BUSY, as the C
library would answer) and guards its pointer so close never races the any-thread calls.
"""

from __future__ import annotations

import functools
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Sequence

import attrs

from waste.domain.ports import (BudgetExceeded, BufferTooSmall, Cancelled, ContextFull,
                                EngineBusy, EngineError, EngineFormatError, EngineIOError,
                                EngineOutOfMemory, InvalidArgument, InvalidState, ModelInfo,
                                Unsupported)

from waste.adapters.native.options import NativeOptions

try:
    from waste.adapters.native._libwaste import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "the libwaste extension waste.adapters.native._libwaste is not built: "
        "run `pip install -e .` (it runs `make -C native` and compiles the cffi module)"
    ) from exc

_ERR_CAP = 1024
SOURCE_HEADER = Path(__file__).resolve().parents[4] / "native" / "include" / "waste.h"
_INT32 = (-(2**31), 2**31 - 1)


# libwaste status -> the port's exception (docs/ENGINE.md §1). The one status table.
ERRORS: dict[int, type[EngineError]] = {
    lib.WASTE_E_IO: EngineIOError, lib.WASTE_E_FORMAT: EngineFormatError,
    lib.WASTE_E_BUDGET: BudgetExceeded, lib.WASTE_E_NOMEM: EngineOutOfMemory,
    lib.WASTE_E_ARG: InvalidArgument, lib.WASTE_E_UNSUPPORTED: Unsupported,
    lib.WASTE_E_CANCELLED: Cancelled, lib.WASTE_E_BUSY: EngineBusy,
    lib.WASTE_E_STATE: InvalidState, lib.WASTE_E_SPACE: BufferTooSmall,
    lib.WASTE_E_CTX: ContextFull,
}


def fail(status: int, detail: str) -> NoReturn:
    """Raise the port's exception for ``status``: the only place a status becomes one.

    libwaste's statuses arrive through ``check``; Python-side refusals of the same kind
    (a closed context, a bad argument, an unreadable chat.json) call this directly.
    """
    kind = ERRORS.get(int(status))
    if kind is None:
        name = ffi.string(lib.waste_status_name(int(status))).decode("utf-8", "replace")
        raise EngineError(f"libwaste status {int(status)} ({name}): {detail}")
    raise kind(detail)


def check(status: int, detail: str | Callable[[], str]) -> None:
    """``fail`` unless ``status`` is WASTE_OK; ``detail`` may be a callable, read only then."""
    if status != lib.WASTE_OK:
        fail(status, detail() if callable(detail) else detail)


def library_version() -> str:
    """libwaste's version string (``waste_version``)."""
    return ffi.string(lib.waste_version()).decode("utf-8", "replace")


def library_build_info() -> str:
    """The compiler, kernels built and selected, format version and O_DIRECT support."""
    return ffi.string(lib.waste_build_info()).decode("utf-8", "replace")


def library_versions() -> str:
    """One line for ``--version``: libwaste's version, API version and build info."""
    return f"{library_build_info()}; API {int(lib.waste_api_version())}"


def check_api_version(header: Path = SOURCE_HEADER) -> None:
    """Refuse a library whose ``waste_api_version()`` differs from the header's.

    Compared with the header the extension was compiled against and, in a source checkout,
    with ``native/include/waste.h`` as it is now (a stale editable build fails here).
    """
    running = int(lib.waste_api_version())
    headers = {"the compiled header": int(lib.WASTE_API_VERSION)}
    if header.is_file():
        found = re.search(r"^#define WASTE_API_VERSION (\d+)", header.read_text("utf-8"), re.M)
        if found:
            headers[str(header)] = int(found.group(1))
    for where, version in headers.items():
        if version != running:
            fail(lib.WASTE_E_UNSUPPORTED,
                 f"libwaste API version {running} differs from {where}'s {version}: rebuild "
                 "with `pip install -e .`")


@attrs.frozen(kw_only=True)
class MemoryPlan:
    """What open would allocate, from the manifest alone (``waste_plan``, docs/ENGINE.md §5)."""

    trunk_bytes: int
    state_bytes: int
    scratch_bytes: int
    vision_bytes: int
    min_cache_bytes: int
    floor_bytes: int
    working_set_bytes: int
    expert_bytes: int
    recommended_bytes: int
    auto_bytes: int
    usable_ram_bytes: int
    budget_bytes: int
    record_bytes: int
    slots: int

    def items(self) -> list[tuple[str, int]]:
        """(field, value) pairs in declaration order, for printing."""
        return [(field.name, getattr(self, field.name)) for field in attrs.fields(MemoryPlan)]


def plan_memory(path: str | Path, options: Any) -> MemoryPlan:
    """The memory plan of the container at ``path`` (for ``--plan``); reads the manifest only.

    Args:
        path: the container directory.
        options: ``NativeOptions`` or a settings object (``NativeOptions.from_settings``).

    Raises:
        EngineError: E_IO/E_FORMAT for a bad manifest, E_BUDGET when the budget is refused.
    """
    check_api_version()
    keep: list[Any] = []
    cfg = new_cfg(NativeOptions.coerce(options), keep)
    plan = ffi.new("waste_plan *")
    lib.waste_plan_init(plan)
    err = ffi.new("char[]", _ERR_CAP)
    status = lib.waste_plan_memory(str(path).encode("utf-8"), cfg, plan, err, _ERR_CAP)
    check(status, lambda: _text(err))
    return MemoryPlan(**{field.name: int(getattr(plan, field.name))
                         for field in attrs.fields(MemoryPlan)})


def int32_array(values: Sequence[int], field: str) -> Any:
    """A C ``int32_t[]`` of ``values``; a value outside int32 is E_ARG naming ``field``."""
    values = list(values)
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or not _INT32[0] <= value <= _INT32[1]:
            fail(lib.WASTE_E_ARG, f"{field}[{i}] must be a token id (an int32), got {value!r}")
    return ffi.new("int32_t[]", values or [0])


def utf8_of(text: str, field: str) -> bytes:
    """``text`` as UTF-8 bytes for C.

    A lone surrogate cannot be encoded (it is what invalid UTF-8 becomes in a Python str),
    so it is refused here, with the status libwaste gives invalid UTF-8: E_ARG, naming the
    character's index. No replacement or ``surrogatepass`` bytes ever reach C.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        fail(lib.WASTE_E_ARG, f"{field}[{exc.start}] is U+{ord(text[exc.start]):04X}, a lone "
                              "surrogate: not valid UTF-8")


def new_cfg(options: NativeOptions, keep: list[Any]) -> Any:
    """A filled ``waste_cfg``; C strings it points to are appended to ``keep`` (alive for open)."""
    cfg = ffi.new("waste_cfg *")
    lib.waste_cfg_init(cfg)
    cfg.ctx_tokens = options.ctx_tokens
    cfg.ram_budget_bytes = options.ram_budget_bytes
    cfg.n_threads = options.n_threads
    cfg.cache_policy = {"lru": lib.WASTE_CACHE_LRU, "lfru": lib.WASTE_CACHE_LFRU,
                        "layer": lib.WASTE_CACHE_LAYER}[options.cache_policy]
    cfg.direct_io = int(options.direct_io)
    cfg.verify = int(options.verify)
    cfg.vision = int(options.vision)
    cfg.exclusive_open = int(options.exclusive_open)
    cfg.prefill_chunk = options.prefill_chunk
    cfg.io_threads = options.io_threads
    cfg.lookahead = options.lookahead
    cfg.tokenizer_only = int(options.tokenizer_only)
    cfg.kernels = {"auto": lib.WASTE_KERNELS_AUTO, "generic": lib.WASTE_KERNELS_GENERIC,
                   "avx2": lib.WASTE_KERNELS_AVX2, "avx512": lib.WASTE_KERNELS_AVX512}[options.kernels]
    cfg.activations = {"f32": lib.WASTE_ACT_F32, "q8": lib.WASTE_ACT_Q8}[options.activations]
    for name, text in (("cpu_list", options.cpu_list), ("usage_path", options.usage_path)):
        if text is not None:
            keep.append(ffi.new("char[]", text.encode("utf-8")))
            setattr(cfg, name, keep[-1])
    return cfg


def _text(chars: Any) -> str:
    return ffi.string(chars).decode("utf-8", "replace")


class NativeContext:
    """An open ``waste_ctx`` with the tokenizer surface shared by the engine and tokenizer.

    Blocking calls run one at a time (E_BUSY otherwise); ``model_info``, ``statistics``
    and ``abort`` may be called from any thread. ``close`` is idempotent.
    """

    def __init__(self, path: str | Path, options: NativeOptions) -> None:
        check_api_version()
        self.path = Path(path)
        self.options = options
        self._calls = threading.Lock()   # held for the length of one blocking call
        self._caller: int | None = None   # the thread holding _calls
        self._pointer = threading.Lock()  # held while the pointer is used or freed
        keep: list[Any] = []
        cfg = new_cfg(options, keep)
        out = ffi.new("waste_ctx **")
        err = ffi.new("char[]", _ERR_CAP)
        status = lib.waste_open(str(self.path).encode("utf-8"), cfg, out, err, _ERR_CAP)
        check(status, lambda: _text(err))
        self._ctx = out[0]
        self._final_stats: Any = None
        try:
            self._info = self._read_model_info()
        except BaseException:
            lib.waste_close(self._ctx)   # nobody else holds the pointer yet: free it here
            self._ctx = ffi.NULL
            raise

    # -- lifetime ---------------------------------------------------------------------
    @contextmanager
    def _call(self) -> Iterator[Any]:
        if not self._calls.acquire(blocking=False):
            fail(lib.WASTE_E_BUSY, "another call is running on this context (calls must be serialised)")
        try:
            if self._ctx == ffi.NULL:
                fail(lib.WASTE_E_STATE, f"the context on {self.path} is closed")
            self._caller = threading.get_ident()
            yield self._ctx
        finally:
            self._caller = None
            self._calls.release()

    def _check(self, status: int) -> None:
        """``check`` with the context's own detail; call it inside ``_call``."""
        check(status, lambda: _text(lib.waste_last_error(self._ctx)))

    @property
    def closed(self) -> bool:
        return self._ctx == ffi.NULL

    def close(self) -> None:
        """Abort any running call, wait for it, then free the context. Idempotent.

        Raises:
            EngineError: E_BUSY when called from inside this context's own token callback
                (waiting there would never end).
        """
        if self._caller == threading.get_ident():
            fail(lib.WASTE_E_BUSY, "close() called from inside this context's own call (the token callback)")
        self.abort()
        with self._calls, self._pointer:
            if self._ctx == ffi.NULL:
                return
            self._final_stats = self._read_stats(self._ctx)
            lib.waste_close(self._ctx)
            self._ctx = ffi.NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def abort(self) -> None:
        """Ask the running call to stop at its next token or prefill chunk (E_CANCELLED).

        Thread-safe. The flag is sticky until a call honours it or ``reset`` runs.
        """
        with self._pointer:
            if self._ctx != ffi.NULL:
                lib.waste_abort(self._ctx)

    # -- identity ---------------------------------------------------------------------
    def _read_model_info(self) -> ModelInfo:
        info = ffi.new("waste_model_info *")
        lib.waste_model_info_init(info)
        with self._call() as ctx:
            self._check(lib.waste_get_model_info(ctx, info))
            stats = self._read_stats(ctx)
        return ModelInfo(
            arch=_text(info.arch), n_layers=info.n_layers, n_experts=info.n_experts,
            top_k=info.top_k, n_shared_experts=info.n_shared_experts, hidden=info.hidden,
            vocab=info.vocab, n_base_vocab=info.n_base_vocab, ctx_tokens=info.ctx_max,
            ctx_train=info.ctx_train, params_total=info.params_total,
            params_active=info.params_active, quant=_text(info.quant),
            vision=bool(info.has_vision), direct_io=bool(stats.direct_io),
            budget_bytes=stats.budget_bytes,
            bos_id=info.bos_id if info.bos_id >= 0 else None,
            eos_id=info.eos_id if info.eos_id >= 0 else None,
            media_placeholder_id=info.media_placeholder_id if info.media_placeholder_id >= 0 else None,
            engine_version=library_version(), build_info=library_build_info())

    def _read_stats(self, ctx: Any) -> Any:
        stats = ffi.new("waste_stats *")
        lib.waste_stats_init(stats)
        check(lib.waste_get_stats(ctx, stats), lambda: _text(lib.waste_last_error(ctx)))
        return stats

    def model_info(self) -> ModelInfo:
        """The model's shape, read once at open. Never raises (it works after close too)."""
        return self._info

    @property
    def n_base_vocab(self) -> int:
        """Ids at or above this are special tokens; below it, byte-level BPE tokens.

        0 for a container without tokenizer files: it has neither text tokens nor specials
        (tokenize and detokenize raise E_UNSUPPORTED), so a caller that classifies ids by
        ``id >= n_base_vocab`` must not be used on it. Never raises.
        """
        return self._info.n_base_vocab

    # -- tokenizer --------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Plain tokenization: special texts are never recognised (every id < n_base_vocab).

        ``text`` is encoded as UTF-8 here; a lone surrogate (``"\\ud800"``, which UTF-8
        cannot encode) is refused before C with E_ARG naming its index in ``text``.

        Raises:
            EngineError: E_ARG (a lone surrogate), E_UNSUPPORTED (no tokenizer files),
                E_BUSY (another call is running), E_STATE (closed).
        """
        return self._tokenize(lib.waste_tokenize, text)

    def tokenize_markup(self, text: str) -> list[int]:
        """Token ids with special texts recognised anywhere, longest match first.

        Raises:
            EngineError: as ``tokenize``.
        """
        return self._tokenize(lib.waste_tokenize_markup, text)

    def _tokenize(self, fn: Any, text: str) -> list[int]:
        data = utf8_of(text, "text")
        with self._call() as ctx:
            ids, n = self._grow("int32_t", len(data) + 1,
                                lambda out, cap, n_out: fn(ctx, data, len(data), 0, out, cap, n_out))
        return list(ids[0:n])

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """Raw bytes of ``ids``, specials written as their text.

        Raises:
            EngineError: E_ARG (an id outside the vocabulary, naming its index),
                E_UNSUPPORTED (no tokenizer files), E_BUSY, E_STATE (closed).
        """
        array = int32_array(ids, "ids")
        with self._call() as ctx:
            out, n = self._grow("char", 8 * len(ids) + 64,
                                lambda buf, cap, n_out: lib.waste_detokenize(ctx, array, len(ids), buf, cap, n_out))
        return ffi.unpack(out, n) if n else b""

    def detokenize_pieces(self, ids: Sequence[int]) -> list[bytes]:
        """The raw bytes of each id on its own, under one hold of the context (the caller
        makes one thread hop for all of them, not one per token).

        Raises:
            EngineError: as ``detokenize``.
        """
        array = int32_array(ids, "ids")
        pieces: list[bytes] = []
        with self._call() as ctx:
            for i in range(len(ids)):
                out, n = self._grow("char", 64, functools.partial(_detokenize_one, ctx, array + i))
                pieces.append(ffi.unpack(out, n) if n else b"")
        return pieces

    def token_text(self, token: int) -> str:
        """The text of one token; bytes that are not valid UTF-8 on their own become U+FFFD.

        Raises:
            EngineError: as ``detokenize``.
        """
        return self.detokenize([token]).decode("utf-8", "replace")

    def special_id(self, text: str) -> int | None:
        """The id of the special token spelled ``text``, or None when it is not one token.

        Raises:
            EngineError: as ``tokenize``.
        """
        ids = self.tokenize_markup(text)
        if len(ids) == 1 and ids[0] >= self.n_base_vocab:
            return ids[0]
        return None

    def _grow(self, ctype: str, cap: int, call: Callable[[Any, int, Any], int]) -> tuple[Any, int]:
        """Run ``call(buffer, cap, n_out)``, once more with the size E_SPACE asked for."""
        n_out = ffi.new("uint64_t *")
        buffer = ffi.new(f"{ctype}[]", max(cap, 1))
        status = call(buffer, cap, n_out)
        if status == lib.WASTE_E_SPACE and n_out[0] > cap:
            cap = int(n_out[0])
            buffer = ffi.new(f"{ctype}[]", cap)
            status = call(buffer, cap, n_out)
        self._check(status)
        return buffer, int(n_out[0])


def _detokenize_one(ctx: Any, one: Any, buf: Any, cap: int, n_out: Any) -> int:
    return lib.waste_detokenize(ctx, one, 1, buf, cap, n_out)
