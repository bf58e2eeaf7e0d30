"""Converts a Kimi-Linear Hugging Face checkpoint directory into a ``model.waste`` container.

``python -m waste.tools.convert HF_DIR OUT.waste [--dtype f32|bf16|int8] [--group 32|128]``
reads config.json and safetensors (with or without an index) using numpy only, checks every
name and shape before writing, normalises the config (docs/FORMAT.md §3.1), and streams
tensor by tensor into a temporary directory renamed at the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import struct
import sys
from pathlib import Path

import numpy as np

from waste.tools.container import ContainerError, ContainerWriter

K3_KEYS = ("routed_expert_hidden_size", "latent_moe_use_norm", "attn_res_block_size", "mla_use_output_gate",
           "use_full_rank_gate")


class ConvertError(ContainerError):
    """The checkpoint cannot be converted; the message names the tensor or config key."""


# ==== safetensors (no torch) ==========================================================
_ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


class SafeTensors:
    """Index of every tensor in a checkpoint directory: name → (file, dtype, shape, offsets)."""

    def __init__(self, hf_dir: Path) -> None:
        self.entries: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
        index = hf_dir / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in hf_dir.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{hf_dir}: no safetensors files")
        for name in files:
            path = hf_dir / name
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 100 << 20:
                    raise ConvertError(f"{path}: header of {n} bytes is implausible")
                header = json.loads(f.read(n))
            base = 8 + n
            for key, meta in header.items():
                if key == "__metadata__":
                    continue
                if key in self.entries:
                    raise ConvertError(f"tensor {key} appears in two files")
                if meta["dtype"] not in _ST_DTYPES:
                    raise ConvertError(f"tensor {key}: dtype {meta['dtype']} is not supported (bf16/f16/f32)")
                begin, end = meta["data_offsets"]
                self.entries[key] = (path, meta["dtype"], tuple(meta["shape"]), base + begin, base + end)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][2]

    def dtype(self, name: str) -> str:
        return self.entries[name][1]

    def load(self, name: str) -> np.ndarray:
        """Reads one tensor as float32."""
        path, dtype, shape, begin, end = self.entries[name]
        with open(path, "rb") as f:
            f.seek(begin)
            raw = f.read(end - begin)
        a = np.frombuffer(raw, dtype=_ST_DTYPES[dtype])
        if dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32).reshape(shape)


# ==== config normalisation ============================================================
def _first(cfg: dict, *keys, default=KeyError):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if default is KeyError:
        raise ConvertError(f"config.json: missing {' / '.join(keys)}")
    return default


def normalise_config(raw: dict) -> dict:
    """The canonical manifest config (FORMAT.md §3.1) from a Moonshot or transformers config."""
    cfg = dict(raw.get("text_config") or raw)
    lac = cfg.get("linear_attn_config") or {}
    n_layers = int(_first(cfg, "num_hidden_layers"))
    if cfg.get("layer_types"):
        layer_types = list(cfg["layer_types"])
    elif "kda_layers" in lac or "full_attn_layers" in lac:
        layer_types = [None] * n_layers
        for i in lac.get("full_attn_layers", []):
            layer_types[i - 1] = "full_attention"
        for i in lac.get("kda_layers", []):
            layer_types[i - 1] = "linear_attention"
        if None in layer_types:
            raise ConvertError(f"config.json: layer {layer_types.index(None) + 1} (1-based) is in neither "
                               "kda_layers nor full_attn_layers")
    else:
        raise ConvertError("config.json: neither layer_types nor linear_attn_config.kda_layers/full_attn_layers")
    if len(layer_types) != n_layers or set(layer_types) - {"linear_attention", "full_attention"}:
        raise ConvertError("config.json: layer_types must list linear_attention/full_attention per layer")
    if cfg.get("mlp_layer_types"):
        mlp_types = list(cfg["mlp_layer_types"])
    else:
        first_dense = int(cfg.get("first_k_dense_replace", 1))
        freq = int(cfg.get("moe_layer_freq", 1))
        mlp_types = ["sparse" if i >= first_dense and i % freq == 0 else "dense" for i in range(n_layers)]
    if len(mlp_types) != n_layers or set(mlp_types) - {"dense", "sparse"}:
        raise ConvertError("config.json: mlp_layer_types must list dense/sparse per layer")
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    q_lora = cfg.get("q_lora_rank")
    heads = int(_first(cfg, "num_attention_heads"))
    out = {
        "hidden_size": int(_first(cfg, "hidden_size")),
        "vocab_size": int(_first(cfg, "vocab_size")),
        "num_hidden_layers": n_layers,
        "intermediate_size": int(_first(cfg, "intermediate_size")),
        "moe_intermediate_size": int(_first(cfg, "moe_intermediate_size")),
        "num_experts": int(_first(cfg, "num_experts", "num_local_experts", "n_routed_experts")),
        "num_experts_per_token": int(_first(cfg, "num_experts_per_token", "num_experts_per_tok")),
        "num_shared_experts": int(_first(cfg, "num_shared_experts", "n_shared_experts", default=0)),
        "moe_renormalize": bool(_first(cfg, "moe_renormalize", "norm_topk_prob", default=True)),
        "routed_scaling_factor": float(_first(cfg, "routed_scaling_factor")),
        "num_expert_group": int(_first(cfg, "num_expert_group", "n_group", default=1)),
        "topk_group": int(_first(cfg, "topk_group", default=1)),
        "layer_types": layer_types,
        "mlp_layer_types": mlp_types,
        "linear_num_heads": int(_first(lac, "num_heads", default=None) or _first(cfg, "linear_num_heads")),
        "linear_head_dim": int(_first(lac, "head_dim", default=None) or _first(cfg, "linear_head_dim")),
        "linear_conv_kernel_dim": int(_first(lac, "short_conv_kernel_size", default=None)
                                      or _first(cfg, "linear_conv_kernel_dim", default=4)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_first(cfg, "num_key_value_heads", default=heads)),
        "kv_lora_rank": int(_first(cfg, "kv_lora_rank")),
        "q_lora_rank": int(q_lora) if q_lora else 0,
        "qk_nope_head_dim": int(_first(cfg, "qk_nope_head_dim")),
        "qk_rope_head_dim": int(_first(cfg, "qk_rope_head_dim")),
        "v_head_dim": int(_first(cfg, "v_head_dim")),
        "hidden_act": str(_first(cfg, "hidden_act", default="silu")),
        "rms_norm_eps": float(_first(cfg, "rms_norm_eps", default=1e-5)),
        "mla_norm_eps": 1e-6,
        "kda_l2_eps": 1e-6,
        "bos_token_id": cfg.get("bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": cfg.get("pad_token_id"),
        "model_max_length": int(_first(cfg, "model_max_length", "max_position_embeddings", default=0)),
    }
    for key in K3_KEYS:
        if cfg.get(key) not in (None, False):
            out[key] = cfg[key]
    if "gate_lower_bound" in lac:
        out["gate_lower_bound"] = lac["gate_lower_bound"]
    return out


# ==== tensor plan ======================================================================
def plan_tensors(cfg: dict, st: SafeTensors) -> tuple[list[tuple[str, str, tuple, str]], dict]:
    """Trunk entries (canonical, source, shape, kind) and bank sources; refuses unknown names.

    ``kind`` is "mat" (trunk format), "vec" (always f32), "conv", "a_log" or "embed".
    """
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    Hk, d, K = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    hd = Hk * d
    nh, dn, dr, dv, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                         cfg["v_head_dim"], cfg["kv_lora_rank"])
    E, Im, S, I = (cfg["num_experts"], cfg["moe_intermediate_size"], cfg["num_shared_experts"],
                   cfg["intermediate_size"])
    trunk: list[tuple[str, str, tuple, str]] = [("embed", "model.embed_tokens.weight", (V, H), "embed")]
    banks: dict[int, list[list[str]]] = {}
    used = {"model.embed_tokens.weight"}

    def add(canon, src, shape, kind):
        trunk.append((canon, src, shape, kind))
        used.add(src)

    for l in range(cfg["num_hidden_layers"]):
        p, c = f"model.layers.{l}.", f"blk.{l}."
        add(c + "attn_norm", p + "input_layernorm.weight", (H,), "vec")
        add(c + "ffn_norm", p + "post_attention_layernorm.weight", (H,), "vec")
        if cfg["layer_types"][l] == "linear_attention":
            a = p + "self_attn."
            for x in "qkv":
                add(c + f"kda.{x}_proj", a + f"{x}_proj.weight", (hd, H), "mat")
            for x in "qkv":
                add(c + f"kda.{x}_conv", a + f"{x}_conv1d.weight", (hd, K), "conv")
            add(c + "kda.a_log", a + "A_log", (Hk,), "a_log")
            add(c + "kda.dt_bias", a + "dt_bias", (hd,), "vec")
            add(c + "kda.f_a", a + "f_a_proj.weight", (d, H), "mat")
            add(c + "kda.f_b", a + "f_b_proj.weight", (hd, d), "mat")
            add(c + "kda.b_proj", a + "b_proj.weight", (Hk, H), "mat")
            add(c + "kda.g_a", a + "g_a_proj.weight", (d, H), "mat")
            add(c + "kda.g_b", a + "g_b_proj.weight", (hd, d), "mat")
            add(c + "kda.o_norm", a + "o_norm.weight", (d,), "vec")
            add(c + "kda.o_proj", a + "o_proj.weight", (H, hd), "mat")
        else:
            a = p + "self_attn."
            qh = nh * (dn + dr)
            if cfg["q_lora_rank"]:
                rq = cfg["q_lora_rank"]
                add(c + "mla.q_a", a + "q_a_proj.weight", (rq, H), "mat")
                add(c + "mla.q_a_norm", a + "q_a_layernorm.weight", (rq,), "vec")
                add(c + "mla.q_b", a + "q_b_proj.weight", (qh, rq), "mat")
            else:
                add(c + "mla.q_proj", a + "q_proj.weight", (qh, H), "mat")
            add(c + "mla.kv_a", a + "kv_a_proj_with_mqa.weight", (r + dr, H), "mat")
            add(c + "mla.kv_a_norm", a + "kv_a_layernorm.weight", (r,), "vec")
            add(c + "mla.kv_b", a + "kv_b_proj.weight", (nh * (dn + dv), r), "mat")
            add(c + "mla.o_proj", a + "o_proj.weight", (H, nh * dv), "mat")
        if cfg["mlp_layer_types"][l] == "dense":
            m = p + "mlp." if (p + "mlp.gate_proj.weight") in st.entries else p + "block_sparse_moe."
            add(c + "ffn.gate", m + "gate_proj.weight", (I, H), "mat")
            add(c + "ffn.up", m + "up_proj.weight", (I, H), "mat")
            add(c + "ffn.down", m + "down_proj.weight", (H, I), "mat")
        else:
            m = p + "block_sparse_moe."
            add(c + "moe.router", m + "gate.weight", (E, H), "vec")
            add(c + "moe.router_bias", m + "gate.e_score_correction_bias", (E,), "vec")
            if S:
                add(c + "moe.shared_gate", m + "shared_experts.gate_proj.weight", (S * Im, H), "mat")
                add(c + "moe.shared_up", m + "shared_experts.up_proj.weight", (S * Im, H), "mat")
                add(c + "moe.shared_down", m + "shared_experts.down_proj.weight", (H, S * Im), "mat")
            else:
                # transformers builds a zero-width shared MLP when there are no shared experts.
                for w in ("gate_proj", "up_proj", "down_proj"):
                    name = m + f"shared_experts.{w}.weight"
                    if name in st.entries and 0 in st.shape(name):
                        used.add(name)
            srcs = []
            for e in range(E):
                names = [m + f"experts.{e}.{w}.weight" for w in ("w1", "w3", "w2")]
                used.update(names)
                srcs.append(names)
            banks[l] = srcs
    add("final_norm", "model.norm.weight", (H,), "vec")
    add("lm_head", "lm_head.weight", (V, H), "mat")

    missing = sorted(n for n in used if n not in st.entries)
    if missing:
        raise ConvertError(f"missing tensors: {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""))
    unknown = sorted(n for n in st.entries if n not in used)
    if unknown:
        raise ConvertError(f"unknown tensors: {', '.join(unknown[:8])}" + (" ..." if len(unknown) > 8 else ""))
    for canon, src, shape, kind in trunk:
        got = st.shape(src)
        if kind == "conv":
            ok = got in ((shape[0], 1, shape[1]), shape)
        elif kind == "a_log":
            ok = int(np.prod(got)) >= shape[0] and len([x for x in got if x != 1]) <= 1
        else:
            ok = got == shape
        if not ok:
            raise ConvertError(f"tensor {src}: shape {list(got)}, expected {list(shape)}")
    for l, srcs in banks.items():
        for names in srcs:
            for name, shape in zip(names, ((Im, H), (Im, H), (H, Im))):
                if st.shape(name) != shape:
                    raise ConvertError(f"tensor {name}: shape {list(st.shape(name))}, expected {list(shape)}")
    return trunk, banks


def _a_log(a: np.ndarray, heads: int, src: str) -> np.ndarray:
    flat = a.reshape(-1)
    if flat.size == heads:
        return flat
    if flat.size > heads and not np.any(flat[heads:]):
        return flat[:heads]
    raise ConvertError(f"tensor {src}: {flat.size} values for {heads} heads (a longer vector needs an all-zero tail)")


# ==== tokenizer ========================================================================
def read_tokenizer(hf_dir: Path) -> tuple[list[bytes], list[tuple[int, str]]] | None:
    """Rank file + specials from ``tiktoken.model`` and ``tokenizer_config.json``, if present."""
    model = hf_dir / "tiktoken.model"
    if not model.exists():
        return None
    ranks: dict[int, bytes] = {}
    for n, line in enumerate(model.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not re.fullmatch(rb"\d+", parts[1]):
            raise ConvertError(f"tiktoken.model line {n}: expected 'base64 rank'")
        ranks[int(parts[1])] = base64.b64decode(parts[0], validate=True)
    if sorted(ranks) != list(range(len(ranks))):
        raise ConvertError("tiktoken.model: ranks must be dense from 0")
    specials: list[tuple[int, str]] = []
    tc = hf_dir / "tokenizer_config.json"
    if tc.exists():
        dec = json.loads(tc.read_text(encoding="utf-8")).get("added_tokens_decoder", {})
        for k, v in dec.items():
            if int(k) >= len(ranks):
                specials.append((int(k), v["content"]))
    return [ranks[i] for i in range(len(ranks))], specials


# ==== driver ============================================================================
def convert(hf_dir: str | Path, out: str | Path, *, trunk: str = "source", experts: str = "source",
            group: int = 32, overwrite: bool = False) -> Path:
    """Converts ``hf_dir`` into the container ``out``; returns its path."""
    hf_dir = Path(hf_dir)
    raw = json.loads((hf_dir / "config.json").read_text())
    cfg = normalise_config(raw)
    st = SafeTensors(hf_dir)
    trunk_plan, bank_plan = plan_tensors(cfg, st)
    tok = read_tokenizer(hf_dir)

    def resolve(choice: str, src: str) -> str:
        if choice == "source":
            return "bf16" if st.dtype(src) == "BF16" else "f32"
        return choice

    # Every format fits every shape before anything is written.
    for canon, src, shape, kind in trunk_plan:
        if kind in ("mat", "embed") and resolve(trunk, src) == "int8" and shape[-1] % group:
            raise ConvertError(f"tensor {canon} ({src}): {shape[-1]} input columns are not a multiple of "
                               f"the int8 group {group}")
    for layer, srcs in bank_plan.items():
        if resolve(experts, srcs[0][0]) == "int8":
            for name in srcs[0]:
                if st.shape(name)[-1] % group:
                    raise ConvertError(f"experts of layer {layer} ({name}): {st.shape(name)[-1]} input columns "
                                       f"are not a multiple of the int8 group {group}")

    w = ContainerWriter(out, overwrite=overwrite)
    try:
        for canon, src, shape, kind in trunk_plan:
            a = st.load(src)
            if kind == "conv":
                w.add_tensor(canon, a.reshape(shape), "f32")
            elif kind == "a_log":
                w.add_tensor(canon, _a_log(a, shape[0], src), "f32")
            elif kind == "vec":
                w.add_tensor(canon, a, "f32")
            else:
                fmt = resolve(trunk, src)
                w.add_tensor(canon, a, fmt, group if fmt == "int8" else 0, on_disk=(kind == "embed"))
        e_fmt = None
        for layer, srcs in sorted(bank_plan.items()):
            fmt = resolve(experts, srcs[0][0])
            e_fmt = fmt
            w.add_bank(layer, ([st.load(n) for n in names] for names in srcs), len(srcs), fmt,
                       group if fmt == "int8" else 0)
        if tok is not None:
            w.set_tokenizer(*tok)
        t_fmt = resolve(trunk, "lm_head.weight")
        quant = {"trunk": t_fmt, "experts": e_fmt or "none",
                 "group": group if "int8" in (t_fmt, e_fmt) else 0}
        return w.finish("kimi_linear", cfg, quant)
    except BaseException:
        w.abandon()
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m waste.tools.convert", description=__doc__.splitlines()[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "bf16", "int8"], help="sets --trunk and --experts")
    ap.add_argument("--trunk", choices=["source", "f32", "bf16", "int8"], default="source")
    ap.add_argument("--experts", choices=["source", "f32", "bf16", "int8"], default="source")
    ap.add_argument("--group", type=int, choices=[32, 128], default=32)
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    trunk = args.dtype or args.trunk
    experts = args.dtype or args.experts
    try:
        path = convert(args.hf_dir, args.out, trunk=trunk, experts=experts, group=args.group,
                       overwrite=args.overwrite)
    except (ContainerError, OSError, KeyError, json.JSONDecodeError) as exc:
        print(f"convert: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
