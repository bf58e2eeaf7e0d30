"""tools.convert and tools.container: config normalisation, determinism, the input forms
(bf16 source, sharded with an index, layer 0's MLP under ``mlp.``), and the byte layouts of
docs/FORMAT.md read back independently of the C reader. Refusals: test_convert_refusals.py."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.engine import tiny
from tests.engine.tiny import write_safetensors
from waste.adapters.native import NativeEngine, NativeOptions
from waste.tools import convert as cv
from waste.tools.container import ContainerWriter, quantize_int8, to_bf16_bits


def test_layer_types_from_one_based_kda_layers():
    raw = {k: v for k, v in tiny.CONFIG_A.items() if k not in ("layer_types", "mlp_layer_types")}
    raw.update(num_hidden_layers=4, linear_attn_config={"kda_layers": [1, 2, 3], "full_attn_layers": [4],
                                                        "num_heads": 4, "head_dim": 16,
                                                        "short_conv_kernel_size": 4},
               first_k_dense_replace=1)
    cfg = cv.normalise_config(raw)
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg["mlp_layer_types"] == ["dense", "sparse", "sparse", "sparse"]
    assert cfg["num_experts"] == 8 and cfg["num_experts_per_token"] == 2 and cfg["q_lora_rank"] == 0
    assert cfg["mla_norm_eps"] == 1e-6 and cfg["kda_l2_eps"] == 1e-6


def test_missing_layer_kinds_stop_conversion():
    raw = {k: v for k, v in tiny.CONFIG_A.items() if k != "layer_types"}
    raw["num_hidden_layers"] = 4
    with pytest.raises(cv.ConvertError, match="neither layer_types nor linear_attn_config"):
        cv.normalise_config(raw)


def test_k3_keys_are_carried_for_the_engine_to_refuse():
    raw = dict(tiny.CONFIG_A, num_hidden_layers=4, attn_res_block_size=12,
               linear_attn_config={"gate_lower_bound": -5})
    cfg = cv.normalise_config(raw)
    assert cfg["attn_res_block_size"] == 12 and cfg["gate_lower_bound"] == -5


def test_a_log_accepts_exact_or_zero_padded_only():
    assert cv._a_log(np.arange(4.0).reshape(1, 1, 4, 1), 4, "A").tolist() == [0, 1, 2, 3]
    assert cv._a_log(np.array([1.0, 2, 0, 0]), 2, "A").tolist() == [1, 2]
    with pytest.raises(cv.ConvertError, match="A_log_x"):
        cv._a_log(np.array([1.0, 2, 3]), 2, "A_log_x")


def test_int8_and_bf16_encoders():
    w = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32)
    blocks = quantize_int8(w, 32).reshape(3, 2, 34)
    s = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
    assert np.abs(q).max() <= 127
    assert np.abs(q * s - w.reshape(3, 2, 32)).max() <= s.max() / 2 + 1e-7
    assert to_bf16_bits(np.array([1.0, -2.5, 1.00390625], np.float32)).tolist() == [0x3F80, 0xC020, 0x3F80]
    assert to_bf16_bits(np.array([1.01171875], np.float32)).tolist() == [0x3F82]  # ties to even


def test_bank_and_record_layout(tmp_path):
    w = ContainerWriter(tmp_path / "x.waste")
    rng = np.random.default_rng(1)
    experts = [[rng.normal(size=s).astype(np.float32) for s in ((8, 16), (8, 16), (16, 8))] for _ in range(3)]
    w.add_bank(5, experts, 3, "f32")
    w.add_tensor("v", np.ones(5, np.float32))
    out = w.finish("kimi_linear", {}, {})
    bank = (out / "experts-L5.bin").read_bytes()
    assert bank[:8] == b"WSTBANK1"
    version, layer, n, fmt, group, n_mats = struct.unpack_from("<6I", bank, 8)
    record, body = struct.unpack_from("<QQ", bank, 56)
    assert (version, layer, n, fmt, group, n_mats) == (1, 5, 3, 0, 0, 3)
    assert record % 4096 == 0 and len(bank) == 4096 + 3 * record
    for e in range(3):
        r = bank[4096 + e * record: 4096 + (e + 1) * record]
        assert r[:8] == b"WSTREC01" and struct.unpack_from("<III", r, 8) == (1, 5, e)
        offs = struct.unpack_from("<3Q", r, 56)
        blen, crc = struct.unpack_from("<QI", r, 104)
        assert blen == body and crc == zlib.crc32(r[256:256 + body])
        down = np.frombuffer(r[256 + offs[2]: 256 + offs[2] + 16 * 8 * 4], "<f4").reshape(16, 8)
        assert np.array_equal(down, experts[e][2])
        assert not any(r[256 + body:])


def test_conversion_is_deterministic_and_carries_the_tokenizer(torch_stack, tiny_dir, tmp_path):
    _, hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-det", tiny.CONFIG_Q, seed=11)
    a = cv.convert(hf, tmp_path / "a.waste", trunk="int8", experts="bf16")
    b = cv.convert(hf, tmp_path / "b.waste", trunk="int8", experts="bf16")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert {"manifest.json", "trunk.bin", "tokenizer.tiktoken", "specials.json"} <= set(names)
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    m = json.loads((a / "manifest.json").read_text())
    assert m["tokenizer"]["n_base_vocab"] == 512 - len(tiny.SPECIALS)
    specials = json.loads((a / "specials.json").read_text())
    assert [s["text"] for s in specials] == list(tiny.SPECIALS)
    first = (a / "tokenizer.tiktoken").read_text().splitlines()[0].split()
    assert base64.b64decode(first[0]) == b"\x00" and first[1] == "0"
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_int8_refuses_widths_that_are_not_a_group_multiple(tiny_hf, tmp_path):
    _, hf = tiny_hf
    with pytest.raises(cv.ConvertError, match="blk.0.kda.f_b"):
        cv.convert(hf, tmp_path / "g.waste", trunk="int8", experts="int8")


def test_params_match_a_python_count(torch_stack, libwaste, tiny_f32):
    from tests.engine.native import open_ctx

    model, path = tiny_f32
    total = sum(p.numel() for p in model.parameters())
    cfg = model.config
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    n_moe = cfg.mlp_layer_types.count("sparse")
    active = total - model.model.embed_tokens.weight.numel() - n_moe * (cfg.num_local_experts - cfg.num_experts_per_tok) * per_expert
    with open_ctx(path) as c:
        assert c.info.params_total == total
        assert c.info.params_active == active


def same_container(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(Path(src) / name, dst / name)


def test_sharded_checkpoint_with_index_converts_identically(tiny_hf, tiny_f32, tmp_path):
    model, hf = tiny_hf
    sharded = tmp_path / "hf-sharded"
    model.save_pretrained(sharded, max_shard_size="300KB")
    copy_tokenizer(hf, sharded)
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(shards) > 2 and (sharded / "model.safetensors.index.json").exists()
    out = cv.convert(sharded, tmp_path / "sharded.waste", trunk="f32", experts="f32")
    assert same_container(out, tiny_f32[1])


def test_layer0_mlp_is_accepted_under_mlp_or_block_sparse_moe(tiny_hf, tiny_f32, tmp_path):
    _, hf = tiny_hf
    st = cv.SafeTensors(Path(hf))
    tensors = {n: st.load(n) for n in st.entries}
    moonshot = {n.replace("layers.0.block_sparse_moe.", "layers.0.mlp."): a for n, a in tensors.items()}
    assert "model.layers.0.mlp.gate_proj.weight" in moonshot        # Moonshot's release naming
    for name, weights in (("mlp", moonshot), ("both", {**tensors, **moonshot})):
        d = tmp_path / f"hf-{name}"
        d.mkdir()
        shutil.copy(Path(hf) / "config.json", d / "config.json")
        copy_tokenizer(hf, d)
        write_safetensors(d / "model.safetensors", weights)
    out = cv.convert(tmp_path / "hf-mlp", tmp_path / "mlp.waste", trunk="f32", experts="f32")
    assert same_container(out, tiny_f32[1])
    with pytest.raises(cv.ConvertError, match="unknown tensors: model.layers.0.block_sparse_moe.down_proj"):
        cv.convert(tmp_path / "hf-both", tmp_path / "both.waste", trunk="f32", experts="f32")


def test_bf16_checkpoint_converts_losslessly_by_default(torch_stack, tiny_hf, tmp_path, report_measurement):
    """No --dtype: ``source`` keeps bf16 matrices bf16 (norms, router, conv stay f32), so the
    engine matches transformers running the same bf16 weights upcast to f32."""
    torch, transformers = torch_stack
    _, hf = tiny_hf
    bf16_dir = tmp_path / "hf-bf16"
    transformers.KimiLinearForCausalLM.from_pretrained(hf, dtype=torch.bfloat16).save_pretrained(bf16_dir)
    copy_tokenizer(hf, bf16_dir)
    assert {e.dtype for e in cv.SafeTensors(bf16_dir).entries.values()} == {"BF16"}
    assert cv.main([str(bf16_dir), str(tmp_path / "bf16.waste")]) == 0
    manifest = json.loads((tmp_path / "bf16.waste" / "manifest.json").read_text())
    assert manifest["quant"] == {"trunk": "bf16", "experts": "bf16", "group": 0}
    formats = {t["name"]: t["format"] for t in manifest["tensors"]}
    assert formats["lm_head"] == formats["embed"] == formats["blk.0.kda.q_proj"] == "bf16"
    assert formats["blk.0.attn_norm"] == formats["blk.1.moe.router"] == formats["blk.0.kda.q_conv"] == "f32"
    assert {b["format"] for b in manifest["banks"]} == {"bf16"}

    reference = transformers.KimiLinearForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32).eval()
    prompt = [int(x) for x in np.random.default_rng(4).integers(3, 512, 24)]
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0].double().numpy()
    with NativeEngine.open(tmp_path / "bf16.waste", NativeOptions(usage_path="")) as engine:
        got = np.array([engine.eval([t]) for t in prompt], dtype=np.float64)
    err = float(np.abs(got - expected).max())
    agree = float((got.argmax(1) == expected.argmax(1)).mean())
    report_measurement(f"{'bf16 source (lossless) vs the same weights in f32':<60} max-abs {err:.3e}  "
                       f"argmax agreement {agree:.3f} over {len(prompt)} positions")
    assert err < 1e-3 and agree == 1.0
