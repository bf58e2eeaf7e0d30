"""Reads a Hugging Face checkpoint directory with numpy only: safetensors and the tokenizer.

``SafeTensors`` indexes every tensor (with or without ``model.safetensors.index.json``) and
checks each header entry against the file — dtype, shape × dtype size = byte length, the
data inside the file — so nothing is found wrong half-way through writing a container.
``read_tokenizer`` reads ``tiktoken.model`` + ``tokenizer_config.json``, checked likewise.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from waste.tools.hf_config import ConvertError, read_json

_ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
              # Raw bytes: compressed-tensors' MXFP4 E2M1 nibbles and E8M0 scales (load_bytes).
              "U8": np.dtype("u1"), "F8_E8M0": np.dtype("u1")}
RAW_DTYPES = ("U8", "F8_E8M0")
_MAX_HEADER = 100 << 20
INDEX = "model.safetensors.index.json"


class Entry(NamedTuple):
    """One tensor: its file, safetensors dtype, shape and absolute byte range in the file."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        return tuple(value)
    return None


def _entry(path: Path, key: str, meta: Any, base: int, size: int) -> Entry:
    """One header entry, checked against the dtype table and the file's size."""
    where = f"tensor {key} ({path.name})"
    if not isinstance(meta, dict):
        raise ConvertError(f"{where}: the header entry must be an object, got {meta!r}")
    dtype, shape, offsets = meta.get("dtype"), _shape(meta.get("shape")), meta.get("data_offsets")
    if dtype not in _ST_DTYPES:
        raise ConvertError(f"{where}: dtype {dtype!r} is not supported (BF16, F16, F32; U8/F8_E8M0 for MXFP4)")
    if shape is None:
        raise ConvertError(f"{where}: shape {meta.get('shape')!r} is not a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_shape([o]) for o in offsets)
            or offsets[0] > offsets[1]):
        raise ConvertError(f"{where}: data_offsets {offsets!r} must be [begin, end] with 0 <= begin <= end")
    need = math.prod(shape) * _ST_DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != need:
        raise ConvertError(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, but "
                           f"{dtype} {list(shape)} needs {need}")
    if base + offsets[1] > size:
        raise ConvertError(f"{where}: its data ends at byte {base + offsets[1]}, past the end of the "
                           f"{size}-byte file (truncated?)")
    return Entry(path, dtype, shape, base + offsets[0], base + offsets[1])


def read_header(path: Path) -> tuple[dict, int, int]:
    """(header object, offset of the data, file size) of one safetensors file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConvertError(f"{path}: {size} bytes is too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            raise ConvertError(f"{path}: a header of {n} bytes does not fit (file {size} bytes, limit "
                               f"{_MAX_HEADER})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConvertError(f"{path}: the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: the header must be a JSON object")
    return header, 8 + n, size


def _indexed_files(hf_dir: Path) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files to read, and the index's tensor → file map when there is one."""
    index = hf_dir / INDEX
    if not index.exists():
        files = sorted(p.name for p in hf_dir.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{hf_dir}: no safetensors files")
        return files, None
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise ConvertError(f"{index}: weight_map must map tensor names to file names")
    files = sorted(set(weight_map.values()))
    for name in files:
        if "/" in name or name.startswith(".") or not (hf_dir / name).is_file():
            raise ConvertError(f"{index}: weight_map names {name!r}, which is not a file in {hf_dir}")
    return files, weight_map


class SafeTensors:
    """Index of every tensor in a checkpoint directory: name → Entry (file, dtype, shape, bytes).

    Raises (at construction):
        ConvertError: a malformed header, an entry inconsistent with its file, a tensor in
            two files, or an index that disagrees with the files, naming tensor and file.
    """

    def __init__(self, hf_dir: Path) -> None:
        self.entries: dict[str, Entry] = {}
        files, weight_map = _indexed_files(hf_dir)
        for name in files:
            path = hf_dir / name
            header, base, size = read_header(path)
            for key, meta in header.items():
                if key == "__metadata__":
                    continue
                if key in self.entries:
                    raise ConvertError(f"tensor {key} appears in two files ({self.entries[key].path.name}, {name})")
                self.entries[key] = _entry(path, key, meta, base, size)
        if weight_map is not None:
            for key, name in sorted(weight_map.items()):
                if key not in self.entries or self.entries[key].path.name != name:
                    raise ConvertError(f"{hf_dir / INDEX}: places tensor {key} in {name}, which does not hold it")
            extra = sorted(set(self.entries) - set(weight_map))
            if extra:
                raise ConvertError(f"tensor {extra[0]} ({self.entries[extra[0]].path.name}) is missing from {INDEX}")

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name`` as its header gives it."""
        return self.entries[name].shape

    def dtype(self, name: str) -> str:
        """The safetensors dtype of tensor ``name``: "F32", "F16" or "BF16"."""
        return self.entries[name].dtype

    def _raw(self, name: str) -> bytes:
        path, dtype, shape, begin, end = self.entries[name]
        with open(path, "rb") as f:
            f.seek(begin)
            raw = f.read(end - begin)
        if len(raw) != end - begin:
            raise ConvertError(f"tensor {name} ({path.name}): short read ({len(raw)} of {end - begin} bytes)")
        return raw

    def load_bytes(self, name: str) -> np.ndarray:
        """Reads a U8 / F8_E8M0 tensor as its uint8 bytes, unchanged (MXFP4 packing)."""
        entry = self.entries[name]
        if entry.dtype not in RAW_DTYPES:
            raise ConvertError(f"tensor {name} ({entry.path.name}): dtype {entry.dtype}, expected U8 or F8_E8M0")
        return np.frombuffer(self._raw(name), dtype=np.uint8).reshape(entry.shape)

    def load(self, name: str) -> np.ndarray:
        """Reads one tensor as float32 (its bytes were checked against the file at open)."""
        path, dtype, shape, begin, end = self.entries[name]
        if dtype in RAW_DTYPES:
            raise ConvertError(f"tensor {name} ({path.name}): dtype {dtype} where a float tensor (BF16, F16, F32) "
                               "is expected")
        with open(path, "rb") as f:
            f.seek(begin)
            raw = f.read(end - begin)
        if len(raw) != end - begin:
            raise ConvertError(f"tensor {name} ({path.name}): short read ({len(raw)} of {end - begin} bytes)")
        a = np.frombuffer(raw, dtype=_ST_DTYPES[dtype])
        if dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32).reshape(shape)


# ==== tokenizer =========================================================================
def _read_ranks(model: Path) -> list[bytes]:
    """``tiktoken.model``: ``base64 rank`` per line, dense from 0, unique, every byte present."""
    ranks: dict[int, bytes] = {}
    seen: dict[bytes, int] = {}
    for n, line in enumerate(model.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not re.fullmatch(rb"\d+", parts[1]):
            raise ConvertError(f"{model} line {n}: expected 'base64 rank'")
        try:
            token = base64.b64decode(parts[0], validate=True)
        except binascii.Error as exc:
            raise ConvertError(f"{model} line {n}: bad base64 {parts[0][:40]!r} ({exc})") from None
        rank = int(parts[1])
        if rank in ranks:
            raise ConvertError(f"{model} line {n}: rank {rank} appears twice")
        if token in seen:
            raise ConvertError(f"{model} line {n}: the bytes of rank {rank} are rank {seen[token]}'s too")
        ranks[rank], seen[token] = token, rank
    if sorted(ranks) != list(range(len(ranks))):
        raise ConvertError(f"{model}: ranks must be dense from 0")
    missing = [b for b in range(256) if bytes([b]) not in seen]
    if missing:
        raise ConvertError(f"{model}: byte 0x{missing[0]:02X} is not a token (all 256 single bytes must be)")
    return [ranks[i] for i in range(len(ranks))]


def _read_specials(path: Path, n_base: int, vocab: int) -> list[tuple[int, str]]:
    """``added_tokens_decoder`` entries at or above ``n_base``: (id, text), checked."""
    dec = read_json(path)
    dec = dec.get("added_tokens_decoder", {}) if isinstance(dec, dict) else None
    if not isinstance(dec, dict):
        raise ConvertError(f"{path}: added_tokens_decoder must be an object of id → token")
    specials: list[tuple[int, str]] = []
    texts: dict[str, int] = {}
    for key, value in dec.items():
        content = value.get("content") if isinstance(value, dict) else None
        if not re.fullmatch(r"\d+", key) or not isinstance(content, str) or not content:
            raise ConvertError(f"{path}: added_tokens_decoder[{key!r}] must be a decimal id with a "
                               "non-empty string content")
        token = int(key)
        if token < n_base:
            continue  # an added token inside the rank file is a base token, not a special
        if token >= vocab:
            raise ConvertError(f"{path}: special id {token} ({content!r}) is not below config.json's "
                               f"vocab_size {vocab}")
        if content in texts:
            raise ConvertError(f"{path}: ids {texts[content]} and {token} both spell {content!r}")
        texts[content] = token
        specials.append((token, content))
    return sorted(specials)


def read_tokenizer(hf_dir: Path, vocab: int) -> tuple[list[bytes], list[tuple[int, str]]] | None:
    """Rank file + specials from ``tiktoken.model`` and ``tokenizer_config.json``, or None
    when there is no ``tiktoken.model``; ``vocab`` is the model's ``vocab_size``.

    Raises:
        ConvertError: a malformed line (naming file and line), a bad special, or more ids
            than the model has.
    """
    model = hf_dir / "tiktoken.model"
    if not model.exists():
        return None
    ranks = _read_ranks(model)
    if len(ranks) > vocab:
        raise ConvertError(f"{model}: {len(ranks)} base tokens exceed config.json's vocab_size {vocab}")
    config = hf_dir / "tokenizer_config.json"
    specials = _read_specials(config, len(ranks), vocab) if config.exists() else []
    return ranks, specials
