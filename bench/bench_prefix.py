"""Second-turn time to first token with the prefix cache vs a cold prefill of the same
prompt, on a streamed container (budget below all experts); and peak RSS with the cache
full (docs/ENGINE.md §2 "Prefix cache"). Speed is measured here, never asserted in tests.

    python bench/bench_prefix.py [--container DIR] [--prompt 1500] [--reply 32] [--new 40]

Without --container a synthetic one is built (waste.tools.make_container, int8). Each
measurement runs in its own child process so that its VmHWM is its own:

- ``cached``: budget B, prefix cache C out of it. Turn 1 (prompt + reply), then turn 2 =
  turn 1's prompt + reply + ``--new`` tokens: TTFT and tokens prefilled.
- ``cold``: the engine's share of the same budget (B − C) and no cache: the same two turns;
  turn 2 prefills everything. The expert cache is the same size in both runs.
- ``full``: budget B, cache C, prompts until the cache has evicted: VmHWM vs B.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GEOMETRY = dict(layers=8, hidden=256, intermediate=512, moe_intermediate=128, experts=64,
                top_k=4, kda_heads=4, kda_head_dim=32, mla_heads=4, dtype="int8")


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def vm_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def child(args: argparse.Namespace) -> dict:
    from waste.adapters.native import NativeEngine, NativeOptions
    from waste.domain.ports import Prompt, SamplingParams

    import numpy  # noqa: F401  (loaded before the baseline, as the runs use it)

    baseline = vm_rss()  # the interpreter, numpy and the binding, before the engine opens
    cache = args.cache if args.mode != "cold" else 0
    budget = args.budget if args.mode != "cold" else args.budget - args.cache
    engine = NativeEngine.open(args.container, NativeOptions(
        ram_budget_bytes=budget, ctx_tokens=args.ctx, usage_path="", prefix_cache=cache))
    vocab = engine.model_info().vocab
    rng = np.random.default_rng(1)

    def ids(n: int) -> list[int]:
        return [int(x) for x in rng.integers(3, vocab, n)]

    def run(prompt: list[int], max_tokens: int) -> tuple[float, list[int], object]:
        first: list[float] = []
        reply: list[int] = []
        started = time.perf_counter()

        def on_token(event) -> bool:
            if not first:
                first.append(time.perf_counter() - started)
            reply.append(event.token)
            return False

        result = engine.generate(Prompt(ids=tuple(prompt)),
                                 SamplingParams(temperature=0.0, max_tokens=max_tokens), on_token)
        return first[0], reply, result

    out: dict = {"mode": args.mode, "budget_bytes": budget, "prefix_cache_bytes": cache}
    if args.mode in ("cached", "cold"):
        turn1 = ids(args.prompt)
        ttft1, reply, r1 = run(turn1, args.reply)
        turn2 = turn1 + reply + ids(args.new)
        ttft2, _, r2 = run(turn2, 1)
        out.update(turn1_ttft_s=ttft1, turn2_ttft_s=ttft2, turn2_prompt_tokens=r2.prompt_tokens,
                   turn2_prefilled_tokens=r2.prompt_tokens - r2.cached_tokens,
                   turn2_experts_missed=r2.experts_missed)
    else:
        n = 0
        while engine.prefix_cache.stats().evictions == 0 and n < 200:
            run(ids(args.prompt), 4)
            n += 1
        stats = engine.prefix_cache.stats()
        out.update(prompts=n, entries=stats.entries, cache_bytes=stats.bytes,
                   evictions=stats.evictions, engine_peak_bytes=engine.statistics().peak_bytes)
    engine.close()
    out["vm_hwm_bytes"] = vm_hwm()
    out["baseline_rss_bytes"] = baseline
    out["peak_above_baseline_bytes"] = out["vm_hwm_bytes"] - baseline
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--container")
    ap.add_argument("--prompt", type=int, default=1500)
    ap.add_argument("--reply", type=int, default=32)
    ap.add_argument("--new", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--expert-share", type=float, default=0.2,
                    help="expert cache as a share of all expert bytes (below 1: streamed)")
    ap.add_argument("--modes", default="cached,cold,full")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(child(args)))
        return 0

    from waste.adapters.native import NativeOptions, plan_memory
    from waste.tools.make_container import Geometry, build_container

    if args.container is None:
        args.container = str(Path(tempfile.gettempdir()) / "bench-prefix.waste")
        if not Path(args.container).exists():
            build_container(args.container, seed=2, geometry=Geometry(**GEOMETRY))
    plan = plan_memory(args.container, NativeOptions(ctx_tokens=args.ctx))
    engine_budget = plan.floor_bytes + int(args.expert_share * plan.expert_bytes)
    entry = plan.state_bytes + 4 * args.ctx + 36
    cache = 6 * entry  # room for a few full-context entries: "full" evicts after a few prompts
    budget = engine_budget + cache
    rows = {}
    for mode in args.modes.split(","):
        run = subprocess.run([sys.executable, __file__, "--container", args.container,
                              "--mode", mode, "--budget", str(budget), "--cache", str(cache),
                              "--prompt", str(args.prompt), "--reply", str(args.reply),
                              "--new", str(args.new), "--ctx", str(args.ctx)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
        rows[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    summary = {} if set(rows) != {"cached", "cold", "full"} else {
        "expert_bytes": plan.expert_bytes, "budget_bytes": budget,
        "engine_budget_bytes": engine_budget, "prefix_cache_bytes": cache,
        "streamed": engine_budget < plan.floor_bytes + plan.expert_bytes,
        "turn2_ttft_ratio_cached_over_cold":
            rows["cached"]["turn2_ttft_s"] / rows["cold"]["turn2_ttft_s"],
        "turn2_prefilled_cached": rows["cached"]["turn2_prefilled_tokens"],
        "turn2_prefilled_cold": rows["cold"]["turn2_prefilled_tokens"],
        "full_cache_vm_hwm_bytes": rows["full"]["vm_hwm_bytes"],
        "full_cache_baseline_rss_bytes": rows["full"]["baseline_rss_bytes"],
        "full_cache_peak_above_baseline_over_budget":
            rows["full"]["peak_above_baseline_bytes"] / budget,
    }
    print(json.dumps({"runs": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
