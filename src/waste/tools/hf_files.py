"""Pieces shared by the synthetic checkpoint writers (``synth`` for Kimi-Linear, ``synth_k3`` for
the K3 release layout): the per-tensor value streams and the HF tokenizer files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from waste.tools.container import Shape
from waste.tools.make_container import random_tensor


def draw(seed: int, name: str, shape: Shape, kind: str, bias_std: float) -> np.ndarray:
    """One tensor's values (float32), from a stream of its own (seed, name)."""
    if kind == "bias":
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
        return (bias_std * rng.standard_normal(shape)).astype(np.float32)
    return random_tensor(seed, name, shape, kind)


def write_tokenizer(out: Path, ranks: list[bytes], specials: tuple[str, ...]) -> None:
    """``tiktoken.model`` (base64 rank per line) and the specials' ``tokenizer_config.json``
    (``specials`` must hold [BOS], [EOS] and [PAD])."""
    import base64

    lines = [f"{base64.b64encode(t).decode()} {i}" for i, t in enumerate(ranks)]
    (out / "tiktoken.model").write_text("\n".join(lines) + "\n")
    decoder = {str(len(ranks) + i): {"content": s, "lstrip": False, "normalized": False,
                                     "rstrip": False, "single_word": False, "special": True}
               for i, s in enumerate(specials)}
    config = {"added_tokens_decoder": decoder, "bos_token": "[BOS]", "eos_token": "[EOS]",
              "pad_token": "[PAD]", "model_max_length": 1048576,
              "tokenizer_class": "TikTokenTokenizer"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


@contextlib.contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A fresh ``<out>.tmp-<pid>`` directory to write a checkpoint into; on success it replaces
    ``out`` whole (a reader never sees a half-written checkpoint), on any error it is removed."""
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
