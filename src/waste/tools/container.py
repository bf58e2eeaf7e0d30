"""Writes ``model.waste/`` containers (docs/FORMAT.md, format_version 1).

The one writer shared by ``tools.convert`` and synthetic-container tools: trunk tensors
stream into ``trunk.bin`` (64-byte aligned), each MoE layer's experts into a bank of
4096-aligned records with a crc32 per body; ``finish`` writes the manifest and renames the
temporary directory into place. Quantisation helpers (bf16, int8) live here too.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

FORMAT_VERSION = 1
FORMAT_CODES = {"f32": 0, "bf16": 1, "int8": 2, "int4": 3, "mxfp4": 4}
BANK_HEADER_BYTES = 4096
RECORD_HEADER_BYTES = 256
TRUNK_ALIGN = 64


class ContainerError(ValueError):
    """The input cannot become a valid container; the message names the tensor or field."""


def row_bytes(fmt: str, group: int, cols: int) -> int:
    """Bytes of one row of ``cols`` values in ``fmt`` (FORMAT.md §2)."""
    if fmt == "f32":
        return 4 * cols
    if fmt == "bf16":
        return 2 * cols
    if fmt in ("int8", "int4"):
        if group not in (32, 128) or cols % group:
            raise ContainerError(f"{fmt} needs group 32 or 128 dividing cols={cols} (group {group})")
        return cols // group * (2 + (group if fmt == "int8" else group // 2))
    if fmt == "mxfp4":
        if group != 32 or cols % 32:
            raise ContainerError(f"mxfp4 needs group 32 dividing cols={cols} (group {group})")
        return cols // 32 * 17
    raise ContainerError(f"format {fmt!r} cannot be written by this version")


class Mxfp4Source:
    """An MXFP4 matrix as compressed-tensors' ``mxfp4-pack-quantized`` stores it:
    ``packed`` uint8 [rows, cols/2] (E2M1 nibbles, low nibble = even column, sign = bit 3)
    and ``scale`` uint8 [rows, cols/32] (E8M0 exponents, 2^(e−127)). ``encode`` keeps these
    bytes, only interleaving them per group (FORMAT.md §2 code 4)."""

    def __init__(self, packed: np.ndarray, scale: np.ndarray, name: str = "matrix", scale_name: str = "") -> None:
        packed, scale = np.ascontiguousarray(packed), np.ascontiguousarray(scale)
        if packed.dtype != np.uint8 or scale.dtype != np.uint8 or packed.ndim != 2 or scale.ndim != 2:
            raise ContainerError(f"{name}: mxfp4 needs uint8 packed [rows, cols/2] and uint8 scale [rows, cols/32]")
        rows, half = packed.shape
        if half % 16 or scale.shape != (rows, half // 16):
            raise ContainerError(f"{name}: mxfp4 packed {list(packed.shape)} and scale {list(scale.shape)} do not "
                                 "describe groups of 32 columns")
        bad = np.argwhere(scale == 255)
        if bad.size:
            raise ContainerError(f"{scale_name or name}: mxfp4 scale byte 255 (NaN) at row {bad[0][0]} group "
                                 f"{bad[0][1]}")
        self.packed, self.scale, self.name = packed, scale, name
        self.shape = (rows, half * 2)
        self.ndim = 2

    def encode(self) -> bytes:
        """Per row and group: the E8M0 byte, then that group's 16 packed bytes as given."""
        rows, cols = self.shape
        out = np.empty((rows, cols // 32, 17), dtype=np.uint8)
        out[..., 0] = self.scale
        out[..., 1:] = self.packed.reshape(rows, cols // 32, 16)
        return out.tobytes()

    def dequantize(self) -> np.ndarray:
        """The f32 values (exact: every E2M1 value times a power of two fits f32)."""
        return mxfp4_values(self.packed, self.scale)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                dtype=np.float32)


def mxfp4_values(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Decodes compressed-tensors MXFP4 bytes (see ``Mxfp4Source``) to f32 [rows, cols]."""
    rows = packed.shape[0]
    nib = np.stack([packed & 15, packed >> 4], axis=-1).reshape(rows, -1)
    s = np.ldexp(np.float32(1.0), scale.astype(np.int32) - 127).astype(np.float32)
    return E2M1[nib] * np.repeat(s, 32, axis=1)


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 → bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounding = ((u >> 16) & 1) + np.uint32(0x7FFF)
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def quantize_int8(w: np.ndarray, group: int) -> np.ndarray:
    """[rows, cols] f32 → uint8 [rows, cols/group*(2+group)]: per group fp16 s then int8 q."""
    rows, cols = w.shape
    if group not in (32, 128) or cols % group:
        raise ContainerError(f"int8 group {group} must be 32 or 128 and divide cols={cols}")
    g = w.astype(np.float32).reshape(rows, cols // group, group)
    scale16 = (np.abs(g).max(axis=2) / np.float32(127.0)).astype(np.float16)
    s = scale16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.rint(g / np.where(s > 0, s, 1)), 0)
    q = np.clip(q, -127, 127).astype(np.int8)
    blocks = np.concatenate([scale16[..., None].view(np.uint8).reshape(rows, cols // group, 2),
                             q.view(np.uint8)], axis=2)
    return blocks.reshape(rows, -1)


def quantize_int4(w: np.ndarray, group: int) -> np.ndarray:
    """[rows, cols] f32 → uint8 [rows, cols/group*(2+group/2)]: per group fp16 s = max|w|/7,
    then q = round-half-even(w/s) clipped to [−8, 7], stored q+8, low nibble = even column."""
    rows, cols = w.shape
    if group not in (32, 128) or cols % group:
        raise ContainerError(f"int4 group {group} must be 32 or 128 and divide cols={cols}")
    g = w.astype(np.float32).reshape(rows, cols // group, group)
    scale16 = (np.abs(g).max(axis=2) / np.float32(7.0)).astype(np.float16)
    s = scale16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.rint(g / np.where(s > 0, s, 1)), 0)
    u = (np.clip(q, -8, 7) + 8).astype(np.uint8)
    packed = u[..., 0::2] | (u[..., 1::2] << 4)
    blocks = np.concatenate([scale16[..., None].view(np.uint8).reshape(rows, cols // group, 2), packed], axis=2)
    return blocks.reshape(rows, -1)


def encode(a, fmt: str, group: int) -> bytes:
    """Encodes a 1-D or 2-D f32 array in ``fmt`` (rows along the first axis); an
    ``Mxfp4Source`` is written as ``mxfp4`` only, keeping its bytes."""
    if isinstance(a, Mxfp4Source):
        if fmt != "mxfp4" or group != 32:
            raise ContainerError(f"{a.name}: an mxfp4 source is written as mxfp4 g32, not {fmt}")
        return a.encode()
    if fmt == "mxfp4":
        raise ContainerError("mxfp4 is written from compressed-tensors bytes only (no quantizer)")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if fmt == "f32":
        return a.astype("<f4").tobytes()
    if fmt == "bf16":
        return to_bf16_bits(a).astype("<u2").tobytes()
    if fmt == "int8":
        if a.ndim != 2:
            raise ContainerError("int8 applies to matrices only")
        return quantize_int8(a, group).tobytes()
    if fmt == "int4":
        if a.ndim != 2:
            raise ContainerError("int4 applies to matrices only")
        return quantize_int4(a, group).tobytes()
    raise ContainerError(f"format {fmt!r} cannot be written by this version")


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


class _RecordLayout:
    """Where the three matrices of every record of one bank go (FORMAT.md §4): blocks
    64-aligned in the body, the record padded to a multiple of 4096."""

    def __init__(self, shapes: list[tuple[int, ...]], lengths: list[int]) -> None:
        self.shapes, self.lengths = shapes, lengths
        self.offsets, at = [], 0
        for n in lengths:
            self.offsets.append(at)
            at += _pad(n, 64)
        self.body_length = self.offsets[2] + lengths[2]
        self.record_bytes = _pad(RECORD_HEADER_BYTES + self.body_length, 4096)

    def _shapes_into(self, header: bytearray) -> None:
        struct.pack_into("<3I", header, 32, *[s[0] for s in self.shapes])
        struct.pack_into("<3I", header, 44, *[s[1] for s in self.shapes])

    def record(self, layer: int, expert: int, fmt: str, group: int, blocks: list[bytes]) -> bytes:
        """One whole record: header (with the body's crc32), body, zero padding."""
        body = bytearray(self.body_length)
        for block, offset in zip(blocks, self.offsets):
            body[offset:offset + len(block)] = block
        hdr = bytearray(RECORD_HEADER_BYTES)
        hdr[0:8] = b"WSTREC01"
        struct.pack_into("<IIIIII", hdr, 8, 1, layer, expert, FORMAT_CODES[fmt], group, 3)
        self._shapes_into(hdr)
        struct.pack_into("<3Q", hdr, 56, *self.offsets)
        struct.pack_into("<3Q", hdr, 80, *self.lengths)
        struct.pack_into("<QI", hdr, 104, self.body_length, zlib.crc32(bytes(body)) & 0xFFFFFFFF)
        return bytes(hdr + body) + b"\0" * (self.record_bytes - RECORD_HEADER_BYTES - self.body_length)

    def bank_header(self, layer: int, n_experts: int, fmt: str, group: int) -> bytes:
        bh = bytearray(BANK_HEADER_BYTES)
        bh[0:8] = b"WSTBANK1"
        struct.pack_into("<IIIIII", bh, 8, 1, layer, n_experts, FORMAT_CODES[fmt], group, 3)
        self._shapes_into(bh)
        struct.pack_into("<QQ", bh, 56, self.record_bytes, self.body_length)
        return bytes(bh)


class ContainerWriter:
    """Builds one container in ``<out>.tmp`` and renames it to ``out`` in ``finish``.

    Call ``add_tensor`` for trunk tensors and ``add_bank`` for each MoE layer, in the
    order they should appear, then ``set_tokenizer``/``set_chat`` optionally, then
    ``finish(arch, config)``. Output is deterministic for identical calls.
    """

    def __init__(self, out_dir: str | os.PathLike, *, overwrite: bool = False) -> None:
        self.out = Path(out_dir)
        if self.out.exists() and not overwrite:
            raise ContainerError(f"{self.out} already exists")
        self.tmp = self.out.with_name(self.out.name + ".tmp")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self._trunk = open(self.tmp / "trunk.bin", "wb")
        self._tensors: list[dict] = []
        self._banks: list[dict] = []
        self._tokenizer: dict | None = None
        self._names: set[str] = set()

    def add_tensor(self, name: str, array: np.ndarray, fmt: str = "f32", group: int = 0,
                   on_disk: bool = False) -> None:
        """Appends one trunk tensor (1-D or 2-D, float values) in ``fmt``."""
        if name in self._names:
            raise ContainerError(f"duplicate tensor {name}")
        if array.ndim not in (1, 2):
            raise ContainerError(f"tensor {name}: shape {array.shape} must be 1-D or 2-D")
        if fmt in ("f32", "bf16"):
            group = 0
        if array.ndim == 1 and fmt not in ("f32", "bf16"):
            raise ContainerError(f"tensor {name}: vectors must be f32 or bf16")
        data = encode(array, fmt, group)
        off = self._trunk.tell()
        pad = _pad(off, TRUNK_ALIGN) - off
        self._trunk.write(b"\0" * pad)
        off += pad
        self._trunk.write(data)
        self._names.add(name)
        self._tensors.append({"name": name, "format": fmt, "group": group,
                              "shape": [int(d) for d in array.shape], "file": "trunk.bin",
                              "offset": off, "length": len(data), "on_disk": bool(on_disk)})

    def add_bank(self, layer: int, experts: Iterable[Sequence[np.ndarray]], n_experts: int,
                 fmt: str, group: int = 0) -> None:
        """Writes ``experts-L<layer>.bin`` from (gate [I,H], up [I,H], down [H,I]) per expert
        (f32 arrays, or ``Mxfp4Source`` matrices when ``fmt`` is mxfp4)."""
        if fmt in ("f32", "bf16"):
            group = 0
        path = self.tmp / f"experts-L{layer}.bin"
        layout: _RecordLayout | None = None
        with open(path, "wb") as f:
            f.write(b"\0" * BANK_HEADER_BYTES)
            count = 0
            for e, mats in enumerate(experts):
                if len(mats) != 3:
                    raise ContainerError(f"layer {layer} expert {e}: need gate, up, down")
                blocks = [encode(m, fmt, group) for m in mats]
                shapes = [tuple(int(d) for d in m.shape) for m in mats]
                if layout is None:
                    layout = _RecordLayout(shapes, [len(b) for b in blocks])
                elif shapes != layout.shapes:
                    raise ContainerError(f"layer {layer} expert {e}: shapes {shapes} differ from {layout.shapes}")
                f.write(layout.record(layer, e, fmt, group, blocks))
                count += 1
            if count != n_experts or layout is None:
                raise ContainerError(f"layer {layer}: {count} experts written, {n_experts} expected")
            f.seek(0)
            f.write(layout.bank_header(layer, n_experts, fmt, group))
        self._banks.append({"layer": layer, "file": path.name, "n_experts": n_experts, "format": fmt,
                            "group": group, "record_bytes": layout.record_bytes,
                            "shapes": [list(s) for s in layout.shapes]})

    def set_tokenizer(self, ranks: Sequence[bytes], specials: Sequence[tuple[int, str]]) -> None:
        """Writes ``tokenizer.tiktoken`` (token i = ranks[i]) and ``specials.json``."""
        if len(set(ranks)) != len(ranks):
            raise ContainerError("tokenizer: duplicate token bytes in the rank file")
        if not {bytes([b]) for b in range(256)} <= set(ranks):
            raise ContainerError("tokenizer: all 256 single bytes must be tokens")
        with open(self.tmp / "tokenizer.tiktoken", "wb") as f:
            for i, tok in enumerate(ranks):
                f.write(base64.b64encode(tok) + b" " + str(i).encode() + b"\n")
        ids = [i for i, _ in specials]
        if len(set(ids)) != len(ids) or any(i < len(ranks) for i in ids):
            raise ContainerError("tokenizer: special ids must be unique and >= n_base_vocab")
        entries = [{"id": int(i), "text": t} for i, t in sorted(specials)]
        (self.tmp / "specials.json").write_text(json.dumps(entries, ensure_ascii=False, indent=1) + "\n",
                                                encoding="utf-8")
        self._tokenizer = {"pretokenizer": "kimi", "n_base_vocab": len(ranks),
                           "ranks": "tokenizer.tiktoken", "specials": "specials.json"}

    def set_chat(self, chat: dict) -> None:
        """Writes the optional ``chat.json`` (the engine ignores it)."""
        (self.tmp / "chat.json").write_text(json.dumps(chat, ensure_ascii=False, indent=1) + "\n",
                                            encoding="utf-8")

    def finish(self, arch: str, config: dict, quant: dict) -> Path:
        """Writes manifest.json and renames the temporary directory to the output path."""
        self._trunk.close()
        manifest = {"format_version": FORMAT_VERSION, "arch": arch, "config": config, "quant": quant,
                    "tensors": self._tensors, "banks": self._banks, "tokenizer": self._tokenizer}
        (self.tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        if self.out.exists():
            shutil.rmtree(self.out)
        os.rename(self.tmp, self.out)
        return self.out

    def abandon(self) -> None:
        """Removes the temporary directory after a failure."""
        if not self._trunk.closed:
            self._trunk.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
