"""Expert-cache policies replayed offline on a recorded routing trace, and the trace's locality.

``.venv/bin/python bench/policy_sim.py TRACE [--slots 250] [--skip-tokens 16]`` with TRACE a
routing trace from ``bench/bench_oracle.py --out DIR --depth --tokens 400 --keep-trace TRACE``
(record only; bench/oracle_prefetch.patch's
format: per decode MoE layer one row of int32, the bank then WE_REQS/2 expert ids, the
selected ones ascending, -1 after them; WE_REQS is read from native/src/engine.h, as the patch
compiles against it). Each policy sees the layers in order, pins the
layer's selected experts until the layer ends (as the engine's fetch window does), and reads
no guesses. Prints the hit rate over the tokens after the first ``--skip-tokens`` (the
bench's prompt and warm-up) for:

- ``layer``: the engine's default (native/src/experts.c: furthest in the layer cycle, fewest
  accesses, oldest; the coldest expert instead when 2 standard deviations colder);
- ``lfu``: fewest accesses since the start, oldest on ties;
- ``lfu-decay-H``: accesses weighted by 2^(−age/H tokens), H = 3, 10, 30, 100;
- ``belady``: the offline optimum, evicting the expert whose next use is furthest away.

And the trace's temporal locality: P(an expert of a layer is used by token t+1 | used by
token t), against what independent tokens with the same per-expert rates give.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Callable

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_predictability import independent_locality, usage_locality  # noqa: E402

ENGINE_H = Path(__file__).resolve().parent.parent / "native" / "src" / "engine.h"


def trace_row_ints(engine_h: Path = ENGINE_H) -> int:
    """A trace row's int32 count: the bank, then WE_REQS / 2 expert ids (the patch's oracle_row)."""
    m = re.search(r"^#define WE_REQS (\d+)\b", engine_h.read_text(), re.MULTILINE)
    if m is None:
        raise SystemExit(f"{engine_h}: no '#define WE_REQS N' (the trace's row width comes from it)")
    return 1 + int(m.group(1)) // 2


ROW = trace_row_ints()


def load(path: Path) -> tuple[list[tuple[int, list[int]]], int, int]:
    data = np.fromfile(path, dtype=np.int32)
    if data.size == 0 or data.size % ROW:
        raise SystemExit(f"{path}: {data.size * 4} bytes is not a whole number of {ROW * 4}-byte "
                         f"rows (bank + WE_REQS/2 ids, WE_REQS from {ENGINE_H.name}): "
                         "a trace recorded by another engine build?")
    rows = data.reshape(-1, ROW)
    seq = [(int(r[0]), [int(x) for x in r[1:] if x >= 0]) for r in rows]
    n_banks = max(b for b, _ in seq) + 1
    n_experts = max(max(s) for _, s in seq if s) + 1
    return seq, n_banks, n_experts


@attrs.define
class Walk:
    """Where the replay is: the layer step, its bank, the keys it selects, access history."""

    n_banks: int
    n_experts: int
    pos: int = 0
    bank: int = 0
    need: set = attrs.Factory(set)
    counts: dict = attrs.Factory(dict)
    last: dict = attrs.Factory(dict)
    tick: int = 0

    def cycle_distance(self, q: int) -> int:
        """How far ahead in the layer cycle q's layer is next used (-1: this layer needs it)."""
        qb = q // self.n_experts
        if qb == self.bank and q in self.need:
            return -1
        return (qb + 2 * self.n_banks - self.bank - 1) % self.n_banks


def replay(seq, n_banks: int, n_experts: int, slots: int, skip_layers: int,
           victim: Callable[[list[int], Walk], int],
           on_access: Callable[[int, Walk], None] | None = None) -> float:
    """Hit rate of a policy: ``victim(candidates, walk)`` picks the key to evict."""
    where: dict[int, int] = {}
    keys: list[int] = []
    w = Walk(n_banks, n_experts)
    hits = misses = 0
    for pos, (bank, sel) in enumerate(seq):
        w.pos, w.bank, w.need = pos, bank, {bank * n_experts + e for e in sel}
        pinned: set[int] = set()
        for e in sel:
            k = bank * n_experts + e
            w.tick += 1
            w.counts[k] = w.counts.get(k, 0) + 1
            if on_access is not None:
                on_access(k, w)
            if k in where:
                hits += pos >= skip_layers
            else:
                misses += pos >= skip_layers
                if len(keys) < slots:
                    where[k] = len(keys)
                    keys.append(k)
                else:
                    s = where.pop(victim([q for q in keys if q not in pinned], w))
                    keys[s] = k
                    where[k] = s
            w.last[k] = w.tick
            pinned.add(k)
    return hits / max(hits + misses, 1)


def layer_victim(cand: list[int], w: Walk, z: float = 2.0) -> int:
    c, last = w.counts, w.last
    v = max(cand, key=lambda q: (w.cycle_distance(q), -c[q], -last[q]))
    cold = min(cand, key=lambda q: (c[q], -w.cycle_distance(q), last[q]))
    if c[cold] < c[v] and (c[v] - c[cold]) ** 2 > z * z * c[v]:
        return cold
    return v


def lfu_victim(cand: list[int], w: Walk) -> int:
    return min(cand, key=lambda q: (w.counts[q], w.last[q]))


def decayed_lfu(half_life_tokens: float, n_banks: int):
    """(victim, on_access) for accesses weighted by 2^(−age/half-life)."""
    lam = math.log(2) / (half_life_tokens * n_banks)  # per layer step
    score: dict[int, float] = {}
    stamp: dict[int, int] = {}

    def now(q: int, w: Walk) -> float:
        return score.get(q, 0.0) * math.exp(-lam * (w.pos - stamp.get(q, w.pos)))

    def on_access(k: int, w: Walk) -> None:
        score[k] = now(k, w) + 1.0
        stamp[k] = w.pos

    def victim(cand: list[int], w: Walk) -> int:
        return min(cand, key=lambda q: (now(q, w), -w.cycle_distance(q)))
    return victim, on_access


def belady(seq, n_experts: int):
    """(victim, on_access) that evict the key whose next use is furthest away."""
    uses: dict[int, list[int]] = {}
    for pos, (bank, sel) in enumerate(seq):
        for e in sel:
            uses.setdefault(bank * n_experts + e, []).append(pos)
    nxt: dict[int, int] = {}
    cursor: dict[int, int] = {}

    def on_access(k: int, w: Walk) -> None:
        i = cursor.get(k, 0) + 1
        cursor[k] = i
        nxt[k] = uses[k][i] if i < len(uses[k]) else 1 << 60

    def victim(cand: list[int], w: Walk) -> int:
        return max(cand, key=lambda q: nxt[q])
    return victim, on_access


def locality(seq, n_banks: int, n_experts: int, skip_tokens: int) -> tuple[float, float]:
    """P(used by token t+1 | used by t) over (layer, expert), and its value for independent
    tokens with the same per-expert rates."""
    tokens = len(seq) // n_banks
    used = np.zeros((tokens, n_banks, n_experts), bool)
    for pos, (bank, sel) in enumerate(seq[:tokens * n_banks]):
        used[pos // n_banks, bank, sel] = True
    # every (layer, expert) pair a column: locality pooled over all layers
    used = used[skip_tokens:].reshape(len(used) - skip_tokens, -1)
    return usage_locality([used]), independent_locality(used.mean(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--slots", type=int, default=250, help="cache slots (the bench's cache 0.3: 250)")
    ap.add_argument("--skip-tokens", type=int, default=16, help="tokens not counted (prompt + warm-up)")
    args = ap.parse_args()
    seq, n_banks, n_experts = load(args.trace)
    skip = args.skip_tokens * n_banks
    print(f"# {len(seq)} MoE layers = {len(seq) // n_banks} tokens × {n_banks} banks, "
          f"{n_experts} experts, {args.slots} slots")
    run = lambda victim, hook=None: replay(seq, n_banks, n_experts, args.slots, skip, victim, hook)  # noqa: E731
    rows = [("layer", run(layer_victim)), ("lfu", run(lfu_victim))]
    rows += [(f"lfu-decay-{half}", run(*decayed_lfu(half, n_banks))) for half in (3, 10, 30, 100)]
    rows.append(("belady", run(*belady(seq, n_experts))))
    for label, h in rows:
        print(f"{label:<14s} h {h:.4f}")
    cond, indep = locality(seq, n_banks, n_experts, args.skip_tokens)
    print(f"P(used by t+1 | used by t) {cond:.4f}; independent tokens, same rates: {indep:.4f}")


if __name__ == "__main__":
    main()
