"""``synth --arch k3`` proven against the PyTorch K3 reference (k3_reference.py), not itself.

The synthetic release-layout checkpoint is read back independently of our converter: its
Moonshot-style ``text_config`` becomes the reference's config, every text tensor is loaded
into ``K3Reference`` under the reference's own HF names (none missing, none extra: the synth
writes exactly the tensors the reference expects, at their shapes), the MXFP4 experts are
dequantized by compressed-tensors itself. Then ``waste.tools.convert`` (``--experts source``:
MXFP4 kept, bf16 trunk kept) must give libwaste logits equal to the reference's at f32
(max-abs ≤ 1e-4, every argmax equal), with every delta on, and with most of them off.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.engine.conftest import REPO, require_module
from tests.engine.native import open_ctx
from waste.tools.hf_checkpoint import SafeTensors

pytestmark = pytest.mark.oracle

SMALL = ["--layers", "6", "--hidden", "64", "--intermediate", "96", "--moe-intermediate", "32", "--experts", "8",
         "--top-k", "2", "--kda-heads", "2", "--kda-head-dim", "16", "--mla-heads", "2", "--kv-lora-rank", "32",
         "--qk-nope", "16", "--qk-rope", "8", "--v-head", "16", "--vocab-merges", "40"]
VARIANTS = {
    # every delta on; blocks of 2 over 6 layers; MLA at 4; first layer MoE (K3's default).
    "all": SMALL + ["--q-lora-rank", "32", "--latent", "32", "--attn-res-block", "2", "--shared", "2"],
    # SiLU, no latent MoE, plain residual, q_proj, low-rank gate, softplus decay, no MLA gate,
    # a dense first layer and MoE on every 2nd layer, A_log flat [H].
    "few": SMALL + ["--situ", "0", "--latent", "0", "--attn-res-block", "0", "--q-lora-rank", "0",
                    "--full-rank-gate", "0", "--gate-lower-bound", "none", "--mla-output-gate", "0",
                    "--dense", "1", "--moe-layer-freq", "2", "--a-log-pad", "2", "--shared", "1",
                    "--routed-scaling-factor", "2.446"],
}


def reference_config(t: dict) -> dict:
    """The reference's (transformers-style) config from the release's Moonshot text_config."""
    lac = t["linear_attn_config"]
    n = t["num_hidden_layers"]
    cfg = dict(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], num_hidden_layers=n,
        intermediate_size=t["intermediate_size"], moe_intermediate_size=t["moe_intermediate_size"],
        num_attention_heads=t["num_attention_heads"], num_key_value_heads=t["num_key_value_heads"],
        kv_lora_rank=t["kv_lora_rank"], q_lora_rank=t["q_lora_rank"], qk_nope_head_dim=t["qk_nope_head_dim"],
        qk_rope_head_dim=t["qk_rope_head_dim"], v_head_dim=t["v_head_dim"],
        num_local_experts=t["num_experts"], num_experts_per_tok=t["num_experts_per_token"],
        n_shared_experts=t["num_shared_experts"], n_group=1, topk_group=1,
        routed_scaling_factor=t["routed_scaling_factor"], norm_topk_prob=t["moe_renormalize"],
        moe_renormalize=t["moe_renormalize"],
        linear_num_heads=lac["num_heads"], linear_head_dim=lac["head_dim"],
        linear_conv_kernel_dim=lac["short_conv_kernel_size"],
        layer_types=["linear_attention" if i + 1 in lac["kda_layers"] else "full_attention" for i in range(n)],
        mlp_layer_types=["sparse" if i >= t["first_k_dense_replace"] and i % t["moe_layer_freq"] == 0 else "dense"
                         for i in range(n)],
        hidden_act=t["hidden_act"], rms_norm_eps=t["rms_norm_eps"],
        pad_token_id=t["pad_token_id"], bos_token_id=t["bos_token_id"], eos_token_id=t["eos_token_id"],
        mla_use_output_gate=t["mla_use_output_gate"], use_full_rank_gate=t["use_full_rank_gate"])
    for key in ("activation_situ_beta", "activation_situ_linear_beta", "routed_expert_hidden_size",
                "latent_moe_use_norm", "attn_res_block_size"):
        if key in t:
            cfg[key] = t[key]
    if "gate_lower_bound" in lac:
        cfg["linear_attn_config"] = {"gate_lower_bound": lac["gate_lower_bound"]}
    return cfg


def text_tensors(hf, torch) -> dict[str, np.ndarray]:
    """name (without ``language_model.``) → f32 values; MXFP4 experts dequantized by
    compressed-tensors' own decompressor."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    st = SafeTensors(hf)
    out = {}
    for name in st.entries:
        if not name.startswith("language_model."):
            continue
        short = name[len("language_model."):]
        if short.endswith(".weight_scale"):
            continue
        if short.endswith(".weight_packed"):
            scale = name[: -len("_packed")] + "_scale"
            w = MXFP4PackedCompressor.decompress({"weight_packed": torch.from_numpy(st.load_bytes(name).copy()),
                                                  "weight_scale": torch.from_numpy(st.load_bytes(scale).copy())},
                                                 scheme)["weight"]
            out[short[: -len("_packed")]] = w.float().numpy()
        else:
            out[short] = st.load(name)
    return out


def load_reference(ref, cfg: dict, tensors: dict[str, np.ndarray], a_log_len: int, torch):
    """A K3Reference with the checkpoint's values, via the reference's own HF names."""
    model = ref.build(cfg, seed=0)
    expected = ref.hf_state_dict(model, a_log_shape=f"pad:{a_log_len}")
    assert set(expected) == set(tensors), (sorted(set(expected) - set(tensors))[:5], sorted(set(tensors) - set(expected))[:5])
    for name, a in expected.items():
        assert tensors[name].shape == a.shape, (name, tensors[name].shape, a.shape)
    state = {}
    for key, t in model.state_dict().items():
        name = key
        for pat, rep in ref._RENAMES:
            name = re.sub(pat, rep, name)
        if name.endswith(".self_attn.conv1d.weight"):
            val = np.concatenate([tensors[name.replace("conv1d", f"{x}_conv1d")] for x in "qkv"], 0)
        else:
            if cfg.get("use_full_rank_gate") and name.endswith(".self_attn.g_b_proj.weight"):
                name = name.replace("g_b_proj", "g_proj")
            val = tensors[name]
            if name.endswith(".self_attn.A_log"):
                val = val.reshape(-1)[: t.numel()]
        state[key] = torch.from_numpy(np.ascontiguousarray(val, np.float32).reshape(t.shape))
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, torch_stack, tmp_path_factory, libwaste):
    require_module("compressed_tensors", "synth --arch k3 packs MXFP4 with compressed-tensors")
    from tests.engine import k3_reference as ref
    from waste.tools.convert import convert

    torch, _ = torch_stack
    base = tmp_path_factory.mktemp(f"k3-synth-{request.param}")
    hf = base / "hf"
    proc = subprocess.run([sys.executable, "-m", "waste.tools.synth", str(hf), "--arch", "k3", "--seed", "7",
                           *VARIANTS[request.param]], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    raw = json.loads((hf / "config.json").read_text())
    cfg = reference_config(raw["text_config"])
    tensors = text_tensors(hf, torch)
    a_log_len = next(a.size for n, a in tensors.items() if n.endswith(".A_log"))
    model = load_reference(ref, cfg, tensors, a_log_len, torch)
    out = base / "k3.waste"
    convert(hf, out, note=None)
    yield request.param, model, out, raw
    shutil.rmtree(base, ignore_errors=True)


def test_the_converted_synth_keeps_its_formats(variant):
    _, _, out, _ = variant
    m = json.loads((out / "manifest.json").read_text())
    assert m["arch"] == "kimi_k3"
    assert m["quant"]["experts"] == "mxfp4" and {b["format"] for b in m["banks"]} == {"mxfp4"}
    assert {t["format"] for t in m["tensors"] if len(t["shape"]) == 2 and t["shape"][0] > 1} >= {"bf16"}


def test_libwaste_on_the_synth_equals_the_reference(variant, report_measurement):
    name, model, out, _ = variant
    V = model.cfg["vocab_size"]
    ids = [int(x) for x in np.random.default_rng(17).integers(3, V, 24)]
    with open_ctx(out, usage_path="") as c:
        got = np.array([c.eval([t]) for t in ids], np.float64)
    want = model.logits(ids).double().numpy()
    err = float(np.abs(got - want).max())
    agree = float((got.argmax(1) == want.argmax(1)).mean())
    report_measurement(f"K3 synth ({name}: MXFP4 experts, bf16 trunk) vs K3 reference{'':<8} max-abs {err:.3e}  "
                       f"argmax agreement {agree:.3f} over {len(ids)} positions (logit std {want.std():.2f})")
    assert err <= 1e-4
    assert (got.argmax(1) == want.argmax(1)).all()
