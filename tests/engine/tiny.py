"""Tiny random Kimi-Linear checkpoints from transformers, and their containers.

Weights are re-drawn larger than the default init (so logits have a spread of ~1 and the
comparison is meaningful) and ``e_score_correction_bias`` is random, so selection differs
from weighting (docs/ENGINE.md §7).
"""

from __future__ import annotations

from pathlib import Path

from waste.tools.convert import convert as _convert

BASE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    routed_scaling_factor=2.446, norm_topk_prob=True,
    linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)

# docs/ENGINE.md §7 tiny config.
CONFIG_A = dict(BASE, num_hidden_layers=4,
                layer_types=["linear_attention"] * 3 + ["full_attention"],
                mlp_layer_types=["dense"] + ["sparse"] * 3)

# 8 layers, MLA at 1-based 4 and 8, q-LoRA, top-1, no shared experts, other head counts,
# dims that are multiples of 32 (so the int8 g32 container can hold every matrix).
CONFIG_B = dict(BASE, num_hidden_layers=8,
                layer_types=["full_attention" if i in (3, 7) else "linear_attention" for i in range(8)],
                mlp_layer_types=["dense", "dense"] + ["sparse"] * 6,
                q_lora_rank=32, num_attention_heads=2, num_key_value_heads=2,
                qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                linear_num_heads=2, linear_head_dim=32, linear_conv_kernel_dim=3,
                num_experts_per_tok=1, n_shared_experts=0, norm_topk_prob=False)

# Odd widths (tails of the 16-lane kernels), top-3, two shared experts, MLA first.
CONFIG_C = dict(BASE, num_hidden_layers=3, hidden_size=72, intermediate_size=100,
                moe_intermediate_size=24, vocab_size=300,
                layer_types=["full_attention", "linear_attention", "linear_attention"],
                mlp_layer_types=["sparse", "dense", "sparse"],
                num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=20,
                qk_nope_head_dim=12, qk_rope_head_dim=6, v_head_dim=10,
                linear_num_heads=3, linear_head_dim=12, linear_conv_kernel_dim=2,
                num_local_experts=6, num_experts_per_tok=3, n_shared_experts=2)


def make_checkpoint(torch_stack, out: Path, config: dict, seed: int):
    """Builds, re-initialises and saves a model; returns (model, hf_dir)."""
    torch, transformers = torch_stack
    torch.manual_seed(seed)
    cfg = transformers.KimiLinearConfig(**config)
    model = transformers.KimiLinearForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.12 if p.shape[-1] <= 64 else 0.08)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    model.save_pretrained(out)
    write_tokenizer(Path(out), config["vocab_size"])
    return model, out


SPECIALS = ("[BOS]", "[EOS]", "<|im_end|>", "<|media_pad|>")


def synthetic_ranks(n_base: int) -> list[bytes]:
    """All 256 bytes, then multi-byte UTF-8 merges, then letter pairs: ``n_base`` tokens."""
    ranks = [bytes([b]) for b in range(256)]
    ranks += [b"\xc3\xa9", b"\xe4\xb8", b"\xe4\xb8\xad", b"\xf0\x9f", b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80"]
    letters = b" abcdefghijklmnopqrstuvwxyz"
    for a in letters:
        for b in letters:
            if len(ranks) < n_base:
                ranks.append(bytes([a, b]))
    return ranks[:n_base]


def write_tokenizer(hf_dir: Path, vocab: int) -> None:
    """A Moonshot-style ``tiktoken.model`` + ``tokenizer_config.json`` covering the vocab."""
    import base64
    import json

    n_base = vocab - len(SPECIALS)
    lines = [base64.b64encode(t).decode() + f" {i}" for i, t in enumerate(synthetic_ranks(n_base))]
    (hf_dir / "tiktoken.model").write_text("\n".join(lines) + "\n")
    dec = {str(n_base + i): {"content": s, "special": True} for i, s in enumerate(SPECIALS)}
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": dec}))


def convert(hf_dir: Path, out: Path, dtype: str) -> Path:
    if out.exists():
        return out
    return _convert(hf_dir, out, trunk=dtype, experts=dtype, group=32)

# Like CONFIG_A with every matrix width a multiple of 32, so int8 g32 holds them all, and
# every expert selected: with random weights the router sits near ties, and rounding that
# flips one choice swaps in an unrelated expert (a jump of ~2 in the logits), which would
# measure the random router rather than the weight format.
CONFIG_Q = dict(CONFIG_A, linear_head_dim=32, num_local_experts=4, num_experts_per_tok=4)


# Every matrix width a multiple of 128 (KDA 1 head of 128, MLA kv rank 128, 2 heads of v 64),
# so an int8 group-128 container can hold every matrix.
CONFIG_G128 = dict(BASE, num_hidden_layers=4, hidden_size=128, intermediate_size=128,
                   moe_intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
                   kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=64,
                   num_local_experts=4, num_experts_per_tok=4, linear_num_heads=1,
                   linear_head_dim=128, layer_types=["linear_attention"] * 3 + ["full_attention"],
                   mlp_layer_types=["dense"] + ["sparse"] * 3)


def dequantized(values, dtype: str, group: int = 32):
    """What the converter's ``dtype`` (int8: at ``group``) makes of an f32 matrix, back in
    f32 (numpy)."""
    import numpy as np

    from waste.tools.container import quantize_int8, to_bf16_bits

    w = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "bf16":
        return (to_bf16_bits(w).astype(np.uint32) << 16).view(np.float32)
    if dtype == "int8":
        rows, cols = w.shape
        blocks = quantize_int8(w, group).reshape(rows, cols // group, group + 2)
        scale = blocks[..., :2].copy().view(np.float16).astype(np.float32)
        q = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
        return (q * scale).reshape(rows, cols)
    return w


def quantized_twin(torch_stack, hf_dir: Path, dtype: str, group: int = 32):
    """The checkpoint's model with every matrix the converter quantizes replaced by its
    dequantized value (router, norms, conv taps, A_log and dt_bias stay f32)."""
    torch, transformers = torch_stack
    model = transformers.KimiLinearForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight") or p.numel() == 0:
                continue
            if p.dim() == 2:
                p.copy_(torch.from_numpy(dequantized(p.numpy(), dtype, group)))
            elif p.dim() == 3 and ".experts." in name:
                for e in range(p.shape[0]):
                    p[e].copy_(torch.from_numpy(dequantized(p[e].numpy(), dtype, group)))
    return model


def write_safetensors(path: Path, tensors: dict) -> None:
    """An F32 safetensors file of ``tensors`` (name → array), names sorted (numpy only)."""
    import json
    import struct

    import numpy as np

    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], "<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
