"""Writes a deterministic synthetic Hugging Face Kimi-Linear (or Kimi K3) checkpoint.

``python -m waste.tools.synth OUT_HF_DIR [geometry flags] [--dtype bf16|f32] [--seed N]
[--bias-std S]`` writes what transformers 5.23's ``KimiLinearForCausalLM.save_pretrained``
writes — ``config.json``, ``generation_config.json``, safetensors shards under transformers'
tensor names with ``model.safetensors.index.json`` — plus a Moonshot-style ``tiktoken.model``
and ``tokenizer_config.json``. Both ``waste.tools.convert`` and llama.cpp's
``convert_hf_to_gguf.py`` read it, so two engines can run the same weights (bench/).

Tensors are drawn one at a time from their own seeded stream (so same seed and flags give
byte-identical files) and streamed into one shard per layer: memory stays at one tensor.
``e_score_correction_bias`` is drawn with standard deviation ``--bias-std``, which skews the
routing toward some experts (docs/ENGINE.md §8 "Routing skew").

``--arch k3`` writes the Kimi K3 release layout instead (synth_k3.py: ``kimi_k3`` config with
``text_config``, ``language_model.`` names, MXFP4 experts packed by compressed-tensors, a few
vision tensors, the XTML tokenizer), at a scaled-down K3 geometry by default; every geometry
flag applies, and ``--q-lora-rank``, ``--latent``, ``--attn-res-block`` … set the K3 deltas.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from waste.tools.bpe_train import train_ranks
from waste.tools.container import ContainerError, TensorSpec, to_bf16_bits
from waste.tools.hf_files import draw, staged_dir, write_tokenizer
from waste.tools.make_container import (CORPUS, Geometry, add_geometry_flags, geometry_from_flags)

TRANSFORMERS_VERSION = "5.23.0"
# Moonshot's names for the specials it uses most; [BOS] and [EOS] are the config's ids.
SPECIALS = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
            "<|im_middle|>", "[PAD]")
DTYPES = {"f32": ("F32", "float32", 4), "bf16": ("BF16", "bfloat16", 2)}
DEFAULT_BIAS_STD = 0.5  # make_container's router_bias spread, so both tools route alike

Spec = TensorSpec  # (transformers name, shape, kind for random_tensor)


def hf_config(g: Geometry, vocab: int, dtype: str) -> dict:
    """``config.json`` exactly as transformers 5.23 saves a ``KimiLinearConfig`` of ``g``."""
    ids = {s: vocab - len(SPECIALS) + i for i, s in enumerate(SPECIALS)}
    return {
        "architectures": ["KimiLinearForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": ids["[BOS]"], "dtype": DTYPES[dtype][1],
        "eos_token_id": ids["[EOS]"], "head_dim": g.qk_rope, "hidden_act": "silu",
        "hidden_size": g.hidden, "initializer_range": 0.02, "intermediate_size": g.intermediate,
        "kv_lora_rank": g.kv_lora_rank, "layer_types": g.layer_types(),
        "linear_conv_kernel_dim": g.conv_kernel, "linear_head_dim": g.kda_head_dim,
        "linear_num_heads": g.kda_heads,
        "mlp_layer_types": ["dense" if i < g.dense else "sparse" for i in range(g.layers)],
        "model_max_length": 1048576, "model_type": "kimi_linear",
        "moe_intermediate_size": g.moe_intermediate, "moe_renormalize": True,
        "num_attention_heads": g.mla_heads, "num_expert_group": 1, "num_experts": g.experts,
        "num_experts_per_token": g.top_k, "num_hidden_layers": g.layers,
        "num_key_value_heads": g.mla_heads, "num_shared_experts": g.shared,
        "output_router_logits": False, "pad_token_id": ids["[PAD]"], "pretraining_tp": 1,
        "q_lora_rank": None, "qk_head_dim": g.qk_nope + g.qk_rope,
        "qk_nope_head_dim": g.qk_nope, "qk_rope_head_dim": g.qk_rope, "rms_norm_eps": 1e-05,
        "routed_scaling_factor": 2.446, "tie_word_embeddings": False, "topk_group": 1,
        "transformers_version": TRANSFORMERS_VERSION, "use_cache": True,
        "v_head_dim": g.v_head, "vocab_size": vocab,
    }


def generation_config(cfg: dict) -> dict:
    """``generation_config.json`` as save_pretrained writes it from the model config."""
    return {"_from_model_config": True, "bos_token_id": cfg["bos_token_id"],
            "eos_token_id": cfg["eos_token_id"], "output_attentions": False,
            "output_hidden_states": False, "pad_token_id": cfg["pad_token_id"],
            "transformers_version": TRANSFORMERS_VERSION, "use_cache": True}


def _kda(g: Geometry, a: str) -> list[Spec]:
    H, hd, d, K = g.hidden, g.kda_heads * g.kda_head_dim, g.kda_head_dim, g.conv_kernel
    return [(a + "A_log", (1, 1, g.kda_heads, 1), "a_log"), (a + "b_proj.weight", (g.kda_heads, H), "mat"),
            (a + "dt_bias", (hd,), "dt_bias"), (a + "f_a_proj.weight", (d, H), "mat"),
            (a + "f_b_proj.weight", (hd, d), "mat"), (a + "g_a_proj.weight", (d, H), "mat"),
            (a + "g_b_proj.weight", (hd, d), "mat"), (a + "k_conv1d.weight", (hd, 1, K), "conv"),
            (a + "k_proj.weight", (hd, H), "mat"), (a + "o_norm.weight", (d,), "norm"),
            (a + "o_proj.weight", (H, hd), "mat"), (a + "q_conv1d.weight", (hd, 1, K), "conv"),
            (a + "q_proj.weight", (hd, H), "mat"), (a + "v_conv1d.weight", (hd, 1, K), "conv"),
            (a + "v_proj.weight", (hd, H), "mat")]


def _mla(g: Geometry, a: str) -> list[Spec]:
    H, nh, r = g.hidden, g.mla_heads, g.kv_lora_rank
    return [(a + "kv_a_layernorm.weight", (r,), "norm"),
            (a + "kv_a_proj_with_mqa.weight", (r + g.qk_rope, H), "mat"),
            (a + "kv_b_proj.weight", (nh * (g.qk_nope + g.v_head), r), "mat"),
            (a + "o_proj.weight", (H, nh * g.v_head), "mat"),
            (a + "q_proj.weight", (nh * (g.qk_nope + g.qk_rope), H), "mat")]


def _mlp(g: Geometry, layer: int, m: str) -> list[Spec]:
    H, I, Im, S = g.hidden, g.intermediate, g.moe_intermediate, g.shared
    if layer < g.dense:  # transformers 5.23 names the dense MLP block_sparse_moe too
        return [(m + "down_proj.weight", (H, I), "mat"), (m + "gate_proj.weight", (I, H), "mat"),
                (m + "up_proj.weight", (I, H), "mat")]
    specs: list[Spec] = [(m + f"experts.{e}.{w}.weight", shape, "mat") for e in range(g.experts)
             for w, shape in (("w1", (Im, H)), ("w2", (H, Im)), ("w3", (Im, H)))]
    specs += [(m + "gate.e_score_correction_bias", (g.experts,), "bias"),
              (m + "gate.weight", (g.experts, H), "router")]
    if S:
        specs += [(m + "shared_experts.down_proj.weight", (H, S * Im), "mat"),
                  (m + "shared_experts.gate_proj.weight", (S * Im, H), "mat"),
                  (m + "shared_experts.up_proj.weight", (S * Im, H), "mat")]
    return specs


def shard_plan(g: Geometry, vocab: int) -> list[list[Spec]]:
    """The tensors of each shard: one shard per layer, then embedding, lm_head and norm."""
    shards = []
    for layer, kind in enumerate(g.layer_types()):
        p = f"model.layers.{layer}."
        mixer = _kda if kind == "linear_attention" else _mla
        specs = [(p + "input_layernorm.weight", (g.hidden,), "norm"),
                 (p + "post_attention_layernorm.weight", (g.hidden,), "norm"),
                 *mixer(g, p + "self_attn."), *_mlp(g, layer, p + "block_sparse_moe.")]
        shards.append(sorted(specs))
    shards.append([("lm_head.weight", (vocab, g.hidden), "mat"),
                   ("model.embed_tokens.weight", (vocab, g.hidden), "embed"),
                   ("model.norm.weight", (g.hidden,), "norm")])
    return shards


def _encoded(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "bf16":
        return to_bf16_bits(values).astype("<u2").tobytes()
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def write_shard(path: Path, specs: list[Spec], tensors: Iterator[np.ndarray], dtype: str) -> int:
    """A safetensors file of ``specs`` whose values ``tensors`` yields in order, written one
    tensor at a time (the header is known from the shapes). Returns its data bytes."""
    st_dtype, _, size = DTYPES[dtype]
    header: dict = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, shape, _ in specs:
        n = size * int(np.prod(shape))
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads its header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for (name, shape, _), values in zip(specs, tensors):
            if values.shape != shape:
                raise ContainerError(f"tensor {name}: drew {values.shape}, planned {shape}")
            f.write(_encoded(values, dtype))
    return at


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def synthesize(out: str | Path, *, geometry: Geometry | None = None, seed: int = 0,
               dtype: str = "bf16", bias_std: float = DEFAULT_BIAS_STD,
               overwrite: bool = False) -> Path:
    """Writes the checkpoint into ``out`` (via a temporary directory renamed at the end).

    Raises:
        ContainerError: ``out`` exists (without ``overwrite``) or ``dtype`` is unknown.
        OSError: a file cannot be written.
    """
    g, out = geometry or Geometry(), Path(out)
    if dtype not in DTYPES:
        raise ContainerError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if out.exists() and not overwrite:
        raise ContainerError(f"{out} exists (pass --overwrite to replace it)")
    ranks = [t for t, _ in sorted(train_ranks(list(CORPUS), g.vocab_merges).items(), key=lambda kv: kv[1])]
    vocab = len(ranks) + len(SPECIALS)
    with staged_dir(out) as tmp:
        cfg = hf_config(g, vocab, dtype)
        _dump(tmp / "config.json", cfg)
        _dump(tmp / "generation_config.json", generation_config(cfg))
        shards = shard_plan(g, vocab)
        weight_map, total = {}, 0
        for i, specs in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            values = (draw(seed, n, shape, kind, bias_std) for n, shape, kind in specs)
            total += write_shard(tmp / name, specs, values, dtype)
            weight_map.update({n: name for n, _, _ in specs})
        params = total // DTYPES[dtype][2]
        _dump(tmp / "model.safetensors.index.json",
              {"metadata": {"total_parameters": params, "total_size": total},
               "weight_map": dict(sorted(weight_map.items()))})
        write_tokenizer(tmp, ranks, SPECIALS)
    return out


def _optional_float(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _add_k3_flags(ap: argparse.ArgumentParser) -> None:
    from waste.tools.synth_k3 import K3Options

    d = K3Options()
    k3 = ap.add_argument_group("--arch k3 (0 or none switches a delta off)")
    k3.add_argument("--q-lora-rank", type=int, default=d.q_lora_rank, help=f"MLA q-LoRA rank (default {d.q_lora_rank})")
    k3.add_argument("--latent", type=int, default=d.latent,
                    help=f"routed_expert_hidden_size: the latent MoE width (default {d.latent})")
    k3.add_argument("--latent-norm", type=int, choices=(0, 1), default=int(d.latent_norm), help="latent_moe_use_norm")
    k3.add_argument("--attn-res-block", type=int, default=d.attn_res_block,
                    help=f"attn_res_block_size (default {d.attn_res_block})")
    k3.add_argument("--situ", type=int, choices=(0, 1), default=int(d.situ), help="hidden_act situ (1) or silu (0)")
    k3.add_argument("--situ-beta", type=float, default=d.situ_beta)
    k3.add_argument("--situ-linear-beta", type=_optional_float, default=d.situ_linear_beta)
    k3.add_argument("--gate-lower-bound", type=_optional_float, default=d.gate_lower_bound,
                    help=f"linear_attn_config.gate_lower_bound (default {d.gate_lower_bound})")
    k3.add_argument("--mla-output-gate", type=int, choices=(0, 1), default=int(d.mla_output_gate))
    k3.add_argument("--full-rank-gate", type=int, choices=(0, 1), default=int(d.full_rank_gate))
    k3.add_argument("--a-log-pad", type=int, default=d.a_log_pad,
                    help="A_log values stored (zero tail); default: the KDA head_dim, as the release ships it")
    k3.add_argument("--moe-layer-freq", type=int, default=d.moe_layer_freq)
    k3.add_argument("--routed-scaling-factor", type=float, default=d.routed_scaling_factor)


def _main_k3(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from waste.tools.synth_k3 import K3Options, synthesize_k3

    geometry = geometry_from_flags(ap, args)
    options = K3Options(q_lora_rank=args.q_lora_rank, latent=args.latent, latent_norm=bool(args.latent_norm),
                        attn_res_block=args.attn_res_block, situ=bool(args.situ), situ_beta=args.situ_beta,
                        situ_linear_beta=args.situ_linear_beta, gate_lower_bound=args.gate_lower_bound,
                        mla_output_gate=bool(args.mla_output_gate), full_rank_gate=bool(args.full_rank_gate),
                        a_log_pad=args.a_log_pad, moe_layer_freq=args.moe_layer_freq,
                        routed_scaling_factor=args.routed_scaling_factor)
    for flag, value in (("--q-lora-rank", args.q_lora_rank), ("--latent", args.latent),
                        ("--attn-res-block", args.attn_res_block), ("--a-log-pad", args.a_log_pad)):
        if value < 0:
            ap.error(f"{flag} must be >= 0, got {value}")
    try:
        path = synthesize_k3(args.out, geometry=geometry, options=options, seed=args.seed, dtype=args.dtype,
                             bias_std=args.bias_std, overwrite=args.overwrite)
    except (ContainerError, OSError) as exc:
        print(f"synth: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


_K3_FLAGS = ("--q-lora-rank", "--latent", "--latent-norm", "--attn-res-block", "--situ", "--situ-beta",
             "--situ-linear-beta", "--gate-lower-bound", "--mla-output-gate", "--full-rank-gate", "--a-log-pad",
             "--moe-layer-freq", "--routed-scaling-factor")


def main(argv: list[str] | None = None) -> int:
    """The command line; prints the directory, or an error and exits 1 (2 for a bad flag)."""
    ap = argparse.ArgumentParser(prog="python -m waste.tools.synth", description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--arch", choices=("kimi_linear", "k3"), default="kimi_linear",
                    help="kimi_linear (transformers' layout) or k3 (the K3 release layout, MXFP4 experts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="tensor dtype (default bf16)")
    ap.add_argument("--bias-std", type=float, default=DEFAULT_BIAS_STD,
                    help=f"spread of e_score_correction_bias: routing skew (default {DEFAULT_BIAS_STD})")
    ap.add_argument("--overwrite", action="store_true")
    add_geometry_flags(ap)
    _add_k3_flags(ap)
    pre, _ = ap.parse_known_args(argv)
    if pre.arch == "k3":  # the geometry flags default to the scaled-down K3
        from waste.tools.synth_k3 import K3_GEOMETRY

        ap.set_defaults(**K3_GEOMETRY)
    args = ap.parse_args(argv)
    if not args.bias_std >= 0:
        ap.error(f"--bias-std must be a number >= 0, got {args.bias_std}")
    if args.arch == "k3":
        return _main_k3(ap, args)
    k3_flags = [a for a in (argv if argv is not None else sys.argv[1:]) if a.split("=")[0] in _K3_FLAGS]
    if k3_flags:
        ap.error(f"{k3_flags[0].split('=')[0]} applies to --arch k3 only")
    geometry = geometry_from_flags(ap, args)
    try:
        path = synthesize(args.out, geometry=geometry, seed=args.seed, dtype=args.dtype,
                          bias_std=args.bias_std, overwrite=args.overwrite)
    except (ContainerError, OSError) as exc:
        print(f"synth: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
