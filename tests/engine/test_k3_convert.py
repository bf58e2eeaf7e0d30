"""The converter for Kimi K3: the K3 config keys normalised with K3's defaults, the release
layout (``text_config``, ``language_model.``, shards + index, the vision tower skipped with a
note, the XTML tokenizer), K3 refusals by name, ``waste.tools.eval`` on a K3 container
without tokenizer files, and Kimi-Linear's chat.json written from the checkpoint's own
tokenizer files (synth → convert → a chat format the server resolves)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.engine import tiny
from tests.engine.native import open_ctx
from waste.tools.hf_config import ConvertError, normalise_config

REPO = Path(__file__).resolve().parents[2]


# ---- config normalisation (no torch) -------------------------------------------------------
def k3_text(**kw) -> dict:
    """A K3-style text config: Moonshot's key names, the layer kinds left to the defaults."""
    cfg = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
               num_hidden_layers=6, num_attention_heads=2, kv_lora_rank=16, q_lora_rank=24,
               qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_experts=8, num_experts_per_token=2,
               num_shared_experts=1, moe_renormalize=True, routed_scaling_factor=1.0, hidden_act="situ",
               activation_situ_beta=4, activation_situ_linear_beta=25, routed_expert_hidden_size=32,
               latent_moe_use_norm=True, attn_res_block_size=3, mla_use_output_gate=True, use_full_rank_gate=True,
               model_type="kimi_linear",
               linear_attn_config={"kda_layers": [1, 2, 3, 5], "num_heads": 2, "head_dim": 16,
                                   "short_conv_kernel_size": 4, "gate_lower_bound": -5.0})
    cfg.update(kw)
    return cfg


def test_release_config_gets_k3_defaults_and_every_delta_resolved():
    out = normalise_config({"model_type": "kimi_k3", "text_config": k3_text(moe_layer_freq=2)})
    # kda_layers alone: every other layer is MLA; first_k_dense_replace defaults to 0 in the release
    assert out["layer_types"] == ["linear_attention"] * 3 + ["full_attention", "linear_attention", "full_attention"]
    assert out["mlp_layer_types"] == ["sparse", "dense"] * 3
    assert {k: out[k] for k in ("hidden_act", "activation_situ_beta", "activation_situ_linear_beta",
                                "routed_expert_hidden_size", "latent_moe_use_norm", "attn_res_block_size",
                                "mla_use_output_gate", "use_full_rank_gate", "kda_decay", "gate_lower_bound")} == {
        "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "routed_expert_hidden_size": 32, "latent_moe_use_norm": True, "attn_res_block_size": 3,
        "mla_use_output_gate": True, "use_full_rank_gate": True, "kda_decay": "lower_bound", "gate_lower_bound": -5.0}
    # a flat checkpoint keeps Kimi-Linear's first_k_dense_replace default of 1
    flat = normalise_config(k3_text())
    assert flat["mlp_layer_types"] == ["dense"] + ["sparse"] * 5


@pytest.mark.parametrize("beta,want", [(None, 1.0), (0, 1.0), (2.5, 2.5)])
def test_situ_beta_missing_null_or_zero_is_one(beta, want):
    cfg = k3_text(activation_situ_beta=beta, activation_situ_linear_beta=None)
    out = normalise_config(cfg)
    assert out["activation_situ_beta"] == want and out["activation_situ_linear_beta"] is None


def test_renormalize_follows_the_key_that_said_it():
    """Moonshot's moe_renormalize only at k > 1; transformers' norm_topk_prob at any k."""
    assert normalise_config(k3_text(num_experts_per_token=1))["moe_renormalize"] is False
    assert normalise_config(k3_text(num_experts_per_token=2))["moe_renormalize"] is True
    cfg = k3_text(num_experts_per_token=1)
    cfg.pop("moe_renormalize")
    cfg["norm_topk_prob"] = True
    assert normalise_config(cfg)["moe_renormalize"] is True


def test_plain_kimi_linear_resolves_every_delta_off():
    out = normalise_config(dict(tiny.CONFIG_A))
    assert (out["hidden_act"], out["routed_expert_hidden_size"], out["attn_res_block_size"], out["kda_decay"],
            out["mla_use_output_gate"], out["use_full_rank_gate"]) == ("silu", 0, 0, "softplus", False, False)
    assert "gate_lower_bound" not in out and "activation_situ_beta" not in out


@pytest.mark.parametrize("raw,needle", [
    ({"model_type": "kimi_k3", "text_config": k3_text(model_type="deepseek_v3")},
     "text_config.model_type 'deepseek_v3' is not supported"),
    ({"model_type": "kimi_vl", "text_config": k3_text()}, "model_type 'kimi_vl' with a text_config"),
    (k3_text(routed_expert_hidden_size=0), "latent_moe_use_norm is true but routed_expert_hidden_size is unset"),
    (k3_text(hidden_act="silu"), "activation_situ_beta is set but hidden_act is 'silu'"),
    (k3_text(attn_res_block_size="12"), "attn_res_block_size must be an integer >= 0"),
])
def test_k3_config_refusals_name_the_key(raw, needle):
    with pytest.raises(ConvertError, match=None) as exc:
        normalise_config(raw)
    assert needle in str(exc.value)


# ---- the release layout, from the reference --------------------------------------------------
@pytest.fixture(scope="module")
def release(torch_stack, tiny_dir, libwaste):
    """(reference model, release dir, its container, the flat container, notes)."""
    from tests.engine import k3_reference as ref
    from tests.engine.test_k3_oracle import K3_A
    from waste.tools.convert import convert

    model = ref.build(K3_A, seed=21)
    rel = ref.save_release(model, tiny_dir / "k3-release-hf")
    flat = ref.save_checkpoint(model, tiny_dir / "k3-release-flat-hf", "pad:16")
    notes: list[str] = []
    out = convert(rel, tiny_dir / "k3-release.waste", trunk="f32", experts="f32", overwrite=True, note=notes.append)
    flat_out = convert(flat, tiny_dir / "k3-release-flat.waste", trunk="f32", experts="f32", overwrite=True)
    return model, rel, out, flat_out, notes


def test_release_layout_converts_to_the_same_model(release):
    model, _, out, flat_out, notes = release
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["arch"] == "kimi_k3"
    assert json.loads((flat_out / "manifest.json").read_text())["arch"] == "kimi_linear"
    assert notes and "skipped 2 vision tensors (mm_projector, vision_tower)" in notes[0]
    assert (out / "trunk.bin").read_bytes() == (flat_out / "trunk.bin").read_bytes()
    ids = [int(x) for x in np.random.default_rng(4).integers(3, 500, 12)]
    with open_ctx(out) as c, open_ctx(flat_out) as f:
        assert c.ffi.string(c.info.arch) == b"kimi_k3"
        got = np.array([c.eval([t]) for t in ids])
        assert got.tobytes() == np.array([f.eval([t]) for t in ids]).tobytes()
    want = model.logits(ids).double().numpy()
    assert float(np.abs(got - want).max()) <= 1e-4


def test_release_tokenizer_resolves_to_xtml_without_a_chat_json(release):
    from waste.adapters.native import NativeEngine, NativeOptions
    from waste.domain.chatfmt import select_chat_format

    _, _, out, _, _ = release
    assert not (out / "chat.json").exists()
    with NativeEngine.open(out, NativeOptions(usage_path="")) as engine:
        assert engine.model_info().arch == "kimi_k3"
        assert select_chat_format(engine, None).kind == "xtml"


def _copy_release(release, tmp_path) -> Path:
    dst = tmp_path / "rel"
    shutil.copytree(release[1], dst)
    return dst


def _edit_shard(hf: Path, fn) -> None:
    """Rewrites the release's tensors (name → array) through ``fn``, as one shard + index."""
    from waste.tools.hf_checkpoint import SafeTensors

    st = SafeTensors(hf)
    tensors = {n: st.load(n) for n in st.entries}
    fn(tensors)
    for p in hf.glob("model-*.safetensors"):
        p.unlink()
    tiny.write_safetensors(hf / "model-00001-of-00001.safetensors", tensors)
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: "model-00001-of-00001.safetensors" for n in tensors}}))


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.__setitem__("language_model.model.extra.weight", np.zeros(3, "f4")),
     "unknown tensors: language_model.model.extra.weight"),
    (lambda t: t.__setitem__("audio_tower.x.weight", np.zeros(3, "f4")), "unknown tensors: audio_tower.x.weight"),
    (lambda t: t.pop("language_model.model.output_attn_res_proj.weight"),
     "missing tensors: language_model.model.output_attn_res_proj.weight"),
    (lambda t: t["language_model.model.layers.0.self_attn.A_log"].__setitem__(12, 0.5),
     "tensor language_model.model.layers.0.self_attn.A_log: 16 values for 4 heads"),
    (lambda t: t.__setitem__("language_model.model.layers.0.self_attn.A_log", np.zeros((4, 4), "f4")),
     "tensor language_model.model.layers.0.self_attn.A_log: shape [4, 4]"),
])
def test_release_refusals_name_the_tensor(release, tmp_path, edit, needle):
    from waste.tools import convert as cv

    hf = _copy_release(release, tmp_path)
    _edit_shard(hf, edit)
    with pytest.raises(ConvertError) as exc:
        cv.convert(hf, tmp_path / "out.waste", trunk="f32", experts="f32", note=None)
    assert needle in str(exc.value)
    assert not (tmp_path / "out.waste").exists()


def test_eval_cli_on_a_k3_container_without_tokenizer_files(torch_stack, tiny_dir, libwaste):
    """convert DIR OUT --dtype f32 and eval OUT --ids … --json keep their interfaces for K3."""
    from tests.engine import k3_reference as ref
    from tests.engine.test_k3_oracle import K3_B

    model = ref.build(K3_B, seed=31)
    hf = ref.save_checkpoint(model, tiny_dir / "k3-cli-hf", "H")
    out = tiny_dir / "k3-cli.waste"
    if out.exists():
        shutil.rmtree(out)
    run = [sys.executable, "-m", "waste.tools.convert", str(hf), str(out), "--dtype", "f32"]
    assert subprocess.run(run, capture_output=True, text=True, cwd=REPO).returncode == 0
    assert json.loads((out / "manifest.json").read_text())["tokenizer"] is None
    ids = [5, 17, 300, 42, 7]
    res = subprocess.run([sys.executable, "-m", "waste.tools.eval", str(out), "--ids", ",".join(map(str, ids)),
                          "--json"], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    got = np.array(json.loads(res.stdout))
    assert float(np.abs(got - model.logits(ids)[-1].double().numpy()).max()) <= 1e-4


# ---- Kimi-Linear: chat.json from the checkpoint's own tokenizer files -----------------------
def test_synth_then_convert_serves_chat_with_no_hand_copied_file(tmp_path, libwaste):
    from waste.adapters.native import NativeEngine, NativeOptions
    from waste.domain.chatfmt import select_chat_format
    from waste.tools.convert import KIMI_LINEAR_CHAT

    hf, out = tmp_path / "hf", tmp_path / "m.waste"
    for cmd in ([sys.executable, "-m", "waste.tools.synth", str(hf), "--layers", "4", "--seed", "3", "--vocab-merges", "64"],
                [sys.executable, "-m", "waste.tools.convert", str(hf), str(out), "--dtype", "f32"]):
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        assert res.returncode == 0, res.stderr
    chat = json.loads((out / "chat.json").read_text())
    assert chat == KIMI_LINEAR_CHAT == json.loads((REPO / "examples" / "chat-kimi-linear.json").read_text())
    with NativeEngine.open(out, NativeOptions(usage_path="")) as engine:
        sel = select_chat_format(engine, (out / "chat.json").read_text())
        assert sel.kind == "chat.json", sel.error


# ---- --plan from a config.json alone ----------------------------------------------------------
def test_config_only_plan_equals_the_converted_containers(release, tiny_dir):
    """The manifest plan_config writes from config.json alone is the converter's (every
    tensor's name, shape, format and length; every bank's record size), so libwaste plans it
    identically, and the Python parameter count is the engine's."""
    from waste.adapters.native import NativeOptions, plan_memory
    from waste.tools.plan_config import params, plannable

    _, rel, out, _, _ = release
    real = json.loads((out / "manifest.json").read_text())
    options = NativeOptions(usage_path="", ctx_tokens=256)
    with plannable(rel / "config.json", "f32", "f32") as (path, manifest):
        assert manifest["arch"] == real["arch"] == "kimi_k3"
        strip = lambda ts: [{k: t[k] for k in ("name", "format", "group", "shape", "length", "on_disk")} for t in ts]
        assert strip(manifest["tensors"]) == strip(real["tensors"])
        assert manifest["banks"] == real["banks"]
        assert manifest["config"] == real["config"]
        assert plan_memory(path, options) == plan_memory(out, options)
    with open_ctx(out) as c:
        assert params(real) == (c.info.params_total, c.info.params_active)


def test_cli_plans_the_k3_release_geometry_from_its_config(libwaste):
    """`python -m waste CONFIG --plan` at K3's geometry (examples/kimi-k3-config.json):
    92 MoE layers x top-16 x one MXFP4 latent expert record = 25.8 GB per cold token."""
    res = subprocess.run([sys.executable, "-m", "waste", str(REPO / "examples" / "kimi-k3-config.json"), "--plan"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    got = dict(line.split(": ", 1) for line in (x.strip() for x in res.stdout.splitlines()))
    record = (256 + 3 * (3584 * 3072 // 32 * 17) + 4095) // 4096 * 4096
    assert int(got["record_bytes"]) == record == 17551360
    assert int(got["cold_token_bytes"]) == int(got["working_set_bytes"]) == 92 * 16 * record
    assert int(got["expert_bytes"]) == 92 * 896 * record
    assert float(got["tok_s_at_7GBps"]) == pytest.approx(7e9 / (92 * 16 * record), abs=1e-3)
    assert int(got["floor_bytes"]) > int(got["trunk_bytes"]) > 0


def test_release_plan_from_its_config_equals_the_mxfp4_container(tmp_path, libwaste):
    """synth --arch k3 (the release layout with MXFP4 experts) → the plan from its config.json
    alone (bf16 trunk, MXFP4 experts: the release's formats) equals the converted container's."""
    from tests.engine.conftest import require_module
    from waste.adapters.native import NativeOptions, plan_memory
    from waste.tools.plan_config import params, plannable

    require_module("compressed_tensors", "synth --arch k3 packs MXFP4 with compressed-tensors")
    hf, out = tmp_path / "k3", tmp_path / "k3.waste"
    for cmd in ([sys.executable, "-m", "waste.tools.synth", str(hf), "--arch", "k3", "--seed", "1"],
                [sys.executable, "-m", "waste.tools.convert", str(hf), str(out)]):
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        assert res.returncode == 0, res.stderr
    real = json.loads((out / "manifest.json").read_text())
    assert real["arch"] == "kimi_k3" and {b["format"] for b in real["banks"]} == {"mxfp4"}
    options = NativeOptions(usage_path="", ctx_tokens=512)
    with plannable(hf) as (path, manifest):
        assert manifest["banks"] == real["banks"]
        assert plan_memory(path, options) == plan_memory(out, options)
    with open_ctx(out) as c:
        assert params(real) == (c.info.params_total, c.info.params_active)


def test_params_active_at_kimi_linear_48b_geometry_is_the_documented_count():
    """The count plan_config shares with libwaste (checked equal above) gives docs/ENGINE.md
    §2's 3.10 B active at Kimi-Linear-48B's geometry (49.1 B in all)."""
    from waste.tools.plan_config import manifest_for, params

    full = [4, 8, 12, 16, 20, 24, 27]
    cfg = dict(model_type="kimi_linear", vocab_size=163840, hidden_size=2304, num_hidden_layers=27,
               intermediate_size=9216, moe_intermediate_size=1024, num_experts=256, num_experts_per_token=8,
               num_shared_experts=1, moe_renormalize=True, routed_scaling_factor=2.446, first_k_dense_replace=1,
               num_attention_heads=32, num_key_value_heads=32, q_lora_rank=None, kv_lora_rank=512,
               qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
               linear_attn_config={"num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4,
                                   "kda_layers": [i for i in range(1, 28) if i not in full], "full_attn_layers": full})
    total, active = params(manifest_for(cfg, "bf16", "bf16"))
    assert round(active / 1e9, 2) == 3.11 and round(total / 1e9, 1) == 49.1
