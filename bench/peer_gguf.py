"""The synthetic checkpoint → llama.cpp GGUF, with llama.cpp's own converter and quantizer.

``peer_checkpoint(hf_dir, peer_dir)`` makes the directory the converter reads: every file of
``hf_dir`` symlinked, except a **copy** of config.json with the Moonshot keys llama.cpp's
``kimi_linear`` converter needs and transformers 5.23 does not write (``linear_attn_config``,
``first_k_dense_replace``, ``moe_router_activation_func``; ``num_experts`` and
``num_shared_experts`` are written by transformers already).

Two things cannot be said in config.json, so ``python bench/peer_gguf.py --llama-src DIR
HF_DIR --outfile F --outtype T`` runs the sdist's ``convert_hf_to_gguf.py`` unmodified after
replacing two methods of its ``KimiLinearModel`` (its code on disk is not edited):
- ``set_vocab``: its Kimi branch loads Moonshot's tokenizer as remote code
  (``AutoTokenizer(trust_remote_code=True)``), which a synthetic checkpoint does not ship;
  the replacement builds the same GPT-2-style vocab (its ``QwenModel.bpe`` merges, pre-
  tokenizer "kimi-k2") from our ``tiktoken.model`` + ``tokenizer_config.json``.
- ``modify_tensors``: transformers 5.23 names the dense layer-0 MLP
  ``block_sparse_moe.{gate,up,down}_proj``; the converter maps only ``mlp.*``, so those
  names are rewritten before its own method runs.
It runs under the bench's python (torch + transformers, the oracle extras) with the sdist's
``gguf-py`` on the path. ``quantize`` then calls llama.cpp's ``llama_model_quantize`` through
the peer venv's ``llama_cpp`` (the ``llama-quantize`` binary is not built by the wheel).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_build import Peer, PeerUnavailable  # noqa: E402

# llama.cpp's file types for the formats paired with ours (docs/ENGINE.md §8: equal bytes/weight).
PAIRED_FTYPE = {"int8": ("Q8_0", 7), "int4": ("Q4_0", 2)}  # LLAMA_FTYPE_MOSTLY_Q8_0 / Q4_0
_DENSE_MLP = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.((?:gate|up|down)_proj\.weight)$")


def moonshot_keys(cfg: dict) -> dict:
    """The keys Moonshot's config.json has and transformers' does not, derived from ``cfg``.

    Raises:
        PeerUnavailable: the MLP layout is not "dense layers first, then MoE" (which is all
            ``first_k_dense_replace`` can say).
    """
    kinds = cfg["mlp_layer_types"]
    dense = kinds.index("sparse") if "sparse" in kinds else len(kinds)
    if any(k != "sparse" for k in kinds[dense:]):
        raise PeerUnavailable(f"not comparable: mlp_layer_types {kinds} is not dense-first, "
                              "which first_k_dense_replace cannot express")
    if cfg["linear_num_heads"] != cfg["num_attention_heads"]:
        raise PeerUnavailable(f"not comparable: llama.cpp's kimi_linear sizes KDA with the MLA head "
                              f"count ({cfg['num_attention_heads']}), this model has "
                              f"{cfg['linear_num_heads']} KDA heads")
    layers = cfg["layer_types"]
    return {
        "linear_attn_config": {
            "kda_layers": [i + 1 for i, k in enumerate(layers) if k == "linear_attention"],
            "full_attn_layers": [i + 1 for i, k in enumerate(layers) if k == "full_attention"],
            "num_heads": cfg["linear_num_heads"], "head_dim": cfg["linear_head_dim"],
            "short_conv_kernel_size": cfg["linear_conv_kernel_dim"]},
        "first_k_dense_replace": dense, "moe_layer_freq": 1,
        "moe_router_activation_func": "sigmoid",
    }


def peer_checkpoint(hf_dir: Path, peer_dir: Path) -> Path:
    """``peer_dir``: symlinks to ``hf_dir``'s files and a patched copy of its config.json."""
    peer_dir.mkdir(parents=True, exist_ok=True)
    for old in peer_dir.iterdir():
        old.unlink()
    for src in sorted(hf_dir.iterdir()):
        if src.name != "config.json":
            (peer_dir / src.name).symlink_to(src.resolve())
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg.update(moonshot_keys(cfg))
    (peer_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return peer_dir


def convert_to_gguf(peer: Peer, peer_dir: Path, outfile: Path, log: Path, outtype: str = "bf16") -> Path:
    """Runs llama.cpp's converter (through this file's ``__main__``) into ``outfile``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--llama-src", str(peer.llama_src),
           str(peer_dir), "--outfile", str(outfile), "--outtype", outtype]
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not outfile.is_file():
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-6:])
        raise PeerUnavailable(f"not comparable: llama.cpp's convert_hf_to_gguf.py exited "
                              f"{done.returncode} ({log}): {tail}")
    return outfile


QUANTIZE = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = int(sys.argv[3])
params.nthread = int(sys.argv[4])
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params)
sys.exit(rc)
"""


def quantize(peer: Peer, gguf_in: Path, gguf_out: Path, ours: str, threads: int, log: Path) -> tuple[Path, str]:
    """``gguf_in`` quantized by llama.cpp to the type paired with our format ``ours``."""
    if ours not in PAIRED_FTYPE:
        raise PeerUnavailable(f"not comparable: no llama.cpp type is paired with our {ours!r}")
    name, ftype = PAIRED_FTYPE[ours]
    with open(log, "a") as out:
        done = subprocess.run([str(peer.python), "-c", QUANTIZE, str(gguf_in), str(gguf_out),
                               str(ftype), str(threads)], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not gguf_out.is_file():
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-6:])
        raise PeerUnavailable(f"not comparable: llama_model_quantize to {name} returned "
                              f"{done.returncode} ({log}): {tail}")
    return gguf_out, name


# ==== run as a script: the converter, with the two replacements ======================
def _synthetic_vocab(self) -> None:
    """KimiLinearModel.set_vocab's kimi-k2 branch, fed by tiktoken.model instead of
    Moonshot's remote-code tokenizer."""
    import base64

    import gguf  # the sdist's gguf-py
    from conversion.qwen import QwenModel

    ranks = {}
    for line in (self.dir_model / "tiktoken.model").read_text().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    decoder = json.loads((self.dir_model / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    specials = {v["content"]: int(k) for k, v in decoder.items()}
    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[QwenModel.token_bytes_to_string(token)] = rank
        if len(token) > 1:
            merged = QwenModel.bpe(ranks, token, max_rank=rank)
            if len(merged) == 2:
                merges.append(" ".join(map(QwenModel.token_bytes_to_string, merged)))
    reverse = {i: t for t, i in {**vocab, **specials}.items()}
    tokens, types = [], []
    for i in range(self.hparams["vocab_size"]):
        tokens.append(reverse.get(i, f"[PAD{i}]"))
        types.append(gguf.TokenType.UNUSED if i not in reverse else
                     gguf.TokenType.CONTROL if i in specials.values() else gguf.TokenType.NORMAL)
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("kimi-k2")
    self.gguf_writer.add_token_list(tokens)
    self.gguf_writer.add_token_types(types)
    self.gguf_writer.add_token_merges(merges)
    gguf.SpecialVocab(self.dir_model, load_merges=False).add_to_gguf(self.gguf_writer)


def _run_converter(llama_src: Path, argv: list[str]) -> None:
    sys.path[:0] = [str(llama_src), str(llama_src / "gguf-py")]
    from conversion import kimi_linear

    model = kimi_linear.KimiLinearModel
    original = model.modify_tensors

    def modify_tensors(self, data_torch, name, bid):
        return original(self, data_torch, _DENSE_MLP.sub(r"\1mlp.\2", name), bid)

    model.set_vocab = _synthetic_vocab
    model.modify_tensors = modify_tensors
    sys.argv = [str(llama_src / "convert_hf_to_gguf.py"), *argv]
    import convert_hf_to_gguf

    convert_hf_to_gguf.main()


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--llama-src":
        sys.exit("usage: peer_gguf.py --llama-src LLAMA_CPP_DIR HF_DIR --outfile F --outtype T")
    _run_converter(Path(sys.argv[2]), sys.argv[3:])
