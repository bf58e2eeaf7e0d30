"""cfg.activations (docs/ENGINE.md §4.3): the q8 path (int8 activations per block of 32 against
int8/int4/mxfp4 weights, exact integer dot products) is bit-identical across kernel sets,
thread counts and prefill chunking like the f32 path; it really changes the logits of
quantized containers, only within the quantization error of the f32 reference; it leaves
f32 and bf16 containers untouched. The kernel-level identity (every format, every set) is
native/tests/test_kernels.c."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.native import build_info, open_ctx, try_open
from tests.engine.test_invariants import G128_INT4, per_token, prompt_of, same_bytes
from waste.tools.make_container import Geometry, build_container

F32, Q8 = 0, 1


@pytest.fixture(scope="module")
def containers(synthetic_dir, synthetic_f32):
    def build(name, **kw):
        out = synthetic_dir / name
        return out if out.exists() else build_container(out, seed=1, **kw)

    return {
        "f32": synthetic_f32,
        "bf16": build("default-bf16.waste", geometry=Geometry(dtype="bf16")),
        "int8": build("default-int8.waste", geometry=Geometry(dtype="int8")),
        "int8-g128": build("g128-int8.waste", geometry=Geometry(dtype="int8", group=128, hidden=128,
                                                                intermediate=128, moe_intermediate=128,
                                                                kda_heads=1, kda_head_dim=128,
                                                                kv_lora_rank=128, mla_heads=4, v_head=32)),
        "int4": build("default-int4.waste", geometry=Geometry(dtype="int4")),
        "int4-g128": build("g128-int4.waste", geometry=G128_INT4),
    }


QUANTIZED = ["int8", "int8-g128", "int4", "int4-g128"]


@pytest.mark.parametrize("kind", QUANTIZED)
def test_q8_is_exact_across_kernel_sets(containers, kind):
    path = containers[kind]
    with open_ctx(path, kernels=1, activations=Q8) as g:
        ids = prompt_of(40, g.vocab)
        ref = per_token(g, ids)
    compared = 0
    for kernels in (2, 3):
        status, detail, ctx = try_open(path, kernels=kernels, activations=Q8)
        if ctx is None:
            assert status == "E_UNSUPPORTED", detail
            continue
        with ctx:
            assert same_bytes(per_token(ctx, ids), ref), f"kernels={kernels} differs from generic in q8"
        compared += 1
    if not compared:
        pytest.skip(f"this CPU has no SIMD kernel to compare ({build_info()})")


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_q8_is_exact_across_threads_and_chunks(containers, kind):
    path = containers[kind]
    with open_ctx(path, n_threads=1, prefill_chunk=1, activations=Q8) as c1:
        ids = prompt_of(60, c1.vocab)
        ref = per_token(c1, ids)
    with open_ctx(path, n_threads=2, prefill_chunk=64, activations=Q8) as c2:
        assert same_bytes(per_token(c2, ids[:30]), ref[:30])
        c2.reset()
        assert same_bytes(c2.eval(ids), ref[-1])


@pytest.mark.parametrize("kind", QUANTIZED)
def test_q8_changes_the_logits_within_the_quantization_error(containers, kind):
    path = containers[kind]
    with open_ctx(path, activations=F32) as a, open_ctx(path, activations=Q8) as b:
        ids = prompt_of(40, a.vocab)
        exact, fast = per_token(a, ids), per_token(b, ids)
        assert a.stats().activations == F32 and b.stats().activations == Q8
    assert not same_bytes(exact, fast), "activations=q8 did not change the path"
    err = np.abs(exact - fast)
    scale = exact.std()
    # Measured on these containers: mean error 2.0-3.2 % of the logits' spread, max 0.2-1.5
    # spreads (a random router near a tie flips an expert), argmax equal at 88-98 %. Bounds
    # with room; a wrong sum (a lost block, a bad scale) is off by about the spread everywhere.
    assert err.mean() <= 0.05 * scale, (err.mean(), scale)
    assert err.max() <= 2.0 * scale, (err.max(), scale)
    assert np.mean(exact.argmax(1) == fast.argmax(1)) >= 0.8


@pytest.mark.parametrize("kind", ["f32", "bf16"])
def test_q8_leaves_f32_and_bf16_weights_exact(containers, kind):
    path = containers[kind]
    with open_ctx(path, activations=F32) as a, open_ctx(path, activations=Q8) as b:
        ids = prompt_of(30, a.vocab)
        assert same_bytes(per_token(a, ids), per_token(b, ids))


def test_an_unknown_activations_value_is_refused(containers):
    status, detail, ctx = try_open(containers["int8"], activations=2)
    assert ctx is None and status == "E_ARG" and "cfg.activations 2" in detail
