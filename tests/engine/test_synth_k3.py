"""``python -m waste.tools.synth --arch k3``: a K3-geometry checkpoint in the release layout.

Structure (no engine needed): the ``kimi_k3`` config with the text model under
``text_config``, ``language_model.`` names in shards with a consistent index, the routed
experts as compressed-tensors MXFP4 (``weight_packed`` + ``weight_scale`` U8) holding exactly
what compressed-tensors' own compressor makes of the drawn weights, ``A_log`` zero-padded,
vision tensors, the XTML tokenizer, determinism and refusals. The numerical proof against the
PyTorch K3 reference lives in test_k3_synth_reference.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.engine.conftest import REPO, require_module
from waste.tools.hf_checkpoint import SafeTensors
from waste.tools.make_container import XTML_SPECIALS, random_tensor

# Tiny: 4 layers (KDA ×3 + MLA), every K3 delta on, a dense first layer, 4 experts.
FLAGS = ["--layers", "4", "--hidden", "64", "--intermediate", "96", "--moe-intermediate", "32", "--experts", "4",
         "--top-k", "2", "--shared", "1", "--dense", "1", "--kda-heads", "2", "--kda-head-dim", "16",
         "--mla-heads", "2", "--kv-lora-rank", "32", "--qk-nope", "16", "--qk-rope", "8", "--v-head", "16",
         "--vocab-merges", "40", "--q-lora-rank", "32", "--latent", "32", "--attn-res-block", "2"]


def run(out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waste.tools.synth", str(out), "--arch", "k3", *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def k3(tmp_path_factory) -> Path:
    require_module("compressed_tensors", "synth --arch k3 packs MXFP4 with compressed-tensors")
    out = tmp_path_factory.mktemp("synth-k3") / "hf"
    proc = run(out, *FLAGS, "--seed", "4")
    assert proc.returncode == 0 and proc.stdout.strip() == str(out), proc.stderr
    return out


def test_release_config(k3):
    cfg = json.loads((k3 / "config.json").read_text())
    assert cfg["model_type"] == "kimi_k3"
    t = cfg["text_config"]
    assert t["model_type"] == "kimi_linear"
    assert t["linear_attn_config"]["kda_layers"] == [1, 2, 3] and t["linear_attn_config"]["full_attn_layers"] == [4]
    assert t["linear_attn_config"]["gate_lower_bound"] == -5.0
    assert (t["hidden_act"], t["activation_situ_beta"], t["activation_situ_linear_beta"]) == ("situ", 4.0, 25.0)
    assert (t["routed_expert_hidden_size"], t["latent_moe_use_norm"], t["attn_res_block_size"]) == (32, True, 2)
    assert (t["q_lora_rank"], t["mla_use_output_gate"], t["use_full_rank_gate"]) == (32, True, True)
    assert (t["first_k_dense_replace"], t["moe_layer_freq"], t["routed_scaling_factor"]) == (1, 1, 1.0)
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "mxfp4-pack-quantized"


def test_shards_index_names_and_dtypes(k3):
    st = SafeTensors(k3)   # checks every entry against its file and the index
    index = json.loads((k3 / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(st.entries)
    assert len(set(index.values())) > 2
    text = [n for n in st.entries if not n.startswith(("vision_tower.", "mm_projector."))]
    assert all(n.startswith("language_model.") for n in text)
    assert any(n.startswith("vision_tower.") for n in st.entries) and any(n.startswith("mm_projector.") for n in st.entries)
    experts = [n for n in text if ".experts." in n]
    assert experts and all(n.endswith((".weight_packed", ".weight_scale")) and st.dtype(n) == "U8" for n in experts)
    assert {st.dtype(n) for n in text if n not in experts} == {"BF16"}
    p = "language_model.model.layers."
    for name, shape in ((p + "0.mlp.gate_proj.weight", (96, 64)),          # dense layer 0
                        (p + "1.block_sparse_moe.experts.3.w1.weight_packed", (32, 16)),   # [Im, Rz/2]
                        (p + "1.block_sparse_moe.experts.3.w1.weight_scale", (32, 1)),
                        (p + "1.block_sparse_moe.experts.3.w2.weight_packed", (32, 16)),   # [Rz, Im/2]
                        (p + "1.block_sparse_moe.routed_expert_down_proj.weight", (32, 64)),
                        (p + "1.block_sparse_moe.routed_expert_up_proj.weight", (64, 32)),
                        (p + "1.block_sparse_moe.routed_expert_norm.weight", (32,)),
                        (p + "1.self_attn.g_proj.weight", (32, 64)),                       # full-rank KDA gate
                        (p + "1.self_attention_res_proj.weight", (1, 64)),
                        (p + "3.self_attn.q_a_proj.weight", (32, 64)),
                        (p + "3.self_attn.q_b_proj.weight", (48, 32)),
                        (p + "3.self_attn.g_proj.weight", (32, 64)),                       # MLA output gate
                        ("language_model.model.output_attn_res_proj.weight", (1, 64)),
                        (p + "2.self_attn.A_log", (16,))):
        assert st.shape(name) == shape, name
    assert not any("g_a_proj" in n or "g_b_proj" in n for n in text)    # the full-rank gate replaces them
    assert p + "3.self_attn.q_proj.weight" not in st.entries               # q-LoRA replaces q_proj
    a_log = st.load(p + "2.self_attn.A_log")
    assert np.all(a_log[:2] != 0) and not np.any(a_log[2:])   # 2 heads, zero tail to head_dim


def test_experts_are_compressed_tensors_packing_of_the_drawn_weights(k3):
    import torch
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    from tests.engine.mxfp4_ckpt import ct_compress

    st = SafeTensors(k3)
    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    for w, shape in (("w1", (32, 32)), ("w2", (32, 32)), ("w3", (32, 32))):
        name = f"model.layers.2.block_sparse_moe.experts.1.{w}.weight"
        drawn = random_tensor(4, name, shape, "mat")
        packed, scale, _ = ct_compress(torch, drawn)
        got_p, got_s = st.load_bytes(f"language_model.{name}_packed"), st.load_bytes(f"language_model.{name}_scale")
        assert got_p.tobytes() == packed.tobytes() and got_s.tobytes() == scale.tobytes()
        back = MXFP4PackedCompressor.decompress({"weight_packed": torch.from_numpy(got_p.copy()),
                                                 "weight_scale": torch.from_numpy(got_s.copy())}, scheme)["weight"]
        assert float(np.abs(back.float().numpy() - drawn).max()) < 0.5 * float(np.abs(drawn).max())


def test_tokenizer_has_the_xtml_markers(k3):
    dec = json.loads((k3 / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    texts = {v["content"] for v in dec.values()}
    assert set(XTML_SPECIALS) <= texts and {"[BOS]", "[EOS]", "[PAD]"} <= texts
    cfg = json.loads((k3 / "config.json").read_text())["text_config"]
    assert dec[str(cfg["eos_token_id"])]["content"] == "[EOS]"
    n_base = len((k3 / "tiktoken.model").read_text().splitlines())
    assert min(int(k) for k in dec) == n_base and cfg["vocab_size"] == n_base + len(dec)


def test_same_flags_give_the_same_bytes(k3, tmp_path):
    proc = run(tmp_path / "again", *FLAGS, "--seed", "4")
    assert proc.returncode == 0, proc.stderr
    for f in sorted(k3.iterdir()):
        assert (tmp_path / "again" / f.name).read_bytes() == f.read_bytes(), f.name
    other = run(tmp_path / "other", *FLAGS, "--seed", "5")
    assert other.returncode == 0
    assert (tmp_path / "other" / "model-00002-of-00006.safetensors").read_bytes() != \
        (k3 / "model-00002-of-00006.safetensors").read_bytes()


@pytest.mark.parametrize("flags,code,needle", [
    (["--latent", "48"], 1, "--latent 48: MXFP4 experts need input widths that are multiples of 32"),
    (["--latent", "0", "--hidden", "72"], 1, "--hidden 72: MXFP4 experts need input widths"),
    (["--moe-intermediate", "40"], 1, "--moe-intermediate 40: MXFP4 experts need"),
    (["--a-log-pad", "1"], 1, "--a-log-pad 1 is below --kda-heads 2"),
    (["--dense", "4"], 1, "no MoE layer"),
    (["--latent", "-1"], 2, "--latent must be >= 0"),
])
def test_refusals_name_the_flag(tmp_path, flags, code, needle):
    proc = run(tmp_path / "x", *FLAGS, *flags)
    assert proc.returncode == code and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()


def test_k3_flags_are_refused_without_arch_k3(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "waste.tools.synth", str(tmp_path / "x"), "--latent", "64"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--latent applies to --arch k3 only" in proc.stderr
