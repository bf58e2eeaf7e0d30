"""MXFP4 test checkpoints made by compressed-tensors itself (the packing oracle).

``ct_compress`` runs the package's own ``mxfp4-pack-quantized`` compressor on one matrix
(scales from its own ``calculate_qparams``) and its own decompressor on the result;
``mxfp4_checkpoint`` rewrites a transformers checkpoint's routed experts into that form
(``w1/w2/w3.weight_packed`` + ``weight_scale``, a compressed-tensors ``quantization_config``)
and writes a twin checkpoint holding the package's dequantized experts as f32, which
transformers loads as an ordinary model: the f32 reference.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

MXFP4_FORMAT = "mxfp4-pack-quantized"
EXPERT = re.compile(r"(.*\.experts\.\d+\.w[123])\.weight$")


def ct_compress(torch, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weight_packed uint8 [r, c/2], weight_scale uint8 [r, c/32], dequantized f32 [r, c])."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    t = torch.from_numpy(np.ascontiguousarray(w, np.float32))
    rows, cols = t.shape
    g = t.reshape(rows, cols // 32, 32)
    scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights)
    packed = MXFP4PackedCompressor.compress({"weight": t, "weight_scale": scale, "weight_zero_point": zero}, scheme)
    assert set(packed) == {"weight_packed", "weight_scale"}, sorted(packed)
    back = MXFP4PackedCompressor.decompress(dict(packed), scheme)
    return (packed["weight_packed"].numpy().copy(), packed["weight_scale"].numpy().copy(),
            back["weight"].float().numpy().copy())


def quantization_config(targets: list[str]) -> dict:
    """A compressed-tensors ``quantization_config`` for MXFP4 weights on ``targets``."""
    return {
        "quant_method": "compressed-tensors", "format": MXFP4_FORMAT, "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "format": MXFP4_FORMAT, "targets": targets,
            "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                        "symmetric": True, "dynamic": False, "scale_dtype": "torch.uint8"},
            "input_activations": None, "output_activations": None}},
        "ignore": ["lm_head"],
    }


def mxfp4_checkpoint(torch, hf_dir: Path, out: Path, twin: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Writes ``out`` (experts in MXFP4 compressed-tensors form) and ``twin`` (the package's
    dequantized experts, f32) from the transformers checkpoint ``hf_dir``; returns the
    packed bytes per expert weight name (``...experts.E.wN``) for the byte-identity check."""
    from safetensors.numpy import load_file, save_file

    tensors: dict[str, np.ndarray] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(f))
    packed_out, twin_out, kept = {}, {}, {}
    for name, a in tensors.items():
        m = EXPERT.fullmatch(name)
        if not m:
            packed_out[name] = twin_out[name] = a
            continue
        packed, scale, deq = ct_compress(torch, a.astype(np.float32))
        packed_out[m.group(1) + ".weight_packed"], packed_out[m.group(1) + ".weight_scale"] = packed, scale
        twin_out[name] = deq
        kept[m.group(1)] = (packed, scale)
    for d, ts in ((out, packed_out), (twin, twin_out)):
        d.mkdir(parents=True, exist_ok=True)
        save_file(ts, str(d / "model.safetensors"))
        for extra in ("tiktoken.model", "tokenizer_config.json"):
            if (hf_dir / extra).exists():
                shutil.copy(hf_dir / extra, d / extra)
    cfg = json.loads((hf_dir / "config.json").read_text())
    (twin / "config.json").write_text(json.dumps(cfg))
    cfg["quantization_config"] = quantization_config([r"re:.*block_sparse_moe\.experts\.\d+\.w[123]$"])
    (out / "config.json").write_text(json.dumps(cfg))
    return kept


def bank_matrices(bank: Path, record: int) -> tuple[dict, list[bytes]]:
    """(bank header fields, the three matrix blocks of expert ``record``) read per FORMAT.md §5."""
    import struct

    raw = bank.read_bytes()
    fmt, group = struct.unpack_from("<II", raw, 20)
    rows, cols = struct.unpack_from("<3I", raw, 32), struct.unpack_from("<3I", raw, 44)
    record_bytes, _ = struct.unpack_from("<QQ", raw, 56)
    rec = raw[4096 + record * record_bytes: 4096 + (record + 1) * record_bytes]
    offs, lens = struct.unpack_from("<3Q", rec, 56), struct.unpack_from("<3Q", rec, 80)
    blocks = [rec[256 + o: 256 + o + n] for o, n in zip(offs, lens)]
    return {"format": fmt, "group": group, "rows": rows, "cols": cols, "record_bytes": record_bytes}, blocks


def deinterleave(block: bytes, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A container mxfp4 block back to compressed-tensors' (weight_packed, weight_scale)."""
    g = np.frombuffer(block, np.uint8).reshape(rows, cols // 32, 17)
    return g[..., 1:].reshape(rows, cols // 2), g[..., 0]
