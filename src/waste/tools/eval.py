"""Prints libwaste's logits for a token sequence: ``python -m waste.tools.eval MODEL --ids 1,2,3``.

A thin, private cffi ABI-mode binding (the header's CDEF region, dlopen'd) for tools and
engine tests; the server's real adapter lives in ``waste.adapters.native``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HEADER = REPO / "native" / "include" / "waste.h"
DEFAULT_LIB = REPO / "native" / "build" / "libwaste.so"


def header_cdef(header: Path = HEADER) -> str:
    """The text between the WASTE_CDEF markers of waste.h."""
    text = header.read_text()
    begin = text.index("/* WASTE_CDEF_BEGIN */") + len("/* WASTE_CDEF_BEGIN */")
    return text[begin:text.index("/* WASTE_CDEF_END */")]


def open_library(lib: str | Path = DEFAULT_LIB):
    """Returns (ffi, lib) for libwaste; refuses an API version mismatch."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(header_cdef())
    handle = ffi.dlopen(str(lib))
    if handle.waste_api_version() != handle.WASTE_API_VERSION:
        raise RuntimeError(f"{lib}: api version {handle.waste_api_version()} != header {handle.WASTE_API_VERSION}")
    return ffi, handle


class Model:
    """One open ctx; raises RuntimeError('<status>: <detail>') on failure."""

    def __init__(self, path: str | Path, lib: str | Path = DEFAULT_LIB, **cfg) -> None:
        self.ffi, self.lib = open_library(lib)
        c = self.ffi.new("waste_cfg *")
        self.lib.waste_cfg_init(c)
        for k, v in cfg.items():
            setattr(c, k, v)
        err = self.ffi.new("char[1024]")
        out = self.ffi.new("waste_ctx **")
        st = self.lib.waste_open(str(path).encode(), c, out, err, 1024)
        if st != 0:
            raise RuntimeError(f"{self.status(st)}: {self.ffi.string(err).decode()}")
        self.ctx = out[0]
        info = self.ffi.new("waste_model_info *")
        self.lib.waste_model_info_init(info)
        self.check(self.lib.waste_get_model_info(self.ctx, info))
        self.vocab = info.vocab

    def status(self, st: int) -> str:
        return self.ffi.string(self.lib.waste_status_name(st)).decode()

    def check(self, st: int) -> None:
        if st != 0:
            raise RuntimeError(f"{self.status(st)}: {self.ffi.string(self.lib.waste_last_error(self.ctx)).decode()}")

    def eval(self, ids: list[int]) -> list[float]:
        """Appends ids and returns the last position's logits."""
        arr = self.ffi.new("int32_t[]", ids)
        logits = self.ffi.new("float[]", self.vocab)
        self.check(self.lib.waste_eval(self.ctx, arr, len(ids), logits, self.vocab))
        return list(logits)

    def reset(self) -> None:
        self.check(self.lib.waste_reset(self.ctx))

    def close(self) -> None:
        if self.ctx is not None:
            self.lib.waste_close(self.ctx)
            self.ctx = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m waste.tools.eval", description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--json", action="store_true", help="print a JSON list")
    ap.add_argument("--lib", default=str(DEFAULT_LIB))
    ap.add_argument("--kernels", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        ids = [int(x) for x in args.ids.split(",") if x.strip()]
    except ValueError:
        print("eval: error: --ids must be comma-separated integers", file=sys.stderr)
        return 2
    try:
        m = Model(args.model, args.lib, kernels=args.kernels, n_threads=args.threads)
        logits = m.eval(ids)
        m.close()
    except (RuntimeError, OSError) as exc:
        print(f"eval: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(logits))
    else:
        print(" ".join(f"{x:.6g}" for x in logits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
