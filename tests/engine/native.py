"""A test-side view of libwaste's C API through the binding's own cffi module (API mode).

Calls go to ``waste.adapters.native.context``'s ``ffi``/``lib`` with raw ``waste_cfg`` fields,
so tests see exactly the status *name* and ``waste_last_error`` detail a host would see;
failures raise the binding's ``EngineError`` through its one ``check``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from waste.adapters.native.context import check, ffi, lib
from waste.domain.ports import EngineError


def status_name(status: int) -> str:
    return ffi.string(lib.waste_status_name(status)).decode()


def new_cfg(keep: list, **fields) -> Any:
    """A ``waste_cfg`` with ``fields`` set by name (strings kept alive in ``keep``)."""
    cfg = ffi.new("waste_cfg *")
    lib.waste_cfg_init(cfg)
    for key, value in fields.items():
        if isinstance(value, str):
            value = ffi.new("char[]", value.encode())
            keep.append(value)
        setattr(cfg, key, value)
    return cfg


def try_open(path, **fields) -> tuple[str, str, "Ctx | None"]:
    """(status name, detail, Ctx or None) of ``waste_open`` with raw cfg ``fields``."""
    keep: list = []
    cfg = new_cfg(keep, **fields)
    err = ffi.new("char[1024]")
    out = ffi.new("waste_ctx **")
    status = lib.waste_open(str(path).encode(), cfg, out, err, 1024)
    if status != lib.WASTE_OK:
        return status_name(status), ffi.string(err).decode(), None
    return "OK", "", Ctx(out[0])


def open_ctx(path, **fields) -> "Ctx":
    """An open Ctx, or EngineError with the open's status and detail."""
    keep: list = []
    cfg = new_cfg(keep, **fields)
    err = ffi.new("char[1024]")
    out = ffi.new("waste_ctx **")
    check(lib.waste_open(str(path).encode(), cfg, out, err, 1024), lambda: ffi.string(err).decode())
    return Ctx(out[0])


def plan_of(path, **fields) -> Any:
    """``waste_plan_memory`` of the container at ``path`` (asserting it succeeds)."""
    keep: list = []
    plan = ffi.new("waste_plan *")
    lib.waste_plan_init(plan)
    err = ffi.new("char[512]")
    status = lib.waste_plan_memory(str(path).encode(), new_cfg(keep, **fields), plan, err, 512)
    assert status == lib.WASTE_OK, ffi.string(err).decode()
    return plan


def build_info() -> str:
    return ffi.string(lib.waste_build_info()).decode()


class _Events:
    """The ``user`` of one generate call: the binding's ``_waste_on_token`` calls ``deliver``."""

    def __init__(self, on_token) -> None:
        self.on_token = on_token
        self.events: list[dict] = []

    def deliver(self, info) -> int:
        event = {"index": info.index, "token": info.token, "is_stop": info.is_stop,
                 "logprob": info.logprob, "piece": ffi.unpack(info.piece, info.piece_len)}
        self.events.append(event)
        return int(self.on_token(event)) if self.on_token else 0


class Ctx:
    """One raw ``waste_ctx``: ``ffi``, ``lib`` and ``ctx`` are there for direct C calls."""

    def __init__(self, ctx) -> None:
        self.ffi, self.lib, self.ctx = ffi, lib, ctx
        info = ffi.new("waste_model_info *")
        lib.waste_model_info_init(info)
        assert lib.waste_get_model_info(ctx, info) == 0
        self.info = info
        self.vocab = info.vocab

    def close(self) -> None:
        if self.ctx is not None:
            lib.waste_close(self.ctx)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- status plumbing ---------------------------------------------------------------
    name = staticmethod(status_name)

    def detail(self) -> str:
        return ffi.string(lib.waste_last_error(self.ctx)).decode()

    def check(self, status: int) -> None:
        check(status, self.detail)

    def status_of(self, status: int) -> tuple[str, str]:
        return self.name(status), self.detail() if status else ""

    # -- calls ---------------------------------------------------------------------------
    def eval_status(self, ids) -> tuple[str, str]:
        arr = ffi.new("int32_t[]", list(ids) or [0])
        return self.status_of(lib.waste_eval(self.ctx, arr, len(ids), ffi.NULL, 0))

    def eval(self, ids) -> np.ndarray:
        arr = ffi.new("int32_t[]", list(ids))
        out = np.zeros(self.vocab, dtype=np.float32)
        self.check(lib.waste_eval(self.ctx, arr, len(ids), ffi.from_buffer("float[]", out), self.vocab))
        return out

    def reset(self) -> None:
        self.check(lib.waste_reset(self.ctx))

    def position(self) -> int:
        return lib.waste_position(self.ctx)

    def snapshot(self) -> bytes:
        size = ffi.new("uint64_t *")
        self.check(lib.waste_snapshot_size(self.ctx, size))
        buf = ffi.new("char[]", size[0])
        n = ffi.new("uint64_t *")
        self.check(lib.waste_snapshot_save(self.ctx, buf, size[0], n))
        return ffi.unpack(buf, n[0])

    def restore_status(self, blob: bytes) -> tuple[str, str]:
        return self.status_of(lib.waste_snapshot_load(self.ctx, blob, len(blob)))

    def stats(self):
        s = ffi.new("waste_stats *")
        lib.waste_stats_init(s)
        assert lib.waste_get_stats(self.ctx, s) == 0
        return s

    def abort(self) -> None:
        lib.waste_abort(self.ctx)

    def save_usage(self, path=None) -> tuple[str, str]:
        return self.status_of(lib.waste_save_usage(self.ctx, ffi.NULL if path is None else str(path).encode()))

    def tokenize(self, text: bytes, markup: bool = False, add_bos: bool = False) -> list[int]:
        fn = lib.waste_tokenize_markup if markup else lib.waste_tokenize
        n = ffi.new("uint64_t *")
        out = ffi.new("int32_t[]", len(text) + 2)
        self.check(fn(self.ctx, text, len(text), int(add_bos), out, len(text) + 2, n))
        return list(out[0:n[0]])

    def detokenize(self, ids) -> bytes:
        n = ffi.new("uint64_t *")
        arr = ffi.new("int32_t[]", list(ids) or [0])
        status = lib.waste_detokenize(self.ctx, arr, len(ids), ffi.NULL, 0, n)
        if status not in (lib.WASTE_OK, lib.WASTE_E_SPACE):
            self.check(status)
        out = ffi.new("char[]", n[0] + 1)
        self.check(lib.waste_detokenize(self.ctx, arr, len(ids), out, n[0], n))
        return ffi.unpack(out, n[0])

    def generate(self, prompt, *, temperature=0.0, top_p=1.0, top_k=0, seed=0, max_tokens=0,
                 stop_ids=(), on_token=None):
        """(status name, detail, result cdata, events); ``on_token(event) -> int`` (1 = stop)."""
        p = ffi.new("waste_gen_params *")
        lib.waste_gen_params_init(p)
        p.temperature, p.top_p, p.top_k, p.seed, p.max_tokens = temperature, top_p, top_k, seed, max_tokens
        stops = ffi.new("int32_t[]", list(stop_ids) or [0])
        p.stop_ids, p.n_stop_ids = stops, len(stop_ids)
        res = ffi.new("waste_gen_result *")
        lib.waste_gen_result_init(res)
        events = _Events(on_token)
        handle = ffi.new_handle(events)
        arr = ffi.new("int32_t[]", list(prompt) or [0])
        status = lib.waste_generate(self.ctx, arr, len(prompt), p, lib._waste_on_token, handle, res)
        name, detail = self.status_of(status)
        return name, detail, res, events.events


__all__ = ["Ctx", "EngineError", "build_info", "open_ctx", "plan_of", "status_name", "try_open"]
