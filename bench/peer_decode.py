"""One capped greedy decode, in a process of its own: ``--engine llama`` or ``--engine waste``.

``python bench/peer_decode.py --engine E --model PATH --prompt '[ids]' --warmup 8 --tokens 64
--threads 2 [--cgroup DIR] [--budget BYTES]`` joins the memory group DIR first (before any
model byte is touched), loads the model, evaluates the prompt, then decodes greedily one
token per eval — ``warmup`` untimed, then ``tokens`` timed — and prints one JSON line.

Both engines are driven the same way: each step evaluates one token, takes the argmax of its
logits in Python and feeds it back. llama.cpp runs through llama-cpp-python (the peer venv's
python runs this file); libwaste through our binding (the bench's python). Only the stdlib,
numpy and the engine's own module are imported, because the peer venv has nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path


def rusage() -> dict:
    """This process's peak RSS (VmHWM: ru_maxrss would carry the parent's peak across exec),
    major page faults and CPU seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {"max_rss_bytes": int(status["VmHWM"].split()[0]) * 1024, "major_faults": r.ru_majflt,
            "user_s": r.ru_utime, "system_s": r.ru_stime}


class LlamaStepper:
    """llama.cpp: ``Llama.eval`` of one token, logits of the last one."""

    def __init__(self, model: Path, args) -> None:
        import llama_cpp
        import numpy as np

        self.np, self.lib = np, llama_cpp
        if args.no_extra_bufts:
            # llama.cpp's extra (repacking / AMX) weight buffers, off: on an AMX CPU this
            # build aborts in ggml_backend_sched_split_graph (GGML_ASSERT(*cur_backend_id !=
            # -1)) on this model; Llama() takes no such argument, so its defaults are wrapped.
            import llama_cpp.llama_cpp as low

            default = low.llama_model_default_params

            def without_extra_bufts():
                params = default()
                params.use_extra_bufts = False
                return params

            low.llama_model_default_params = without_extra_bufts
        ctx = len(args.prompt) + args.warmup + args.tokens + 8
        self.llm = llama_cpp.Llama(model_path=str(model), n_ctx=ctx, n_batch=len(args.prompt),
                                   n_threads=args.threads, n_threads_batch=args.threads,
                                   use_mmap=True, use_mlock=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.info = {"engine": "llama.cpp", "version": llama_cpp.__version__,
                     "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
                     "n_ctx": self.llm.n_ctx(), "mmap": True, "extra_bufts": not args.no_extra_bufts}

    def step(self, tokens: list[int]) -> int:
        self.llm.eval(tokens)
        row = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return int(self.np.ctypeslib.as_array(row, shape=(self.n_vocab,)).argmax())

    def stats(self) -> dict:
        return {}

    def reset(self) -> None:
        self.llm.reset()

    def close(self) -> None:
        self.llm.close()


class WasteStepper:
    """libwaste: ``NativeEngine.eval`` of one token (the prompt token by token)."""

    def __init__(self, model: Path, args) -> None:
        import numpy as np

        from waste.adapters.native import NativeEngine, NativeOptions

        self.np = np
        ctx = len(args.prompt) + args.warmup + args.tokens + 8
        options = NativeOptions(ctx_tokens=ctx, usage_path="", n_threads=args.threads,
                                ram_budget_bytes=args.budget, prefill_chunk=args.prefill_chunk,
                                cache_policy=args.policy, io_threads=args.io_threads,
                                lookahead=args.lookahead, activations=args.activations)
        self.engine = NativeEngine.open(model, options)
        self.batch = args.prefill_chunk != 1
        self.info = {"engine": "libwaste", "budget_bytes": args.budget, "policy": args.policy,
                     "io_threads": args.io_threads, "lookahead": args.lookahead,
                     "activations": args.activations, "prefill_chunk": args.prefill_chunk}

    def step(self, tokens: list[int]) -> int:
        logits = None
        for t in ([tokens] if self.batch else [[t] for t in tokens]):
            logits = self.engine.eval(t)
        return int(self.np.asarray(logits).argmax())

    def reset(self) -> None:
        self.engine.reset()

    def stats(self) -> dict:
        s = self.engine.statistics()
        return {"experts_hit": s.experts_hit, "experts_missed": s.experts_missed,
                "direct_io": s.direct_io}

    def close(self) -> None:
        self.engine.close()


def decode(stepper, prompt: list[int], warmup: int, tokens: int) -> dict:
    """Prompt, ``warmup`` untimed steps, then ``tokens`` timed steps; ids and times."""
    started = time.perf_counter()
    nxt = stepper.step(prompt)
    prefill_s = time.perf_counter() - started
    ids = [nxt]
    for _ in range(warmup):
        nxt = stepper.step([nxt])
        ids.append(nxt)
    before, faults0 = stepper.stats(), rusage()["major_faults"]
    times = []
    for _ in range(tokens):
        t0 = time.perf_counter()
        nxt = stepper.step([nxt])
        times.append(time.perf_counter() - t0)
        ids.append(nxt)
    after = stepper.stats()
    out = {"prefill_s": round(prefill_s, 3), "seconds": sum(times), "tok_per_s": tokens / sum(times),
           "token_s_min": min(times), "token_s_max": max(times), "token_ids": ids,
           "major_faults_measured": rusage()["major_faults"] - faults0}
    if "experts_hit" in after:
        hits = after["experts_hit"] - before["experts_hit"]
        misses = after["experts_missed"] - before["experts_missed"]
        out.update(h=hits / max(hits + misses, 1), direct_io=after["direct_io"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("llama", "waste"), required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompt", type=json.loads, required=True)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--cgroup", type=Path)
    ap.add_argument("--budget", type=int, default=0, help="libwaste's ram_budget_bytes")
    ap.add_argument("--policy", default="layer")
    ap.add_argument("--io-threads", type=int, default=0, help="libwaste's io_threads")
    ap.add_argument("--lookahead", type=int, default=0, help="libwaste's lookahead")
    ap.add_argument("--activations", default="f32", help="libwaste's activations (f32 or q8)")
    ap.add_argument("--prefill-chunk", type=int, default=1, help="libwaste's prefill_chunk (1: token by token)")
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="llama.cpp: model param use_extra_bufts = false (no repacked/AMX weight buffers)")
    ap.add_argument("--twice", action="store_true",
                    help="decode everything once untimed, reset, then measure: every weight the "
                         "measured pass uses is resident (the in-RAM runs)")
    args = ap.parse_args()
    if args.cgroup is not None:
        (args.cgroup / "cgroup.procs").write_text(str(os.getpid()))
    base = rusage()
    loaded = time.perf_counter()
    stepper = (LlamaStepper if args.engine == "llama" else WasteStepper)(args.model, args)
    load_s = time.perf_counter() - loaded
    try:
        if args.twice:
            decode(stepper, args.prompt, args.warmup, args.tokens)
            stepper.reset()
        run = decode(stepper, args.prompt, args.warmup, args.tokens)
    finally:
        stepper.close()
    print(json.dumps({**stepper.info, "load_s": round(load_s, 3), **run,
                      "rss_before_load_bytes": base["max_rss_bytes"], **rusage()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
