"""Second-turn time to first token with the prefix cache vs a cold prefill of the same
prompt, on a streamed container (budget below all experts); the bytes entries save by
sharing MLA latents; and peak RSS vs the budget with the cache full (docs/ENGINE.md §2
"Prefix cache"). Speed is measured here, never asserted in tests.

    python bench/bench_prefix.py [--container DIR] [--prompt 1500] [--reply 32] [--new 40]

Without --container a synthetic one is built (waste.tools.make_container, int8). Each
measurement runs in its own child process so that its VmHWM is its own:

- ``cached``: budget B, prefix cache C out of it. Turn 1 (prompt + reply), then turn 2 =
  turn 1's prompt + reply + ``--new`` tokens: TTFT and tokens prefilled; then turns 3..
  ``--turns`` the same way, and the cache's bytes vs what its entries would take as whole
  snapshots (entries every ``--interval`` tokens).
- ``cold``: the engine's share of the same budget (B − C) and no cache: turns 1 and 2;
  turn 2 prefills everything. The expert cache is the same size in both runs.
- ``full``: budget B, cache C, prompts until the cache has evicted.

Every run reports its peak RSS (VmHWM) above the RSS before the engine opened (the
interpreter, numpy and the binding, loaded first) against its budget, and what made it:
libwaste's own peak, the cache's pages, and the rest (the Python process's own heap).
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

    rng = np.random.default_rng(1)
    rng.integers(3, 10, 10)  # numpy.random's code pages load before the baseline too
    baseline = vm_rss()  # the interpreter, numpy and the binding, before the engine opens
    cache = args.cache if args.mode != "cold" else 0
    budget = args.budget if args.mode != "cold" else args.budget - args.cache
    engine = NativeEngine.open(args.container, NativeOptions(
        ram_budget_bytes=budget, ctx_tokens=args.ctx, usage_path="", prefix_cache=cache,
        prefix_interval=args.interval))
    vocab = engine.model_info().vocab

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
        ttft2, reply, r2 = run(turn2, args.reply if args.mode == "cached" else 1)
        out.update(turn1_ttft_s=ttft1, turn2_ttft_s=ttft2, turn2_prompt_tokens=r2.prompt_tokens,
                   turn2_prefilled_tokens=r2.prompt_tokens - r2.cached_tokens,
                   turn2_experts_missed=r2.experts_missed)
        if args.mode == "cached":
            turn, cached = turn2, [r1.cached_tokens, r2.cached_tokens]
            for _ in range(args.turns - 2):
                turn = turn + reply + ids(args.new)
                _, reply, r = run(turn, args.reply)
                cached.append(r.cached_tokens)
            stored, unshared = engine.prefix_cache_sharing()
            out.update(turns=args.turns, last_prompt_tokens=len(turn), cached_tokens=cached,
                       entries=len(engine.prefix_cache), evictions=engine.prefix_cache.evictions,
                       cache_bytes_shared=stored, cache_bytes_as_whole_snapshots=unshared)
    else:
        n = 0
        while engine.prefix_cache.stats().evictions == 0 and n < 200:
            run(ids(args.prompt), 4)
            n += 1
        stats = engine.prefix_cache.stats()
        out.update(prompts=n, entries=stats.entries, evictions=stats.evictions)
    stats = engine.statistics()
    out.update(engine_peak_bytes=stats.peak_bytes, cache_bytes=engine.prefix_cache.bytes)
    out["vm_hwm_bytes"] = vm_hwm()
    out["baseline_rss_bytes"] = baseline
    out["peak_above_baseline_bytes"] = out["vm_hwm_bytes"] - baseline
    out["peak_over_budget_bytes"] = out["peak_above_baseline_bytes"] - budget
    # What the budget does not count: the process's own allocations beyond libwaste's peak
    # and the cache's pages (an upper bound: the cache's bytes are its current ones).
    out["outside_budget_bytes"] = (out["peak_above_baseline_bytes"] - stats.peak_bytes
                                   - out["cache_bytes"])
    engine.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--container")
    ap.add_argument("--prompt", type=int, default=1500)
    ap.add_argument("--reply", type=int, default=32)
    ap.add_argument("--new", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=5, help="turns of the cached conversation")
    ap.add_argument("--interval", type=int, default=256, help="--prefix-interval")
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
    entry = plan.state_bytes + 4 * args.ctx + 52  # a root segment at a full context
    cache = 6 * entry  # room for a few full-context entries: "full" evicts after a few prompts
    budget = engine_budget + cache
    rows = {}
    for mode in args.modes.split(","):
        run = subprocess.run([sys.executable, __file__, "--container", args.container,
                              "--mode", mode, "--budget", str(budget), "--cache", str(cache),
                              "--prompt", str(args.prompt), "--reply", str(args.reply),
                              "--new", str(args.new), "--ctx", str(args.ctx),
                              "--turns", str(args.turns), "--interval", str(args.interval)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
        rows[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    summary: dict = {"peak_rss_above_baseline_vs_budget": {
        mode: f"{row['peak_above_baseline_bytes'] / 1e6:.2f} MB of {row['budget_bytes'] / 1e6:.2f} MB "
              f"({row['peak_over_budget_bytes'] / 1e6:+.2f} MB; outside the budget: "
              f"{row['outside_budget_bytes'] / 1e6:.2f} MB)"
        for mode, row in rows.items()}}
    if "cached" in rows:
        summary.update(cache_bytes_shared=rows["cached"]["cache_bytes_shared"],
                       cache_bytes_as_whole_snapshots=rows["cached"]["cache_bytes_as_whole_snapshots"])
    if {"cached", "cold"} <= set(rows):
        summary.update({
            "expert_bytes": plan.expert_bytes, "budget_bytes": budget,
            "engine_budget_bytes": engine_budget, "prefix_cache_bytes": cache,
            "streamed": engine_budget < plan.floor_bytes + plan.expert_bytes,
            "turn2_ttft_ratio_cached_over_cold":
                rows["cached"]["turn2_ttft_s"] / rows["cold"]["turn2_ttft_s"],
            "turn2_prefilled_cached": rows["cached"]["turn2_prefilled_tokens"],
            "turn2_prefilled_cold": rows["cold"]["turn2_prefilled_tokens"]})
    print(json.dumps({"runs": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
