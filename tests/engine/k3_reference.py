"""A PyTorch reference of the Kimi K3 text model (docs/ENGINE.md §4.2), the oracle libwaste's
K3 deltas are held to.

It is built on transformers' ``KimiLinear*`` modules where they fit — the KDA mixer
(``KimiLinearDeltaAttention``: projections, short conv, L2 norms, the chunked delta rule,
the gated ``o_norm``), MLA (``KimiLinearAttention``, q-LoRA included), the sigmoid router
(``KimiLinearTopkRouter``) and ``KimiLinearRMSNorm`` — and adds our own code for what they
lack: SiTU in every GLU, the latent MoE, attention residuals, the MLA sigmoid output gate,
the full-rank KDA gate, the lower-bound decay and per-head ``A_log`` of any stored shape.

Each delta is switched on by its own config key (a transformers-style text config dict):
``hidden_act: "situ"`` (+ ``activation_situ_beta``, ``activation_situ_linear_beta``),
``routed_expert_hidden_size`` (+ ``latent_moe_use_norm``), ``attn_res_block_size``,
``q_lora_rank``, ``mla_use_output_gate``, ``use_full_rank_gate``,
``linear_attn_config.gate_lower_bound``.

``K3Reference(cfg)`` runs a whole sequence (no cache: every delta is causal per position, so
the logits of a prefix are those of a prefill of that prefix). ``save_checkpoint`` writes a
flat checkpoint — config.json + model.safetensors under the HF names of docs/FORMAT.md §3.2 —
that ``waste.tools.convert`` reads; ``A_log`` can be written in any of its shipped shapes.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import KimiLinearConfig
from transformers.models.kimi_linear.modeling_kimi_linear import (
    KimiLinearAttention,
    KimiLinearDeltaAttention,
    KimiLinearRMSNorm,
    KimiLinearTopkRouter,
)

from tests.engine.tiny import write_safetensors


# ==== SiTU GLU ==========================================================================
def situ(g: torch.Tensor, u: torch.Tensor, beta: float, beta_l: float | None) -> torch.Tensor:
    """act(g, u) = β·tanh(g/β)·σ(g) · β_l·tanh(u/β_l) (u unchanged without β_l), in f32."""
    g, u = g.float(), u.float()
    left = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    return left * (u if beta_l is None else beta_l * torch.tanh(u / beta_l))


class GLU(nn.Module):
    """down(act(gate x, up x)); SiLU·u or SiTU by ``cfg["hidden_act"]``. ``names`` are the
    HF names of (gate, up, down): gate_proj/up_proj/down_proj, or w1/w3/w2 for experts."""

    def __init__(self, cfg: dict, d_in: int, width: int, names=("gate_proj", "up_proj", "down_proj")) -> None:
        super().__init__()
        self.names = names
        for n, shape in zip(names, ((width, d_in), (width, d_in), (d_in, width))):
            setattr(self, n, nn.Linear(shape[1], shape[0], bias=False))
        self.act = cfg.get("hidden_act", "silu")
        self.beta = float(cfg.get("activation_situ_beta") or 1.0)
        self.beta_l = cfg.get("activation_situ_linear_beta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self.names)
        g, u = gate(x), up(x)
        h = situ(g, u, self.beta, self.beta_l) if self.act == "situ" else F.silu(g) * u
        return down(h)


# ==== KDA ===============================================================================
class LowerBoundForgetGate(nn.Module):
    """g = λ·σ(exp(A_log[h])·a), a = f_b(f_a x) + dt_bias: no softplus, not a clamp (§4.2.6)."""

    def __init__(self, cfg: dict, lower_bound: float) -> None:
        super().__init__()
        H, Hk, d = cfg["hidden_size"], cfg["linear_num_heads"], cfg["linear_head_dim"]
        self.head_dim, self.lower_bound = d, lower_bound
        self.f_a_proj = nn.Linear(H, d, bias=False)
        self.f_b_proj = nn.Linear(d, Hk * d, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(Hk * d))
        self.A_log = nn.Parameter(torch.zeros(1, 1, Hk, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = (self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()).view(*x.shape[:2], -1, self.head_dim)
        return self.lower_bound * torch.sigmoid(torch.exp(self.A_log.float()) * a)


def kda(cfg: dict, tcfg: KimiLinearConfig, layer: int) -> KimiLinearDeltaAttention:
    """transformers' KDA mixer with the K3 options patched in."""
    m = KimiLinearDeltaAttention(tcfg, layer)
    m.activation = "silu"  # the short conv stays SiLU under SiTU (§4.2.1)
    lb = (cfg.get("linear_attn_config") or {}).get("gate_lower_bound")
    # The K3 variants replace transformers' submodules (nn.Module takes any Module there),
    # so they are not of the types transformers declares.
    if lb is not None:
        m.forget_gate = LowerBoundForgetGate(cfg, float(lb))  # type: ignore[assignment]
    if cfg.get("use_full_rank_gate"):
        # g_b_proj(g_a_proj(x)) with g_a = identity: g_b_proj is the full-rank g_proj [Hd, H].
        m.g_a_proj = nn.Identity()  # type: ignore[assignment]
        m.g_b_proj = nn.Linear(cfg["hidden_size"], m.qkv_dim, bias=False)
    return m


# ==== MLA ===============================================================================
class MLA(nn.Module):
    """transformers' MLA (NoPE, q-LoRA) with the optional sigmoid output gate on the
    concatenated head outputs before ``o_proj`` (§4.2.4)."""

    def __init__(self, cfg: dict, tcfg: KimiLinearConfig, layer: int) -> None:
        super().__init__()
        self.attn = KimiLinearAttention(tcfg, layer)
        self.o_proj = self.attn.o_proj
        self.attn.o_proj = nn.Identity()  # type: ignore[assignment]  # o_proj runs after the gate
        self.g_proj = None
        if cfg.get("mla_use_output_gate"):
            self.g_proj = nn.Linear(cfg["hidden_size"], cfg["num_attention_heads"] * cfg["v_head_dim"], bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        o, _ = self.attn(x, attention_mask=mask)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


# ==== MoE ===============================================================================
class MoE(nn.Module):
    """Router on x; experts on z = down(x) when latent (width Rz), their weighted sum
    (ascending expert id) optionally RMS-normed, then up(·); shared experts on x (§4.2.2)."""

    def __init__(self, cfg: dict, tcfg: KimiLinearConfig) -> None:
        super().__init__()
        H, I, E = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_local_experts"]
        self.rz = cfg.get("routed_expert_hidden_size") or 0
        d_e = self.rz or H
        self.gate = KimiLinearTopkRouter(tcfg)
        # Moonshot's K3 class renormalises only when k > 1 (docs/DECISIONS.md).
        # Moonshot's ``moe_renormalize`` applies only when k > 1; transformers' ``norm_topk_prob``
        # at any k (docs/DECISIONS.md).
        if "moe_renormalize" in cfg:
            self.gate.norm_topk_prob = bool(cfg["moe_renormalize"]) and cfg["num_experts_per_tok"] > 1
        self.experts = nn.ModuleList(GLU(cfg, d_e, I, ("w1", "w3", "w2")) for _ in range(E))
        S = cfg.get("n_shared_experts") or 0
        self.shared_experts = GLU(cfg, H, I * S) if S else None
        if self.rz:
            self.routed_expert_down_proj = nn.Linear(H, self.rz, bias=False)
            self.routed_expert_up_proj = nn.Linear(self.rz, H, bias=False)
            self.routed_expert_norm = (KimiLinearRMSNorm(self.rz, eps=cfg.get("rms_norm_eps", 1e-5))
                                       if cfg.get("latent_moe_use_norm") else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        _, w, idx = self.gate(flat)
        z = self.routed_expert_down_proj(flat) if self.rz else flat
        acc = torch.zeros_like(z)
        for e in range(len(self.experts)):
            rows, slot = torch.where(idx == e)
            if len(rows):
                acc[rows] += self.experts[e](z[rows]) * w[rows, slot, None]
        if self.rz:
            if self.routed_expert_norm is not None:
                acc = self.routed_expert_norm(acc)
            acc = self.routed_expert_up_proj(acc)
        if self.shared_experts is not None:
            acc = acc + self.shared_experts(flat)
        return acc.view(shape)


# ==== attention residuals ===============================================================
class ResMix(nn.Module):
    """Mix(P, 𝔅) = Σ softmax_v(proj(RMSNorm(v; norm)))·v over v ∈ [𝔅…, P], with the
    unnormalised v (§4.2.3): the norm only enters the score."""

    def __init__(self, H: int, eps: float) -> None:
        super().__init__()
        self.norm = KimiLinearRMSNorm(H, eps=eps)
        self.proj = nn.Linear(H, 1, bias=False)

    def forward(self, p: torch.Tensor, blocks: list[torch.Tensor]) -> torch.Tensor:
        v = torch.stack([*blocks, p]).float()                 # [n, B, T, H]
        scores = self.proj(self.norm(v)).squeeze(-1)           # [n, B, T]
        return (torch.softmax(scores, dim=0)[..., None] * v).sum(0)


# ==== the model =========================================================================
def transformers_config(cfg: dict) -> KimiLinearConfig:
    """The KimiLinearConfig for transformers' modules: SiLU (they have no SiTU; our GLUs and
    the conv override it) and eager attention."""
    keep = {k: v for k, v in cfg.items() if k not in ("hidden_act",)}
    t = KimiLinearConfig(**keep, hidden_act="silu")
    t._attn_implementation = "eager"
    return t


class Layer(nn.Module):
    def __init__(self, cfg: dict, tcfg: KimiLinearConfig, layer: int) -> None:
        super().__init__()
        H, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-5)
        # KimiLinearConfig fills both lists in when they are not given.
        assert tcfg.layer_types is not None and tcfg.mlp_layer_types is not None
        self.is_mla = tcfg.layer_types[layer] == "full_attention"
        self.self_attn = MLA(cfg, tcfg, layer) if self.is_mla else kda(cfg, tcfg, layer)
        self.is_moe = tcfg.mlp_layer_types[layer] == "sparse"
        if self.is_moe:
            self.block_sparse_moe = MoE(cfg, tcfg)
        else:
            self.mlp = GLU(cfg, H, cfg["intermediate_size"])
        self.input_layernorm = KimiLinearRMSNorm(H, eps=eps)
        self.post_attention_layernorm = KimiLinearRMSNorm(H, eps=eps)
        if cfg.get("attn_res_block_size"):
            self.self_attention_res = ResMix(H, eps)
            self.mlp_res = ResMix(H, eps)

    def attn(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        return self.self_attn(h, mask) if self.is_mla else self.self_attn(h)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        h = self.post_attention_layernorm(x)
        return self.block_sparse_moe(h) if self.is_moe else self.mlp(h)


class K3Reference(nn.Module):
    """The K3 text model (or Kimi-Linear with any subset of the deltas): ``logits(ids)``."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        tcfg = transformers_config(cfg)
        self.tcfg = tcfg
        H = cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], H)
        self.layers = nn.ModuleList(Layer(cfg, tcfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = KimiLinearRMSNorm(H, eps=cfg.get("rms_norm_eps", 1e-5))
        self.lm_head = nn.Linear(H, cfg["vocab_size"], bias=False)
        self.block = cfg.get("attn_res_block_size") or 0
        if self.block:
            self.output_attn_res = ResMix(H, cfg.get("rms_norm_eps", 1e-5))

    @torch.no_grad()
    def logits(self, ids: list[int]) -> torch.Tensor:
        """[T, V] logits at every position of ``ids`` (one sequence)."""
        x = self.embed_tokens(torch.tensor([ids]))
        T = len(ids)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        layers = cast("list[Layer]", list(self.layers))  # the ModuleList holds Layers only
        if not self.block:
            for layer in layers:
                x = x + layer.attn(x, mask)
                x = x + layer.ffn(x)
            h = x
        else:
            p = x
            blocks: list[torch.Tensor] = []
            for i, layer in enumerate(layers):
                xin = layer.self_attention_res(p, blocks) if blocks else p
                if i % self.block == 0:
                    blocks.append(p)
                    p = torch.zeros_like(p)
                p = p + layer.attn(xin, mask)
                p = p + layer.ffn(layer.mlp_res(p, blocks))
            h = self.output_attn_res(p, blocks)
        return self.lm_head(self.norm(h))[0].float()


# ==== random init and the checkpoint ====================================================
def randomise(model: K3Reference, seed: int) -> None:
    """Weights with a logit spread of ~1: norms near 1, matrices N(0, 0.12 / 0.08), A_log
    log U(1, 16), dt_bias small, a random router bias (so selection differs from weighting)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g) - 1.0)
            elif "norm" in name and p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("res.proj.weight"):  # score std ~2: a peaked but not one-hot mix
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / math.sqrt(p.shape[-1])))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.12 if p.shape[-1] <= 64 else 0.08))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


_RENAMES = [
    (r"^embed_tokens\.", "model.embed_tokens."),
    (r"^norm\.", "model.norm."),
    (r"^output_attn_res\.(norm|proj)\.", r"model.output_attn_res_\1."),
    (r"^layers\.", "model.layers."),
    (r"\.self_attention_res\.(norm|proj)\.", r".self_attention_res_\1."),
    (r"\.mlp_res\.(norm|proj)\.", r".mlp_res_\1."),
    (r"\.self_attn\.forget_gate\.", ".self_attn."),
    (r"\.self_attn\.attn\.", ".self_attn."),
]


def hf_state_dict(model: K3Reference, a_log_shape: str = "1,1,H,1") -> dict:
    """name → f32 numpy array under the HF names of docs/FORMAT.md §3.2 (Moonshot's layout:
    separate q/k/v conv taps, per-expert w1/w3/w2). ``a_log_shape``: "1,1,H,1", "H", or
    "pad:N" (a flat vector of N ≥ H with a zero tail, as the K3 release ships it)."""
    out = {}
    Hk, d = model.cfg.get("linear_num_heads"), model.cfg.get("linear_head_dim")
    for name, t in list(model.state_dict().items()):
        for pat, rep in _RENAMES:
            name = re.sub(pat, rep, name)
        a = t.detach().float().numpy()
        if name.endswith(".self_attn.conv1d.weight"):
            assert Hk is not None and d is not None  # a KDA layer's config has both
            for part, x in zip("qkv", a.reshape(3, Hk * d, 1, -1)):
                out[name.replace("conv1d", f"{part}_conv1d")] = x
            continue
        if model.cfg.get("use_full_rank_gate") and name.endswith(".self_attn.g_b_proj.weight"):
            name = name.replace("g_b_proj", "g_proj")
        if name.endswith(".self_attn.A_log"):
            flat = a.reshape(-1)
            if a_log_shape == "H":
                a = flat
            elif a_log_shape.startswith("pad:"):
                a = np.zeros(int(a_log_shape[4:]), "f4")
                a[: flat.size] = flat
        out[name] = a
    return out


def save_checkpoint(model: K3Reference, out: Path, a_log_shape: str = "1,1,H,1") -> Path:
    """A flat checkpoint: ``config.json`` (the text config, ``model_type`` kimi_linear) and
    ``model.safetensors`` (F32)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"model_type": "kimi_linear", **model.cfg}, indent=1))
    write_safetensors(out / "model.safetensors", hf_state_dict(model, a_log_shape))
    return out


def build(cfg: dict, seed: int) -> K3Reference:
    torch.manual_seed(seed)
    model = K3Reference(cfg).eval()
    randomise(model, seed)
    return model


__all__ = ["K3Reference", "build", "hf_state_dict", "save_checkpoint", "situ"]


# ==== the K3 release layout =============================================================
XTML_TOKENS = ("[BOS]", "[EOS]", "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "<|media_begin|>",
               "<|media_content|>", "<|media_pad|>", "<|media_end|>", "<|kimi_image_placeholder|>")


def write_xtml_tokenizer(out: Path, vocab: int) -> None:
    """``tiktoken.model`` + ``tokenizer_config.json`` whose specials are K3's XTML markers."""
    import base64

    from tests.engine.tiny import synthetic_ranks

    n_base = vocab - len(XTML_TOKENS)
    lines = [base64.b64encode(t).decode() + f" {i}" for i, t in enumerate(synthetic_ranks(n_base))]
    (out / "tiktoken.model").write_text("\n".join(lines) + "\n")
    dec = {str(n_base + i): {"content": s, "special": True} for i, s in enumerate(XTML_TOKENS)}
    (out / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": dec}))


def save_release(model: K3Reference, out: Path, a_log_shape: str = "pad:16", shards: int = 2,
                 vision: bool = True, tokenizer: bool = True) -> Path:
    """The K3 release layout: config.json ``model_type: kimi_k3`` with the text model under
    ``text_config``, tensors under ``language_model.``, ``shards`` safetensors files + the
    index, a few vision-tower tensors, and (``tokenizer``) an XTML tiktoken tokenizer."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
           "text_config": {"model_type": "kimi_linear", **model.cfg},
           "vision_config": {"model_type": "moonvit", "hidden_size": 8}}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    tensors = {"language_model." + k: v for k, v in hf_state_dict(model, a_log_shape).items()}
    if vision:
        tensors["vision_tower.patch_embed.proj.weight"] = np.ones((8, 3, 2, 2), "f4")
        tensors["mm_projector.linear_1.weight"] = np.ones((model.cfg["hidden_size"], 8), "f4")
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        write_safetensors(out / file, part)
        weight_map.update({n: file for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer:
        write_xtml_tokenizer(out, model.cfg["vocab_size"])
    return out
