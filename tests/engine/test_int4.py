"""int4 g32/g128 containers (docs/FORMAT.md §2 code 3) against transformers.

The twin model's weights are what the documented int4 formula makes of the checkpoint,
computed here in numpy independently of the converter (s = fp16(max|w|/7) per group of a
row, q = round-half-even(w/s) clipped to [−8, 7], w = q·s); libwaste on the converted
container must match transformers on the twin at f32 (max-abs ≤ 1e-4, every argmax equal).
The container's bytes are read back per the documented layout (fp16 s, then q+8 nibbles,
low nibble = even column) and must decode to the twin's values.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.engine import tiny
from tests.engine.test_oracle import engine_run, hf_run, measured, prompt_of
from waste.tools.convert import ConvertError, convert

pytestmark = pytest.mark.oracle


def int4_formula(w: np.ndarray, group: int) -> np.ndarray:
    """The documented int4 round trip of an f32 matrix, in f32."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    s = (np.abs(g).max(axis=2, keepdims=True) / np.float32(7)).astype(np.float16).astype(np.float32)
    safe = np.where(s == 0, np.float32(1), s)
    q = np.where(s == 0, 0, np.clip(np.rint(g / safe), -8, 7)).astype(np.float32)
    return (q * s).reshape(rows, cols)


def decode_int4_bytes(raw: bytes, rows: int, cols: int, group: int) -> np.ndarray:
    """Reads an int4 block per docs/FORMAT.md §2."""
    b = np.frombuffer(raw, np.uint8).reshape(rows, cols // group, 2 + group // 2)
    s = b[..., :2].copy().view("<f2").astype(np.float32)
    nib = np.empty((rows, cols // group, group), np.int32)
    nib[..., 0::2], nib[..., 1::2] = b[..., 2:] & 15, b[..., 2:] >> 4
    return ((nib - 8).astype(np.float32) * s).reshape(rows, cols)


def int4_twin(torch_stack, hf_dir, group: int):
    torch, transformers = torch_stack
    model = transformers.KimiLinearForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight") or p.numel() == 0:   # the router stays f32
                continue
            if p.dim() == 2:
                p.copy_(torch.from_numpy(int4_formula(p.numpy(), group)))
            elif p.dim() == 3 and ".experts." in name:               # fused [E, out, in]
                for e in range(p.shape[0]):
                    p[e].copy_(torch.from_numpy(int4_formula(p[e].numpy(), group)))
    return model


CASES = {32: ("hf-q", tiny.CONFIG_Q, 3), 128: ("hf-g128", tiny.CONFIG_G128, 4)}


@pytest.fixture(scope="module", params=[32, 128], ids=["g32", "g128"])
def int4_case(request, torch_stack, tiny_dir, libwaste):
    group = request.param
    name, config, seed = CASES[group]
    _, hf = tiny.make_checkpoint(torch_stack, tiny_dir / name, config, seed=seed)
    out = tiny_dir / f"int4-g{group}.waste"
    if not out.exists():
        convert(hf, out, trunk="int4", experts="int4", group=group)
    return group, hf, out, int4_twin(torch_stack, hf, group)


def test_int4_matches_transformers_on_the_formula_twin(torch_stack, int4_case, report_measurement):
    torch, _ = torch_stack
    group, _, out, twin = int4_case
    prompt = prompt_of(40, twin.config.vocab_size, seed=13)
    ref_pos, toks, ref_dec = hf_run(torch, twin, prompt, steps=8)
    got_pos, got_dec = engine_run(out, prompt, toks)
    err = max(float(np.abs(got_pos - ref_pos).max()), float(np.abs(got_dec - ref_dec).max()))
    ref, got = np.concatenate([ref_pos, ref_dec]), np.concatenate([got_pos, got_dec])
    agree = float((ref.argmax(1) == got.argmax(1)).mean())
    report_measurement(measured(f"int4 g{group} (trunk and experts) vs its formula twin", err, agree, len(ref)))
    assert err <= 1e-4
    assert (ref.argmax(1) == got.argmax(1)).all()


def test_int4_bytes_follow_the_documented_layout(int4_case):
    from waste.tools.hf_checkpoint import SafeTensors

    group, hf, out, _ = int4_case
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quant"] == {"trunk": "int4", "experts": "int4", "group": group}
    st = SafeTensors(hf)
    lm = next(t for t in manifest["tensors"] if t["name"] == "lm_head")
    assert lm["format"] == "int4" and lm["group"] == group
    raw = (out / "trunk.bin").read_bytes()[lm["offset"]:lm["offset"] + lm["length"]]
    rows, cols = lm["shape"]
    assert np.array_equal(decode_int4_bytes(raw, rows, cols, group), int4_formula(st.load("lm_head.weight"), group))
    from tests.engine.mxfp4_ckpt import bank_matrices

    bank = manifest["banks"][0]
    head, blocks = bank_matrices(out / bank["file"], 2)
    assert head["format"] == 3 and head["group"] == group
    for m, w in enumerate(("w1", "w3", "w2")):
        src = st.load(f"model.layers.{bank['layer']}.block_sparse_moe.experts.2.{w}.weight")
        got = decode_int4_bytes(blocks[m], head["rows"][m], head["cols"][m], group)
        assert np.array_equal(got, int4_formula(src, group))


def test_int4_refuses_a_width_that_is_not_a_multiple_of_the_group(tiny_hf, tmp_path):
    # Config A: MLA q_proj has 64 input columns, not a multiple of 128.
    with pytest.raises(ConvertError, match="not a multiple of the int4 group 128"):
        convert(tiny_hf[1], tmp_path / "x.waste", trunk="int4", experts="f32", group=128)
    assert not (tmp_path / "x.waste").exists()
