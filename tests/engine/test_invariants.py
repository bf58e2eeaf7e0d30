"""Bit-exact invariants of libwaste (docs/ENGINE.md §7): equal inputs give byte-identical logits
whatever the chunking, thread count, kernel set or snapshot route, and reruns repeat.
Also checks the sampler against an independent Python implementation of §2 Sampling.
Containers are synthetic (waste.tools.make_container): no torch needed."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.native import build_info, open_ctx, plan_of
from waste.tools.make_container import Geometry, build_container

# Odd widths (tails of the 16-lane kernels), MLA first, top-3 and two shared experts.
ODD = Geometry(layers=3, layout="MKK", hidden=72, intermediate=100, moe_intermediate=24,
               experts=6, top_k=3, shared=2, kda_heads=3, kda_head_dim=12, conv_kernel=2,
               mla_heads=3, kv_lora_rank=20, qk_nope=12, qk_rope=6, v_head=10)

# Every matrix width a multiple of 128, for int4 group 128.
G128_INT4 = Geometry(dtype="int4", group=128, hidden=128, intermediate=128, moe_intermediate=128, kda_heads=1,
                     kda_head_dim=128, kv_lora_rank=128, mla_heads=4, v_head=32)


def prompt_of(n, vocab, seed=5):
    return [int(x) for x in np.random.default_rng(seed).integers(3, vocab, n)]


@pytest.fixture(scope="module")
def containers(synthetic_dir, synthetic_f32):
    """The default synthetic container in f32, bf16, int8 and int4 (g32), one with odd widths,
    and an int4 g128 one."""
    def build(name, **kw):
        out = synthetic_dir / name
        return out if out.exists() else build_container(out, seed=1, **kw)

    return {
        "f32": synthetic_f32,
        "f32-odd": build("odd-f32.waste", geometry=ODD),
        "bf16": build("default-bf16.waste", geometry=Geometry(dtype="bf16")),
        "int8": build("default-int8.waste", geometry=Geometry(dtype="int8")),
        "int4": build("default-int4.waste", geometry=Geometry(dtype="int4")),
        "int4-g128": build("g128-int4.waste", geometry=G128_INT4),
    }


def per_token(ctx, ids):
    return np.array([ctx.eval([t]) for t in ids])


def same_bytes(a, b) -> bool:
    return np.asarray(a, np.float32).tobytes() == np.asarray(b, np.float32).tobytes()


@pytest.mark.parametrize("kind", ["f32", "f32-odd", "int8", "int4"])
def test_prefill_chunking_is_exact(containers, kind):
    path = containers[kind]
    with open_ctx(path, prefill_chunk=1) as c1:
        ids = prompt_of(150, c1.vocab)
        ref = per_token(c1, ids)[-1]
    for chunk in (1, 7, 64):
        with open_ctx(path, prefill_chunk=chunk) as c:
            assert same_bytes(c.eval(ids), ref), f"prefill_chunk={chunk} differs from token by token"


@pytest.mark.parametrize("kind", ["f32", "f32-odd", "bf16", "int8", "int4"])
def test_thread_count_is_exact(containers, kind):
    # 3 workers on a 2-CPU machine: workers are descheduled mid-job and the others claim
    # their chunks (src/pool.c), which must change no bit either.
    path = containers[kind]
    with open_ctx(path, n_threads=1) as c1:
        ids = prompt_of(40, c1.vocab)
        ref = per_token(c1, ids)
    for n in (2, 3):
        with open_ctx(path, n_threads=n) as c:
            assert same_bytes(per_token(c, ids), ref), f"n_threads={n} differs from 1"


@pytest.mark.parametrize("kind", ["f32", "f32-odd", "bf16", "int8", "int4", "int4-g128"])
def test_generic_and_simd_kernels_are_exact(containers, kind):
    path = containers[kind]
    with open_ctx(path, kernels=1) as g:
        info = build_info()
        if "selected: generic" in info:
            pytest.skip(f"this CPU has no SIMD kernel to compare ({info})")
        with open_ctx(path, kernels=0) as s:
            ids = prompt_of(40, g.vocab)
            assert same_bytes(per_token(g, ids), per_token(s, ids))


@pytest.mark.parametrize("kind", ["f32", "int8"])
def test_snapshot_restore_then_suffix_equals_fresh_prefill(containers, kind):
    path = containers[kind]
    with open_ctx(path) as c:
        ids = prompt_of(60, c.vocab)
        fresh = c.eval(ids)
        c.reset()
        c.eval(ids[:41])
        blob = c.snapshot()
        c.eval(prompt_of(9, c.vocab, seed=99))   # wander off, then come back
        c.reset()
        assert c.restore_status(blob) == ("OK", "")
        assert c.position() == 41
        assert same_bytes(c.eval(ids[41:]), fresh)
    with open_ctx(path) as other:          # a new ctx restores it too
        assert other.restore_status(blob) == ("OK", "")
        assert same_bytes(other.eval(ids[41:]), fresh)


def test_greedy_and_seeded_reruns_repeat(containers):
    with open_ctx(containers["f32"]) as c:
        prompt = prompt_of(20, c.vocab)
        runs = []
        for kw in ({}, {}, {"temperature": 0.9, "seed": 7}, {"temperature": 0.9, "seed": 7}):
            c.reset()
            st, _, res, ev = c.generate(prompt, max_tokens=12, **kw)
            assert st == "OK" and res.tokens_generated == 12
            runs.append([e["token"] for e in ev])
        assert runs[0] == runs[1]
        assert runs[2] == runs[3]


def test_generate_follows_eval_logits_and_never_evaluates_the_last_token(containers):
    with open_ctx(containers["f32"]) as c:
        prompt = prompt_of(10, c.vocab)
        st, _, res, ev = c.generate(prompt, max_tokens=5)
        assert st == "OK" and res.stop_reason == 2 and res.prompt_tokens == 10
        assert c.position() == 10 + 4
        toks = [e["token"] for e in ev]
        c.reset()
        logits = c.eval(prompt)
        for t in toks:
            assert int(np.argmax(logits)) == t
            lp = logits.astype(np.float64) - logits.max()
            lp -= np.log(np.exp(lp).sum())
            assert abs(ev[toks.index(t)]["logprob"] - lp[t]) < 1e-4
            logits = c.eval([t])


# ---- sampler vs an independent implementation of docs/ENGINE.md §2 ---------------------------
M64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


class Xoshiro:
    def __init__(self, seed):
        self.s, x = [], seed
        for _ in range(4):
            x, v = splitmix64(x)
            self.s.append(v)

    def next(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64  # noqa: E731
        out = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45)  # noqa: E702
        return out

    def uniform(self):
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)


def reference_sample(logits, temperature, top_k, top_p, rng):
    v = logits.astype(np.float32) / np.float32(temperature)
    order = sorted(range(len(v)), key=lambda i: (-v[i], i))
    m = len(order) if not top_k or top_k >= len(order) else top_k
    kept = order[:m]
    e = np.exp(np.array([v[i] for i in kept], np.float64) - float(v[kept[0]]))
    p = e / e.sum()
    if top_p < 1.0:
        cut = int(np.argmax(np.cumsum(p) >= top_p)) + 1 if (np.cumsum(p) >= top_p).any() else m
        kept, p = kept[:cut], e[:cut] / e[:cut].sum()
    u = rng.uniform()
    cum = np.cumsum(p)
    idx = int(np.argmax(cum > u)) if (cum > u).any() else len(kept) - 1
    return kept[idx]


@pytest.mark.parametrize("temperature,top_k,top_p,seed", [(1.0, 0, 1.0, 1), (0.7, 40, 1.0, 2), (1.3, 0, 0.8, 3),
                                                         (0.9, 5, 0.5, 4)])
def test_sampler_matches_reference(containers, temperature, top_k, top_p, seed):
    with open_ctx(containers["f32"]) as c:
        prompt = prompt_of(8, c.vocab)
        st, _, _, ev = c.generate(prompt, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                  max_tokens=10)
        assert st == "OK"
        c.reset()
        rng = Xoshiro(seed)
        logits = c.eval(prompt)
        for e in ev:
            assert reference_sample(logits, temperature, top_k, top_p, rng) == e["token"]
            logits = c.eval([e["token"]])


def test_pieces_concatenate_to_detokenize(containers):
    with open_ctx(containers["f32"]) as c:
        for seed in range(4):
            c.reset()
            st, _, res, ev = c.generate(prompt_of(6, c.vocab, seed), temperature=1.5, seed=seed, max_tokens=40)
            assert st == "OK"
            toks = [e["token"] for e in ev]
            assert b"".join(e["piece"] for e in ev) == c.detokenize(toks)
            # No piece boundary falls inside a valid UTF-8 sequence of the whole stream.
            stream = b"".join(e["piece"] for e in ev)
            inside = utf8_interior(stream)
            at = 0
            for e in ev:
                at += len(e["piece"])
                assert at not in inside, (e, stream)


def utf8_interior(b: bytes) -> set[int]:
    """Offsets strictly inside a valid multi-byte UTF-8 sequence of ``b``."""
    out: set[int] = set()
    i = 0
    while i < len(b):
        lead = b[i]
        n = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 1
        if n > 1 and i + n <= len(b):
            try:
                b[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                n = 1
            else:
                out.update(range(i + 1, i + n))
        else:
            n = 1
        i += n
    return out


def test_cpu_pinning_changes_nothing(containers):
    import os

    before = os.sched_getaffinity(0)
    cpus = sorted(before)[:2]
    cpu_list = ",".join(str(c) for c in cpus)
    path = containers["f32"]
    with open_ctx(path, n_threads=len(cpus)) as free, open_ctx(path, cpu_list=cpu_list) as pinned:
        ids = prompt_of(30, free.vocab)
        assert same_bytes(per_token(free, ids), per_token(pinned, ids))
    assert os.sched_getaffinity(0) == before  # the caller's mask is restored after each call


@pytest.mark.parametrize("policy", [0, 1, 2])   # lfru, lru, layer
def test_floor_budget_cache_is_exact(containers, policy):
    path = containers["f32"]
    plan = plan_of(path)
    with open_ctx(path) as full, \
            open_ctx(path, ram_budget_bytes=plan.floor_bytes, cache_policy=policy) as floor:
        s = floor.stats()
        assert s.slots_total == 2 * floor.info.top_k            # only the in-flight set fits
        ids = prompt_of(50, full.vocab)
        assert same_bytes(per_token(full, ids), per_token(floor, ids))
        assert same_bytes(full.eval(ids[:20]), floor.eval(ids[:20]))
        s = floor.stats()
        assert s.misses > full.stats().misses and s.reads == s.misses   # evictions really happened


@pytest.mark.parametrize("io_threads,lookahead", [(1, 0), (2, 0), (2, 1), (4, 1)])
@pytest.mark.parametrize("budget", ["floor", "floor+3", "all"])
@pytest.mark.parametrize("policy", [0, 2])   # lfru, layer
def test_reader_threads_and_lookahead_are_exact(containers, io_threads, lookahead, budget, policy):
    """docs/ENGINE.md §7: read-ahead and lookahead on vs off, 1 vs n I/O threads: identical logits,
    per token (decode, where lookahead guesses) and for a chunked prefill (the window slides
    over more experts than it may pin at once)."""
    path = containers["int8"]
    plan = plan_of(path)
    ram = {"floor": plan.floor_bytes, "floor+3": plan.floor_bytes + 3 * plan.record_bytes, "all": 0}[budget]
    ids = prompt_of(40, 10_000)
    with open_ctx(path, ram_budget_bytes=ram, cache_policy=policy) as serial, \
            open_ctx(path, ram_budget_bytes=ram, cache_policy=policy, io_threads=io_threads,
                     lookahead=lookahead) as ahead:
        ids = [t % serial.vocab for t in ids]
        assert same_bytes(per_token(serial, ids), per_token(ahead, ids))
        serial.reset()
        ahead.reset()
        assert same_bytes(serial.eval(ids), ahead.eval(ids))
        s, a = serial.stats(), ahead.stats()
        assert a.io_threads == io_threads and a.lookahead == lookahead
        assert s.guesses == 0 and a.queue_depth_max >= 1
        if budget != "all":
            assert a.misses > 0 and a.reads == a.misses - a.guess_hits + a.guesses   # a confirmed guess is a miss read once
        if lookahead and budget != "all":
            assert a.guesses > 0 and a.guess_hits <= a.guesses
            assert a.wasted_bytes <= a.guesses * plan.record_bytes
        if lookahead == 0:
            assert a.guesses == 0 and a.wasted_bytes == 0
