"""libwaste's Kimi K3 deltas (docs/ENGINE.md §4.2) against our PyTorch reference
(k3_reference.py, built on transformers' KimiLinear modules), at f32.

Three tiny geometries exercise every delta and the options around it together:
- K3_A: SiTU with β and β_l, latent MoE with its norm, attention-residual blocks of 1 layer,
  q-LoRA with the MLA output gate, the full-rank KDA gate, the lower-bound decay, A_log
  shipped as a zero-padded flat vector;
- K3_B: SiTU without β_l, latent MoE without the norm, blocks of 2, q-LoRA without the gate,
  the low-rank KDA gate, softplus decay, A_log flat [H], Moonshot's ``moe_renormalize`` at k=1;
- K3_C: SiLU, no latent MoE, blocks of 3 (7 layers: a last, partial block), MLA without
  q-LoRA but with the gate, the full-rank gate, the lower bound, odd widths (16-lane kernel
  tails), two shared experts, A_log (1,1,H,1).
Each must match max-abs ≤ 1e-4 with every argmax equal at every prompt position and every
greedy decode step; snapshot + suffix and chunked prefill must equal token-by-token bytes.
The reference itself is held to transformers' KimiLinearForCausalLM with no delta switched on.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine import tiny
from tests.engine.native import open_ctx

pytestmark = pytest.mark.oracle

TOL = 1e-4

K3_A = dict(tiny.BASE, num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            hidden_act="situ", activation_situ_beta=4.0, activation_situ_linear_beta=25.0,
            routed_expert_hidden_size=48, latent_moe_use_norm=True, attn_res_block_size=1,
            q_lora_rank=24, mla_use_output_gate=True, use_full_rank_gate=True,
            linear_attn_config={"gate_lower_bound": -5.0}, rms_norm_eps=1e-5)
K3_B = dict(tiny.BASE, num_hidden_layers=6,
            layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
            mlp_layer_types=["sparse"] * 6, num_experts_per_tok=1, moe_renormalize=True,
            hidden_act="situ", activation_situ_beta=2.0,
            routed_expert_hidden_size=40, latent_moe_use_norm=False, attn_res_block_size=2,
            q_lora_rank=32, mla_use_output_gate=False, use_full_rank_gate=False, rms_norm_eps=1e-6)
K3_C = dict(tiny.BASE, num_hidden_layers=7, hidden_size=72, intermediate_size=100, moe_intermediate_size=24,
            vocab_size=300, layer_types=["full_attention"] + ["linear_attention"] * 5 + ["full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse", "sparse", "sparse"],
            num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=20, qk_nope_head_dim=12,
            qk_rope_head_dim=6, v_head_dim=10, linear_num_heads=3, linear_head_dim=12, linear_conv_kernel_dim=2,
            num_local_experts=6, num_experts_per_tok=3, n_shared_experts=2,
            attn_res_block_size=3, mla_use_output_gate=True, use_full_rank_gate=True,
            linear_attn_config={"gate_lower_bound": -3.0}, rms_norm_eps=1e-5)
GEOMETRIES = {"A": (K3_A, "pad:16"), "B": (K3_B, "H"), "C": (K3_C, "1,1,H,1")}
DESCRIBE = {"A": "SiTU β+β_l, latent+norm, res blocks of 1, q-LoRA+gate, full gate, λ, A_log padded",
            "B": "SiTU β, latent, res blocks of 2, q-LoRA, low-rank gate, softplus, top-1",
            "C": "SiLU, res blocks of 3, MLA gate, full gate, λ, odd widths, top-3"}


@pytest.fixture(scope="module")
def k3(torch_stack, tiny_dir, libwaste):
    """name → (reference model, f32 container)."""
    from tests.engine import k3_reference as ref
    from waste.tools.convert import convert

    out = {}
    for i, (name, (cfg, a_log)) in enumerate(GEOMETRIES.items()):
        model = ref.build(cfg, seed=10 + i)
        hf = ref.save_checkpoint(model, tiny_dir / f"k3-{name}-hf", a_log)
        path = tiny_dir / f"k3-{name}-f32.waste"
        if not path.exists():
            convert(hf, path, trunk="f32", experts="f32")
        out[name] = (model, path)
    return out


def prompt_of(n, vocab, seed):
    return [int(x) for x in np.random.default_rng(seed).integers(3, vocab, n)]


def ref_run(model, prompt, steps):
    """Reference logits at every prompt position, then greedy decode (whole-sequence reruns:
    every delta is causal per position)."""
    per_pos = model.logits(prompt).double().numpy()
    seq, dec = list(prompt), []
    nxt = int(per_pos[-1].argmax())
    for _ in range(steps):
        seq.append(nxt)
        row = model.logits(seq)[-1].double().numpy()
        dec.append(row)
        nxt = int(row.argmax())
    return per_pos, seq[len(prompt):], np.array(dec)


def same_bytes(a, b) -> bool:
    return np.asarray(a, np.float32).tobytes() == np.asarray(b, np.float32).tobytes()


@pytest.mark.parametrize("name", ["A", "B", "C"])
def test_k3_f32_matches_reference(k3, report_measurement, name):
    from tests.engine.test_oracle import measured

    model, path = k3[name]
    prompt = prompt_of(30, model.cfg["vocab_size"], seed=ord(name))
    ref_pos, toks, ref_dec = ref_run(model, prompt, steps=6)
    with open_ctx(path) as c:
        got_pos = np.array([c.eval([t]) for t in prompt], np.float64)
        got_dec = np.array([c.eval([t]) for t in toks], np.float64)
    err_pos, err_dec = float(np.abs(got_pos - ref_pos).max()), float(np.abs(got_dec - ref_dec).max())
    both_got, both_ref = np.concatenate([got_pos, got_dec]), np.concatenate([ref_pos, ref_dec])
    agree = float((both_got.argmax(1) == both_ref.argmax(1)).mean())
    report_measurement(measured(f"K3 f32 {name} ({DESCRIBE[name]})", max(err_pos, err_dec), agree, len(both_ref),
                                f" (prompt {err_pos:.1e}, decode {err_dec:.1e}; logit std {ref_pos.std():.2f})"))
    assert ref_pos.std() > 0.3, "the reference's logits are flat: the comparison would mean nothing"
    assert err_pos <= TOL and err_dec <= TOL
    assert (both_got.argmax(1) == both_ref.argmax(1)).all()


@pytest.mark.parametrize("name", ["A", "B", "C"])
def test_k3_chunked_prefill_and_snapshot_are_exact(k3, name):
    model, path = k3[name]
    ids = prompt_of(40, model.cfg["vocab_size"], seed=3)
    with open_ctx(path, prefill_chunk=1) as c1:
        one_by_one = np.array([c1.eval([t]) for t in ids])
    for chunk in (5, 64):
        with open_ctx(path, prefill_chunk=chunk) as c:
            assert same_bytes(c.eval(ids), one_by_one[-1]), f"prefill_chunk={chunk} differs from token by token"
            c.reset()
            c.eval(ids[:23])
            blob = c.snapshot()
            c.eval(prompt_of(7, model.cfg["vocab_size"], seed=99))   # wander off, then restore
            c.reset()
            assert c.restore_status(blob) == ("OK", "")
            # decode after the restore equals one long prefill, token by token
            got = np.array([c.eval([t]) for t in ids[23:]])
            assert same_bytes(got, one_by_one[23:])


def test_k3_params_count_the_latent_experts(k3):
    """params_active counts k latent experts (3·Rz·I each) per MoE layer, and every trunk
    tensor but the embedding; params_total every expert (docs/ENGINE.md §2)."""
    model, path = k3["A"]
    cfg = model.cfg
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith("e_score_correction_bias")}
    experts = {k: v for k, v in sd.items() if ".experts." in k}
    total = sum(v.numel() for v in sd.values())
    n_moe = cfg["mlp_layer_types"].count("sparse")
    per_expert = sum(v.numel() for v in experts.values()) // (n_moe * cfg["num_local_experts"])
    assert per_expert == 3 * cfg["routed_expert_hidden_size"] * cfg["moe_intermediate_size"]
    active = total - sum(v.numel() for v in experts.values()) - sd["embed_tokens.weight"].numel() \
        + n_moe * cfg["num_experts_per_tok"] * per_expert
    with open_ctx(path) as c:
        info = c.info
        assert (info.params_total, info.params_active) == (total, active)


def test_reference_without_deltas_is_transformers_kimi_linear(torch_stack, tiny_dir):
    """With no delta switched on, the reference is transformers' KimiLinearForCausalLM on the
    same checkpoint (so the reference's wiring of the shared modules is right)."""
    torch, transformers = torch_stack
    from tests.engine import k3_reference as ref

    model = ref.build(tiny.CONFIG_A, seed=5)
    hf = ref.save_checkpoint(model, tiny_dir / "k3-plain-hf")
    theirs = transformers.KimiLinearForCausalLM.from_pretrained(hf).eval()
    ids = prompt_of(70, 512, seed=1)   # > one 64-token KDA chunk
    with torch.no_grad():
        want = theirs(torch.tensor([ids])).logits[0].double().numpy()
    got = model.logits(ids).double().numpy()
    assert float(np.abs(got - want).max()) < 1e-5


@pytest.mark.parametrize("dtype", ["f32", "int8", "int4"])
def test_k3_synthetic_threads_and_kernels_are_exact(tiny_dir, libwaste, dtype):
    """Every delta on (make_container --k3): 1 vs 2 threads, generic vs SIMD kernels, and all
    experts cached vs a cache at the floor give byte-identical logits, in f32 and the
    quantized formats (docs/ENGINE.md §7)."""
    from tests.engine.native import build_info, plan_of
    from waste.tools.make_container import Geometry, build_container

    path = tiny_dir / f"k3-synth-{dtype}.waste"
    if not path.exists():
        build_container(path, seed=2, geometry=Geometry(k3=True, dtype=dtype, layers=5, layout="KMKKM"))
    ids = prompt_of(24, 200, seed=8)
    floor = plan_of(path).floor_bytes
    with open_ctx(path, n_threads=1, kernels=1) as g1, open_ctx(path, n_threads=2) as s2, \
            open_ctx(path, ram_budget_bytes=floor, cache_policy=1) as low:
        a = np.array([g1.eval([t]) for t in ids])
        b = np.array([s2.eval([t]) for t in ids])
        c = np.array([low.eval([t]) for t in ids])   # cache at the floor (LRU), evicting
        assert low.stats().misses > s2.stats().misses
    assert same_bytes(a, b), f"threads/kernels differ ({build_info()})"
    assert same_bytes(a, c), "the floor-budget cache changed the logits"
    assert np.isfinite(a).all() and a.std() > 0.1


def test_k3_plan_matches_open(tiny_dir, libwaste):
    """The sizing counts the K3 buffers (residual blocks per chunk, latent z and sums) exactly:
    what open allocates is the plan's floor − min cache + slots (docs/ENGINE.md §5)."""
    from tests.engine.native import plan_of
    from waste.tools.make_container import Geometry, build_container

    path = tiny_dir / "k3-synth-plan.waste"
    if not path.exists():
        build_container(path, seed=3, geometry=Geometry(k3=True, layers=5, layout="KMKKM"))
    for chunk in (1, 64):
        plan = plan_of(path, prefill_chunk=chunk, ctx_tokens=300)
        with open_ctx(path, prefill_chunk=chunk, ctx_tokens=300) as c:
            s = c.stats()
            assert s.allocated_bytes == plan.floor_bytes - plan.min_cache_bytes + plan.slots * plan.record_bytes
