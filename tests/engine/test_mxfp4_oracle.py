"""MXFP4 experts kept as shipped (docs/FORMAT.md §2 code 4), against compressed-tensors.

A tiny Kimi-Linear checkpoint from transformers has its routed experts compressed by
compressed-tensors' own ``mxfp4-pack-quantized`` compressor; the converter must keep those
bytes (the container only interleaves each group's scale byte with its 16 packed bytes), and
libwaste's logits must equal transformers' on the same model whose experts are the package's
own DEQUANTIZED weights, at f32 (max-abs ≤ 1e-4, every argmax equal).
"""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from tests.engine import mxfp4_ckpt, tiny
from tests.engine.conftest import require_module
from tests.engine.native import open_ctx, try_open
from tests.engine.test_oracle import engine_run, hf_run, measured, prompt_of
from waste.tools.container import ContainerError
from waste.tools.convert import ConvertError, convert

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def mx(torch_stack, tiny_dir, libwaste):
    """(packed bytes per expert, mxfp4 hf dir, twin model, container) for CONFIG_Q."""
    require_module("compressed_tensors", "the MXFP4 packing oracle (pip install compressed-tensors)")
    torch, transformers = torch_stack
    _, hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-mx-src", tiny.CONFIG_Q, seed=5)
    src, twin_dir = tiny_dir / "hf-mx", tiny_dir / "hf-mx-twin"
    if src.exists():
        shutil.rmtree(src)
        shutil.rmtree(twin_dir)
    kept = mxfp4_ckpt.mxfp4_checkpoint(torch, hf, src, twin_dir)
    out = tiny_dir / "mx.waste"
    if out.exists():
        shutil.rmtree(out)
    convert(src, out, trunk="f32", experts="source")
    twin = transformers.KimiLinearForCausalLM.from_pretrained(twin_dir).eval()
    return kept, src, twin, out


def test_the_container_keeps_compressed_tensors_bytes(mx):
    kept, _, _, out = mx
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quant"]["experts"] == "mxfp4"
    assert manifest["banks"] and all(b["format"] == "mxfp4" and b["group"] == 32 for b in manifest["banks"])
    checked = 0
    for bank in manifest["banks"]:
        layer = bank["layer"]
        for e in range(bank["n_experts"]):
            head, blocks = mxfp4_ckpt.bank_matrices(out / bank["file"], e)
            assert head["format"] == 4 and head["group"] == 32
            for m, w in enumerate(("w1", "w3", "w2")):
                packed, scale = kept[f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}"]
                got_packed, got_scale = mxfp4_ckpt.deinterleave(blocks[m], head["rows"][m], head["cols"][m])
                assert got_packed.tobytes() == packed.tobytes() and got_scale.tobytes() == scale.tobytes()
                assert len(blocks[m]) == packed.nbytes + scale.nbytes   # nothing added, nothing lost
                checked += 1
    assert checked == 3 * sum(b["n_experts"] for b in manifest["banks"])


def test_logits_equal_transformers_on_the_dequantized_experts(torch_stack, mx, report_measurement):
    torch, _ = torch_stack
    _, _, twin, out = mx
    prompt = prompt_of(40, twin.config.vocab_size, seed=21)
    ref_pos, toks, ref_dec = hf_run(torch, twin, prompt, steps=8)
    got_pos, got_dec = engine_run(out, prompt, toks)
    err = max(float(np.abs(got_pos - ref_pos).max()), float(np.abs(got_dec - ref_dec).max()))
    ref, got = np.concatenate([ref_pos, ref_dec]), np.concatenate([got_pos, got_dec])
    agree = float((ref.argmax(1) == got.argmax(1)).mean())
    report_measurement(measured("mxfp4 experts (compressed-tensors) vs dequantized twin", err, agree, len(ref)))
    assert err <= 1e-4
    assert (ref.argmax(1) == got.argmax(1)).all()


def test_kernel_sets_give_the_same_bytes_on_mxfp4(mx):
    _, _, _, out = mx
    ids = prompt_of(24, 512, seed=3)
    with open_ctx(out, kernels=1) as g:
        ref = np.array([g.eval([t]) for t in ids], np.float32)
    compared = 0
    for k in (2, 3):
        st, detail, ctx = try_open(out, kernels=k)
        if st == "E_UNSUPPORTED":
            continue
        assert st == "OK", detail
        with ctx:
            got = np.array([ctx.eval([t]) for t in ids], np.float32)
        assert got.tobytes() == ref.tobytes(), f"kernels {k} differ from generic on mxfp4 experts"
        compared += 1
    if not compared:
        pytest.skip("this CPU has neither AVX2+FMA nor AVX-512F: only generic kernels to run")


def test_requantizing_an_mxfp4_source_decodes_it_exactly(mx, tiny_dir):
    """``--experts f32`` from MXFP4 writes exactly the values compressed-tensors decompresses."""
    import torch
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    kept, src, _, _ = mx
    out = tiny_dir / "mx-f32.waste"
    if out.exists():
        shutil.rmtree(out)
    convert(src, out, trunk="f32", experts="f32")
    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    for bank in json.loads((out / "manifest.json").read_text())["banks"]:
        assert bank["format"] == "f32"
        _, blocks = mxfp4_ckpt.bank_matrices(out / bank["file"], 1)
        for m, w in enumerate(("w1", "w3", "w2")):
            packed, scale = kept[f"model.layers.{bank['layer']}.block_sparse_moe.experts.1.{w}"]
            deq = MXFP4PackedCompressor.decompress({"weight_packed": torch.from_numpy(packed),
                                                    "weight_scale": torch.from_numpy(scale)}, scheme)["weight"]
            got = np.frombuffer(blocks[m], "<f4").reshape(deq.shape)
            assert np.array_equal(got, deq.float().numpy())


def _rewrite(src, dst, edit):
    """A copy of checkpoint ``src`` with ``edit(tensors, config)`` applied."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    cfg = json.loads((dst / "config.json").read_text())
    edit(tensors, cfg)
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(cfg))


def test_a_nan_scale_is_refused_by_the_converter_naming_the_tensor(mx, tmp_path):
    _, src, _, _ = mx
    name = "model.layers.2.block_sparse_moe.experts.3.w2.weight_scale"

    def nan_scale(t, _):
        t[name] = t[name].copy()
        t[name][5, 0] = 255
    _rewrite(src, tmp_path / "hf", nan_scale)
    with pytest.raises(ContainerError, match=r"experts\.3\.w2\.weight_scale: mxfp4 scale byte 255 \(NaN\) at row 5 "
                                             r"group 0"):
        convert(tmp_path / "hf", tmp_path / "x.waste", trunk="f32")
    assert not (tmp_path / "x.waste").exists()


def test_a_nan_scale_in_a_record_is_refused_by_the_engine_naming_the_expert(mx, tmp_path):
    _, _, _, out = mx
    copy = tmp_path / "c.waste"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    bank = manifest["banks"][0]
    path = copy / bank["file"]
    raw = bytearray(path.read_bytes())
    offs = struct.unpack_from("<3Q", raw, 4096 + 2 * bank["record_bytes"] + 56)
    down_rows, down_cols = bank["shapes"][2]
    at = 4096 + 2 * bank["record_bytes"] + 256 + offs[2] + (3 * (down_cols // 32) + 0) * 17   # row 3, group 0
    raw[at] = 255
    path.write_bytes(bytes(raw))
    with open_ctx(copy, usage_path="") as c:
        statuses = [c.eval_status([t]) for t in prompt_of(8, 512, seed=2)]
    bad = [s for s in statuses if s[0] != "OK"]
    assert bad, "every expert is selected in CONFIG_Q, so expert 2 is read"
    st, detail = bad[0]
    assert st == "E_FORMAT"
    assert f"expert 2 of layer {bank['layer']}: mxfp4 scale byte 255 (NaN) in down row 3 group 0" in detail


def test_another_quantization_format_is_refused_by_name(mx, tmp_path):
    _, src, _, _ = mx

    def int4_config(_, cfg):
        cfg["quantization_config"]["format"] = "pack-quantized"
        cfg["quantization_config"]["config_groups"]["group_0"]["format"] = "pack-quantized"
    _rewrite(src, tmp_path / "hf", int4_config)
    with pytest.raises(ConvertError, match="quantization_config must be compressed-tensors with format "
                                           "'mxfp4-pack-quantized'.*pack-quantized"):
        convert(tmp_path / "hf", tmp_path / "x.waste")


def test_an_mxfp4_pair_with_inconsistent_shapes_is_refused_by_name(mx, tmp_path):
    _, src, _, _ = mx
    name = "model.layers.1.block_sparse_moe.experts.0.w1.weight_scale"

    def short_scale(t, _):
        t[name] = t[name][:, :1].copy()
    _rewrite(src, tmp_path / "hf", short_scale)
    with pytest.raises(ConvertError, match=r"experts\.0\.w1\.weight_packed .* not MXFP4 groups of 32"):
        convert(tmp_path / "hf", tmp_path / "x.waste")
