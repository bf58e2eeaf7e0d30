"""A test-side view of libwaste through the header's cdef (cffi ABI mode).

Every call returns or raises with the status *name* and ``waste_last_error`` detail, so
tests assert on exactly what a host would see.
"""

from __future__ import annotations

import numpy as np

from waste.tools.eval import open_library


class NativeError(Exception):
    def __init__(self, status: str, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


def try_open(lib_path, path, **cfg):
    """(status name, detail, Ctx or None)."""
    ffi, lib = open_library(lib_path)
    c = ffi.new("waste_cfg *")
    lib.waste_cfg_init(c)
    keep = []
    for k, v in cfg.items():
        if isinstance(v, str):
            v = ffi.new("char[]", v.encode())
            keep.append(v)
        setattr(c, k, v)
    err = ffi.new("char[1024]")
    out = ffi.new("waste_ctx **")
    st = lib.waste_open(str(path).encode(), c, out, err, 1024)
    name = ffi.string(lib.waste_status_name(st)).decode()
    if st != 0:
        return name, ffi.string(err).decode(), None
    return name, "", Ctx(ffi, lib, out[0])


def open_ctx(lib_path, path, **cfg) -> "Ctx":
    status, detail, ctx = try_open(lib_path, path, **cfg)
    if ctx is None:
        raise NativeError(status, detail)
    return ctx


class Ctx:
    def __init__(self, ffi, lib, ctx) -> None:
        self.ffi, self.lib, self.ctx = ffi, lib, ctx
        info = ffi.new("waste_model_info *")
        lib.waste_model_info_init(info)
        assert lib.waste_get_model_info(ctx, info) == 0
        self.info = info
        self.vocab = info.vocab

    def close(self) -> None:
        if self.ctx is not None:
            self.lib.waste_close(self.ctx)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- status plumbing ---------------------------------------------------------------
    def name(self, st: int) -> str:
        return self.ffi.string(self.lib.waste_status_name(st)).decode()

    def detail(self) -> str:
        return self.ffi.string(self.lib.waste_last_error(self.ctx)).decode()

    def check(self, st: int) -> None:
        if st != 0:
            raise NativeError(self.name(st), self.detail())

    # -- calls -----------------------------------------------------------------------------
    def eval_status(self, ids) -> tuple[str, str]:
        arr = self.ffi.new("int32_t[]", list(ids) or [0])
        st = self.lib.waste_eval(self.ctx, arr, len(ids), self.ffi.NULL, 0)
        return self.name(st), self.detail() if st else ""

    def eval(self, ids) -> np.ndarray:
        arr = self.ffi.new("int32_t[]", list(ids))
        out = np.zeros(self.vocab, dtype=np.float32)
        self.check(self.lib.waste_eval(self.ctx, arr, len(ids), self.ffi.from_buffer("float[]", out), self.vocab))
        return out

    def reset(self) -> None:
        self.check(self.lib.waste_reset(self.ctx))

    def position(self) -> int:
        return self.lib.waste_position(self.ctx)

    def snapshot(self) -> bytes:
        size = self.ffi.new("uint64_t *")
        self.check(self.lib.waste_snapshot_size(self.ctx, size))
        buf = self.ffi.new("char[]", size[0])
        n = self.ffi.new("uint64_t *")
        self.check(self.lib.waste_snapshot_save(self.ctx, buf, size[0], n))
        return bytes(self.ffi.buffer(buf, n[0]))

    def restore_status(self, blob: bytes) -> tuple[str, str]:
        st = self.lib.waste_snapshot_load(self.ctx, blob, len(blob))
        return self.name(st), self.detail() if st else ""

    def stats(self):
        s = self.ffi.new("waste_stats *")
        self.lib.waste_stats_init(s)
        assert self.lib.waste_get_stats(self.ctx, s) == 0
        return s

    def abort(self) -> None:
        self.lib.waste_abort(self.ctx)

    def tokenize(self, text: bytes, markup: bool = False, add_bos: bool = False) -> list[int]:
        fn = self.lib.waste_tokenize_markup if markup else self.lib.waste_tokenize
        n = self.ffi.new("uint64_t *")
        out = self.ffi.new("int32_t[]", len(text) + 2)
        self.check(fn(self.ctx, text, len(text), int(add_bos), out, len(text) + 2, n))
        return list(out[0:n[0]])

    def detokenize(self, ids) -> bytes:
        n = self.ffi.new("uint64_t *")
        arr = self.ffi.new("int32_t[]", list(ids) or [0])
        st = self.lib.waste_detokenize(self.ctx, arr, len(ids), self.ffi.NULL, 0, n)
        if st not in (0, -10):
            self.check(st)
        out = self.ffi.new("char[]", n[0] + 1)
        self.check(self.lib.waste_detokenize(self.ctx, arr, len(ids), out, n[0], n))
        return bytes(self.ffi.buffer(out, n[0]))

    def generate(self, prompt, *, temperature=0.0, top_p=1.0, top_k=0, seed=0, max_tokens=0,
                 stop_ids=(), on_token=None):
        """Returns (status name, detail, result cdata, events). ``on_token(event) -> int``."""
        p = self.ffi.new("waste_gen_params *")
        self.lib.waste_gen_params_init(p)
        p.temperature, p.top_p, p.top_k, p.seed, p.max_tokens = temperature, top_p, top_k, seed, max_tokens
        stops = self.ffi.new("int32_t[]", list(stop_ids) or [0])
        p.stop_ids, p.n_stop_ids = stops, len(stop_ids)
        res = self.ffi.new("waste_gen_result *")
        self.lib.waste_gen_result_init(res)
        events = []

        @self.ffi.callback("int32_t(const waste_token_info *, void *)")
        def cb(info, user):
            ev = {"index": info.index, "token": info.token, "is_stop": info.is_stop,
                  "logprob": info.logprob, "piece": bytes(self.ffi.buffer(info.piece, info.piece_len))}
            events.append(ev)
            return int(on_token(ev)) if on_token else 0

        arr = self.ffi.new("int32_t[]", list(prompt) or [0])
        st = self.lib.waste_generate(self.ctx, arr, len(prompt), p, cb, self.ffi.NULL, res)
        return self.name(st), self.detail() if st else "", res, events
