"""A deterministic synthetic Kimi K3 checkpoint in the release layout (``synth --arch k3``).

What it writes (docs/DECISIONS.md records where the names are ours, the release itself being
unavailable): ``config.json`` with ``model_type: "kimi_k3"``, the text model's Moonshot-style
config under ``text_config`` (``model_type: "kimi_linear"``, ``linear_attn_config`` with
1-based ``kda_layers``, ``first_k_dense_replace``/``moe_layer_freq``, and every K3 key:
``hidden_act: "situ"``, ``routed_expert_hidden_size``, ``attn_res_block_size``,
``q_lora_rank``, ``mla_use_output_gate``, ``use_full_rank_gate``, ``gate_lower_bound``), a
compressed-tensors ``quantization_config``; tensors under ``language_model.`` in one
safetensors shard per layer plus the final shards and ``model.safetensors.index.json``; the
routed experts in compressed-tensors' ``mxfp4-pack-quantized`` form (``weight_packed`` U8 +
``weight_scale`` U8), packed by compressed-tensors itself; the rest bf16 (or f32); ``A_log``
zero-padded to ``head_dim`` as the release ships it; a few ``vision_tower.*`` /
``mm_projector.*`` tensors (a converter skips them); ``tiktoken.model`` +
``tokenizer_config.json`` whose specials are the XTML markers.

Every tensor is drawn from its own seeded stream (waste.tools.make_container.random_tensor),
so the same flags give byte-identical files, and written one at a time.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from waste.tools.container import ContainerError, TensorSpec, to_bf16_bits
from waste.tools.hf_files import draw, staged_dir, write_tokenizer
from waste.tools.make_container import XTML_SPECIALS, Geometry, random_tensor

MXFP4_FORMAT = "mxfp4-pack-quantized"
SPECIALS = ("[BOS]", "[EOS]") + XTML_SPECIALS + ("[PAD]",)
ST_DTYPES = {"f32": ("F32", 4), "bf16": ("BF16", 2)}


@attrs.frozen(kw_only=True)
class K3Options:
    """The K3 deltas on top of a ``Geometry`` (0 / None switches one off)."""

    q_lora_rank: int = 64
    latent: int = 64                   # routed_expert_hidden_size (0: experts read x)
    latent_norm: bool = True           # latent_moe_use_norm
    attn_res_block: int = 3            # attn_res_block_size (0: plain residual)
    situ: bool = True                  # hidden_act "situ" (else "silu")
    situ_beta: float = 4.0
    situ_linear_beta: float | None = 25.0
    gate_lower_bound: float | None = -5.0
    mla_output_gate: bool = True
    full_rank_gate: bool = True
    a_log_pad: int = 0                 # A_log stored flat with this many values (0: head_dim)
    moe_layer_freq: int = 1
    routed_scaling_factor: float = 1.0


# A scaled-down K3 (93 layers of hidden 7168 → 8 of 128); every delta on.
K3_GEOMETRY = dict(layers=8, hidden=128, intermediate=256, moe_intermediate=64,
                   experts=16, top_k=4, shared=2, dense=0, kda_heads=2, kda_head_dim=32, conv_kernel=4,
                   mla_heads=2, kv_lora_rank=64, qk_nope=32, qk_rope=16, v_head=32)


def moe_layers(g: Geometry, k: K3Options) -> list[bool]:
    """K3's rule: MoE iff ℓ ≥ first_k_dense_replace and ℓ mod moe_layer_freq = 0."""
    return [i >= g.dense and i % k.moe_layer_freq == 0 for i in range(g.layers)]


def text_config(g: Geometry, k: K3Options, vocab: int) -> dict:
    """The Moonshot-style K3 text config (what ``text_config`` holds)."""
    ids = {s: vocab - len(SPECIALS) + i for i, s in enumerate(SPECIALS)}
    kinds = g.layer_types()
    cfg: dict[str, Any] = {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
        "vocab_size": vocab, "hidden_size": g.hidden, "num_hidden_layers": g.layers,
        "intermediate_size": g.intermediate, "moe_intermediate_size": g.moe_intermediate,
        "num_experts": g.experts, "num_experts_per_token": g.top_k, "num_shared_experts": g.shared,
        "first_k_dense_replace": g.dense, "moe_layer_freq": k.moe_layer_freq, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "routed_scaling_factor": k.routed_scaling_factor,
        "num_expert_group": 1, "topk_group": 1,
        "num_attention_heads": g.mla_heads, "num_key_value_heads": g.mla_heads,
        "kv_lora_rank": g.kv_lora_rank, "q_lora_rank": k.q_lora_rank or None,
        "qk_nope_head_dim": g.qk_nope, "qk_rope_head_dim": g.qk_rope, "v_head_dim": g.v_head,
        "linear_attn_config": {
            "kda_layers": [i + 1 for i, t in enumerate(kinds) if t == "linear_attention"],
            "full_attn_layers": [i + 1 for i, t in enumerate(kinds) if t == "full_attention"],
            "num_heads": g.kda_heads, "head_dim": g.kda_head_dim, "short_conv_kernel_size": g.conv_kernel},
        "hidden_act": "situ" if k.situ else "silu",
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "model_max_length": 1048576,
        "bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"], "pad_token_id": ids["[PAD]"],
        "mla_use_output_gate": k.mla_output_gate, "use_full_rank_gate": k.full_rank_gate,
    }
    if k.situ:
        cfg["activation_situ_beta"] = k.situ_beta
        cfg["activation_situ_linear_beta"] = k.situ_linear_beta
    if k.gate_lower_bound is not None:
        cfg["linear_attn_config"]["gate_lower_bound"] = k.gate_lower_bound
    if k.latent:
        cfg["routed_expert_hidden_size"] = k.latent
        cfg["latent_moe_use_norm"] = k.latent_norm
    if k.attn_res_block:
        cfg["attn_res_block_size"] = k.attn_res_block
    return cfg


def quantization_config() -> dict:
    """compressed-tensors' config for MXFP4 routed experts (everything else unquantized)."""
    return {"quant_method": "compressed-tensors", "format": MXFP4_FORMAT, "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "format": MXFP4_FORMAT,
                "targets": [r"re:.*block_sparse_moe\.experts\.\d+\.w[123]$"],
                "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                            "symmetric": True, "dynamic": False, "scale_dtype": "torch.uint8"},
                "input_activations": None, "output_activations": None}},
            "ignore": ["lm_head", r"re:vision_tower.*", r"re:mm_projector.*"]}


def release_config(g: Geometry, k: K3Options, vocab: int) -> dict:
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "text_config": text_config(g, k, vocab),
            "vision_config": {"model_type": "moonvit", "hidden_size": 16, "patch_size": 2},
            "quantization_config": quantization_config(), "tie_word_embeddings": False}


# ==== the tensor plan ====================================================================
# (HF name under language_model., shape, kind): kind is random_tensor's, or "expert" (MXFP4).
Spec = TensorSpec


def _kda(g: Geometry, k: K3Options, a: str) -> list[Spec]:
    H, Hk, d, K = g.hidden, g.kda_heads, g.kda_head_dim, g.conv_kernel
    hd = Hk * d
    specs: list[Spec] = [(a + f"{x}_proj.weight", (hd, H), "mat") for x in "qkv"]
    specs += [(a + f"{x}_conv1d.weight", (hd, 1, K), "conv") for x in "qkv"]
    specs += [(a + "A_log", (k.a_log_pad or d,), "a_log"), (a + "dt_bias", (hd,), "dt_bias"),
              (a + "f_a_proj.weight", (d, H), "mat"), (a + "f_b_proj.weight", (hd, d), "mat"),
              (a + "b_proj.weight", (Hk, H), "mat"), (a + "o_norm.weight", (d,), "norm"),
              (a + "o_proj.weight", (H, hd), "mat")]
    if k.full_rank_gate:
        specs.append((a + "g_proj.weight", (hd, H), "mat"))
    else:
        specs += [(a + "g_a_proj.weight", (d, H), "mat"), (a + "g_b_proj.weight", (hd, d), "mat")]
    return specs


def _mla(g: Geometry, k: K3Options, a: str) -> list[Spec]:
    H, nh, r = g.hidden, g.mla_heads, g.kv_lora_rank
    qh = nh * (g.qk_nope + g.qk_rope)
    specs: list[Spec]
    if k.q_lora_rank:
        specs = [(a + "q_a_proj.weight", (k.q_lora_rank, H), "mat"), (a + "q_a_layernorm.weight", (k.q_lora_rank,), "norm"),
                 (a + "q_b_proj.weight", (qh, k.q_lora_rank), "mat")]
    else:
        specs = [(a + "q_proj.weight", (qh, H), "mat")]
    specs += [(a + "kv_a_proj_with_mqa.weight", (r + g.qk_rope, H), "mat"), (a + "kv_a_layernorm.weight", (r,), "norm"),
              (a + "kv_b_proj.weight", (nh * (g.qk_nope + g.v_head), r), "mat"),
              (a + "o_proj.weight", (H, nh * g.v_head), "mat")]
    if k.mla_output_gate:
        specs.append((a + "g_proj.weight", (nh * g.v_head, H), "mat"))
    return specs


def _ffn(g: Geometry, k: K3Options, p: str, moe: bool) -> list[Spec]:
    H = g.hidden
    if not moe:
        I = g.intermediate
        return [(p + "mlp.gate_proj.weight", (I, H), "mat"), (p + "mlp.up_proj.weight", (I, H), "mat"),
                (p + "mlp.down_proj.weight", (H, I), "mat")]
    m, Im, S, d_e = p + "block_sparse_moe.", g.moe_intermediate, g.shared, k.latent or H
    specs: list[Spec] = [(m + "gate.weight", (g.experts, H), "mat"), (m + "gate.e_score_correction_bias", (g.experts,), "bias")]
    for e in range(g.experts):
        specs += [(m + f"experts.{e}.w1.weight", (Im, d_e), "expert"), (m + f"experts.{e}.w2.weight", (d_e, Im), "expert"),
                  (m + f"experts.{e}.w3.weight", (Im, d_e), "expert")]
    if S:
        specs += [(m + "shared_experts.gate_proj.weight", (S * Im, H), "mat"),
                  (m + "shared_experts.up_proj.weight", (S * Im, H), "mat"),
                  (m + "shared_experts.down_proj.weight", (H, S * Im), "mat")]
    if k.latent:
        specs += [(m + "routed_expert_down_proj.weight", (k.latent, H), "mat"),
                  (m + "routed_expert_up_proj.weight", (H, k.latent), "mat")]
        if k.latent_norm:
            specs.append((m + "routed_expert_norm.weight", (k.latent,), "norm"))
    return specs


def shard_plan(g: Geometry, k: K3Options, vocab: int) -> list[list[Spec]]:
    """One shard per layer, then embedding/head/norms, then the vision tower."""
    moe = moe_layers(g, k)
    shards: list[list[Spec]] = []
    for layer, kind in enumerate(g.layer_types()):
        p = f"model.layers.{layer}."
        specs: list[Spec] = [(p + "input_layernorm.weight", (g.hidden,), "norm"),
                 (p + "post_attention_layernorm.weight", (g.hidden,), "norm")]
        specs += (_kda if kind == "linear_attention" else _mla)(g, k, p + "self_attn.")
        specs += _ffn(g, k, p, moe[layer])
        if k.attn_res_block:
            specs += [(p + "self_attention_res_norm.weight", (g.hidden,), "norm"),
                      (p + "self_attention_res_proj.weight", (1, g.hidden), "mat"),
                      (p + "mlp_res_norm.weight", (g.hidden,), "norm"),
                      (p + "mlp_res_proj.weight", (1, g.hidden), "mat")]
        shards.append(sorted(specs))
    last: list[Spec] = [("lm_head.weight", (vocab, g.hidden), "mat"), ("model.embed_tokens.weight", (vocab, g.hidden), "embed"),
            ("model.norm.weight", (g.hidden,), "norm")]
    if k.attn_res_block:
        last += [("model.output_attn_res_norm.weight", (g.hidden,), "norm"),
                 ("model.output_attn_res_proj.weight", (1, g.hidden), "mat")]
    shards.append(sorted(last))
    return shards


VISION: list[Spec] = [("vision_tower.patch_embed.proj.weight", (16, 3, 2, 2), "mat"),
          ("vision_tower.encoder.blocks.0.norm0.weight", (16,), "norm"),
          ("mm_projector.proj.0.weight", (16, 64), "mat")]


def check(g: Geometry, k: K3Options) -> None:
    """Refuses, naming the flag, what the release layout cannot hold."""
    d_e = k.latent or g.hidden
    for flag, cols in (("--latent" if k.latent else "--hidden", d_e), ("--moe-intermediate", g.moe_intermediate)):
        if cols % 32:
            raise ContainerError(f"{flag} {cols}: MXFP4 experts need input widths that are multiples of 32")
    if k.a_log_pad and k.a_log_pad < g.kda_heads:
        raise ContainerError(f"--a-log-pad {k.a_log_pad} is below --kda-heads {g.kda_heads}")
    if k.moe_layer_freq < 1:
        raise ContainerError(f"--moe-layer-freq must be >= 1, got {k.moe_layer_freq}")
    if not any(moe_layers(g, k)):
        raise ContainerError("no MoE layer: lower --dense or --moe-layer-freq")


# ==== values =============================================================================
def _mxfp4(torch, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """compressed-tensors' own MXFP4 compressor on one matrix: (weight_packed, weight_scale)."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    t = torch.from_numpy(values)
    rows, cols = t.shape
    grp = t.reshape(rows, cols // 32, 32)
    scale, zero = calculate_qparams(grp.amin(-1), grp.amax(-1), scheme.weights)
    out = MXFP4PackedCompressor.compress({"weight": t, "weight_scale": scale, "weight_zero_point": zero}, scheme)
    return out["weight_packed"].numpy(), out["weight_scale"].numpy()


def _a_log(seed: int, name: str, heads: int, n: int) -> np.ndarray:
    a = np.zeros(n, np.float32)
    a[:heads] = random_tensor(seed, name, (heads,), "a_log")
    return a


def _entries(specs: list[Spec], seed: int, g: Geometry, bias_std: float, torch):
    """(name, st dtype, shape, bytes-or-f32 array) for every tensor of a shard, in order."""
    for name, shape, kind in specs:
        if kind == "expert":
            packed, scale = _mxfp4(torch, random_tensor(seed, name, shape, "mat"))
            base = name[: -len(".weight")]
            yield base + ".weight_packed", "U8", packed.shape, packed.tobytes()
            yield base + ".weight_scale", "U8", scale.shape, scale.tobytes()
        elif kind == "a_log":
            yield name, None, shape, _a_log(seed, name, g.kda_heads, shape[0])
        else:
            yield name, None, shape, draw(seed, name, shape, kind, bias_std)


def _write_shard(path: Path, entries: list, dtype: str) -> int:
    """A safetensors file of (name, st dtype or None = the float dtype, shape, payload)."""
    st_dtype, size = ST_DTYPES[dtype]
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, at = [], 0
    for name, kind, shape, payload in entries:
        if kind is None:
            payload = (to_bf16_bits(payload).astype("<u2") if dtype == "bf16" else payload.astype("<f4")).tobytes()
            kind = st_dtype
        header["language_model." + name if not name.startswith(("vision_tower.", "mm_projector."))
               else name] = {"dtype": kind, "shape": list(shape), "data_offsets": [at, at + len(payload)]}
        blobs.append(payload)
        at += len(payload)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            f.write(b)
    return at


def synthesize_k3(out: str | Path, *, geometry: Geometry, options: K3Options, seed: int = 0, dtype: str = "bf16",
                  bias_std: float = 0.5, overwrite: bool = False) -> Path:
    """Writes the K3 release-layout checkpoint into ``out`` (a temporary directory renamed).

    Raises:
        ContainerError: ``out`` exists (without ``overwrite``), a flag the layout cannot hold,
            or compressed-tensors (the MXFP4 packer) is not installed.
        OSError: a file cannot be written.
    """
    from waste.tools.bpe_train import train_ranks
    from waste.tools.make_container import CORPUS

    g, k, out = geometry, options, Path(out)
    if dtype not in ST_DTYPES:
        raise ContainerError(f"--dtype must be one of {', '.join(ST_DTYPES)}, got {dtype!r}")
    check(g, k)
    if out.exists() and not overwrite:
        raise ContainerError(f"{out} exists (pass --overwrite to replace it)")
    try:
        import torch
        import compressed_tensors  # noqa: F401
    except ImportError as exc:
        raise ContainerError(f"synth --arch k3 packs the MXFP4 experts with compressed-tensors' own compressor: "
                             f"{exc.name} is not installed (pip install -e '.[oracle]')") from None
    ranks = [t for t, _ in sorted(train_ranks(list(CORPUS), g.vocab_merges).items(), key=lambda kv: kv[1])]
    vocab = len(ranks) + len(SPECIALS)
    with staged_dir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(release_config(g, k, vocab), indent=2, sort_keys=True) + "\n")
        shards = shard_plan(g, k, vocab) + [VISION]
        weight_map, total = {}, 0
        for i, specs in enumerate(shards, 1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            entries = list(_entries(specs, seed, g, bias_std, torch))
            total += _write_shard(tmp / file, entries, dtype)
            for name, *_ in entries:
                full = name if name.startswith(("vision_tower.", "mm_projector.")) else "language_model." + name
                weight_map[full] = file
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
        write_tokenizer(tmp, ranks, SPECIALS)
    return out
