"""tools.convert and tools.container: config normalisation, name checks, determinism, and
the byte layouts of docs/FORMAT.md read back independently of the C reader."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.engine import tiny
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


def test_unknown_and_missing_tensors_are_refused_by_name(torch_stack, tiny_dir, tmp_path):
    _, hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-names", tiny.CONFIG_A, seed=12)
    cfg = json.loads((Path(hf) / "config.json").read_text())
    bad = tmp_path / "hf"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(cfg))
    st = cv.SafeTensors(Path(hf))
    tensors = {n: st.load(n) for n in st.entries}
    tensors["model.layers.0.self_attn.surprise.weight"] = np.zeros((2, 2), np.float32)
    write_safetensors(bad / "model.safetensors", tensors)
    with pytest.raises(cv.ConvertError, match="unknown tensors: model.layers.0.self_attn.surprise.weight"):
        cv.convert(bad, tmp_path / "x.waste")
    del tensors["model.layers.0.self_attn.surprise.weight"]
    del tensors["model.layers.2.block_sparse_moe.experts.3.w2.weight"]
    write_safetensors(bad / "model.safetensors", tensors)
    with pytest.raises(cv.ConvertError, match="missing tensors: model.layers.2.block_sparse_moe.experts.3.w2"):
        cv.convert(bad, tmp_path / "x.waste")
    assert not (tmp_path / "x.waste").exists() and not (tmp_path / "x.waste.tmp").exists()


def test_int8_refuses_widths_that_are_not_a_group_multiple(torch_stack, tiny_dir, tmp_path):
    _, hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-g", tiny.CONFIG_A, seed=13)
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


def write_safetensors(path: Path, tensors: dict) -> None:
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], "<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
