"""Converts a Kimi-Linear Hugging Face checkpoint directory into a ``model.waste`` container.

``python -m waste.tools.convert HF_DIR OUT.waste [--dtype f32|bf16|int8] [--group 32|128]``
reads config.json and safetensors (with or without an index) using numpy only, checks every
name, shape, byte range and config field before writing (hf_config.py, hf_checkpoint.py),
and streams tensor by tensor into a temporary directory renamed at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from waste.tools.container import ContainerError, ContainerWriter
from waste.tools.hf_checkpoint import SafeTensors, read_tokenizer
from waste.tools.hf_config import K3_KEYS, ConvertError, normalise_config, read_json

__all__ = ["ConvertError", "K3_KEYS", "SafeTensors", "convert", "main", "normalise_config", "plan_tensors",
           "read_tokenizer"]

TrunkEntry = tuple[str, str, tuple, str]  # (canonical name, source name, shape, kind)


# ==== tensor plan ======================================================================
class TensorPlan:
    """What the checkpoint must hold: trunk entries in container order, expert sources per
    MoE layer, and every source name used (the rest are unknown tensors)."""

    def __init__(self) -> None:
        self.trunk: list[TrunkEntry] = []
        self.banks: dict[int, list[list[str]]] = {}
        self.used: set[str] = set()

    def add(self, canon: str, src: str, shape: tuple, kind: str) -> None:
        """Plan trunk tensor ``canon`` from checkpoint tensor ``src`` of ``shape``."""
        self.trunk.append((canon, src, shape, kind))
        self.used.add(src)


def _kda(plan: TensorPlan, cfg: dict, a: str, c: str) -> None:
    H, Hk, d, K = cfg["hidden_size"], cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    hd = Hk * d
    for x in "qkv":
        plan.add(c + f"kda.{x}_proj", a + f"{x}_proj.weight", (hd, H), "mat")
    for x in "qkv":
        plan.add(c + f"kda.{x}_conv", a + f"{x}_conv1d.weight", (hd, K), "conv")
    plan.add(c + "kda.a_log", a + "A_log", (Hk,), "a_log")
    plan.add(c + "kda.dt_bias", a + "dt_bias", (hd,), "vec")
    plan.add(c + "kda.f_a", a + "f_a_proj.weight", (d, H), "mat")
    plan.add(c + "kda.f_b", a + "f_b_proj.weight", (hd, d), "mat")
    plan.add(c + "kda.b_proj", a + "b_proj.weight", (Hk, H), "mat")
    plan.add(c + "kda.g_a", a + "g_a_proj.weight", (d, H), "mat")
    plan.add(c + "kda.g_b", a + "g_b_proj.weight", (hd, d), "mat")
    plan.add(c + "kda.o_norm", a + "o_norm.weight", (d,), "vec")
    plan.add(c + "kda.o_proj", a + "o_proj.weight", (H, hd), "mat")


def _mla(plan: TensorPlan, cfg: dict, a: str, c: str) -> None:
    H, nh, r = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qh = nh * (dn + dr)
    if cfg["q_lora_rank"]:
        rq = cfg["q_lora_rank"]
        plan.add(c + "mla.q_a", a + "q_a_proj.weight", (rq, H), "mat")
        plan.add(c + "mla.q_a_norm", a + "q_a_layernorm.weight", (rq,), "vec")
        plan.add(c + "mla.q_b", a + "q_b_proj.weight", (qh, rq), "mat")
    else:
        plan.add(c + "mla.q_proj", a + "q_proj.weight", (qh, H), "mat")
    plan.add(c + "mla.kv_a", a + "kv_a_proj_with_mqa.weight", (r + dr, H), "mat")
    plan.add(c + "mla.kv_a_norm", a + "kv_a_layernorm.weight", (r,), "vec")
    plan.add(c + "mla.kv_b", a + "kv_b_proj.weight", (nh * (dn + dv), r), "mat")
    plan.add(c + "mla.o_proj", a + "o_proj.weight", (H, nh * dv), "mat")


def _dense_mlp(plan: TensorPlan, cfg: dict, st: SafeTensors, p: str, c: str) -> None:
    # Moonshot's release names layer 0's MLP ``mlp.``; transformers writes ``block_sparse_moe.``.
    m = p + "mlp." if (p + "mlp.gate_proj.weight") in st.entries else p + "block_sparse_moe."
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    plan.add(c + "ffn.gate", m + "gate_proj.weight", (I, H), "mat")
    plan.add(c + "ffn.up", m + "up_proj.weight", (I, H), "mat")
    plan.add(c + "ffn.down", m + "down_proj.weight", (H, I), "mat")


def _moe(plan: TensorPlan, cfg: dict, st: SafeTensors, layer: int, p: str, c: str) -> None:
    m = p + "block_sparse_moe."
    H, E, Im, S = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"], cfg["num_shared_experts"]
    plan.add(c + "moe.router", m + "gate.weight", (E, H), "vec")
    plan.add(c + "moe.router_bias", m + "gate.e_score_correction_bias", (E,), "vec")
    if S:
        plan.add(c + "moe.shared_gate", m + "shared_experts.gate_proj.weight", (S * Im, H), "mat")
        plan.add(c + "moe.shared_up", m + "shared_experts.up_proj.weight", (S * Im, H), "mat")
        plan.add(c + "moe.shared_down", m + "shared_experts.down_proj.weight", (H, S * Im), "mat")
    else:
        # transformers builds a zero-width shared MLP when there are no shared experts.
        for w in ("gate_proj", "up_proj", "down_proj"):
            name = m + f"shared_experts.{w}.weight"
            if name in st.entries and 0 in st.shape(name):
                plan.used.add(name)
    plan.banks[layer] = [[m + f"experts.{e}.{w}.weight" for w in ("w1", "w3", "w2")] for e in range(E)]
    plan.used.update(name for names in plan.banks[layer] for name in names)


def _listed(what: str, names: list[str]) -> str:
    return f"{what}: {', '.join(names[:8])}" + (" ..." if len(names) > 8 else "")


def _check_names(plan: TensorPlan, st: SafeTensors) -> None:
    missing = sorted(n for n in plan.used if n not in st.entries)
    if missing:
        raise ConvertError(_listed("missing tensors", missing))
    unknown = sorted(n for n in st.entries if n not in plan.used)
    if unknown:
        raise ConvertError(_listed("unknown tensors", unknown))


def _shape_fits(got: tuple, shape: tuple, kind: str) -> bool:
    if kind == "conv":
        return got in ((shape[0], 1, shape[1]), shape)
    if kind == "a_log":  # per head, stored (1, 1, H, 1) by transformers
        return int(np.prod(got)) >= shape[0] and len([x for x in got if x != 1]) <= 1
    return got == shape


def _check_shapes(plan: TensorPlan, cfg: dict, st: SafeTensors) -> None:
    for _canon, src, shape, kind in plan.trunk:
        if not _shape_fits(st.shape(src), shape, kind):
            raise ConvertError(f"tensor {src}: shape {list(st.shape(src))}, expected {list(shape)}")
    H, Im = cfg["hidden_size"], cfg["moe_intermediate_size"]
    for names in (names for srcs in plan.banks.values() for names in srcs):
        for name, shape in zip(names, ((Im, H), (Im, H), (H, Im))):
            if st.shape(name) != shape:
                raise ConvertError(f"tensor {name}: shape {list(st.shape(name))}, expected {list(shape)}")


def plan_tensors(cfg: dict, st: SafeTensors) -> tuple[list[TrunkEntry], dict[int, list[list[str]]]]:
    """Trunk entries (canonical, source, shape, kind) and bank sources per MoE layer.

    ``kind`` is "mat" (trunk format), "vec" (always f32), "conv", "a_log" or "embed".

    Raises:
        ConvertError: a missing or unknown tensor (listing them), or a wrong shape (naming it).
    """
    plan = TensorPlan()
    plan.add("embed", "model.embed_tokens.weight", (cfg["vocab_size"], cfg["hidden_size"]), "embed")
    for layer in range(cfg["num_hidden_layers"]):
        p, c = f"model.layers.{layer}.", f"blk.{layer}."
        plan.add(c + "attn_norm", p + "input_layernorm.weight", (cfg["hidden_size"],), "vec")
        plan.add(c + "ffn_norm", p + "post_attention_layernorm.weight", (cfg["hidden_size"],), "vec")
        mixer = _kda if cfg["layer_types"][layer] == "linear_attention" else _mla
        mixer(plan, cfg, p + "self_attn.", c)
        if cfg["mlp_layer_types"][layer] == "dense":
            _dense_mlp(plan, cfg, st, p, c)
        else:
            _moe(plan, cfg, st, layer, p, c)
    plan.add("final_norm", "model.norm.weight", (cfg["hidden_size"],), "vec")
    plan.add("lm_head", "lm_head.weight", (cfg["vocab_size"], cfg["hidden_size"]), "mat")
    _check_names(plan, st)
    _check_shapes(plan, cfg, st)
    return plan.trunk, plan.banks


def _a_log(a: np.ndarray, heads: int, src: str) -> np.ndarray:
    flat = a.reshape(-1)
    if flat.size == heads:
        return flat
    if flat.size > heads and not np.any(flat[heads:]):
        return flat[:heads]
    raise ConvertError(f"tensor {src}: {flat.size} values for {heads} heads (a longer vector needs an all-zero tail)")


# ==== driver ============================================================================
class _Formats:
    """The on-disk format of each matrix: ``source`` keeps bf16 as bf16, everything else f32."""

    def __init__(self, st: SafeTensors, trunk: str, experts: str, group: int) -> None:
        self.st, self.trunk, self.experts, self.group = st, trunk, experts, group

    def resolve(self, choice: str, src: str) -> str:
        """The format ``choice`` ("source", "f32", "bf16", "int8") means for tensor ``src``."""
        if choice == "source":
            return "bf16" if self.st.dtype(src) == "BF16" else "f32"
        return choice

    def check(self, trunk_plan: list[TrunkEntry], bank_plan: dict[int, list[list[str]]]) -> None:
        """Every int8 matrix's input width is a multiple of the group (before writing)."""
        for canon, src, shape, kind in trunk_plan:
            if kind in ("mat", "embed") and self.resolve(self.trunk, src) == "int8" and shape[-1] % self.group:
                raise ConvertError(f"tensor {canon} ({src}): {shape[-1]} input columns are not a multiple of "
                                   f"the int8 group {self.group}")
        for layer, srcs in bank_plan.items():
            if self.resolve(self.experts, srcs[0][0]) == "int8":
                for name in srcs[0]:
                    if self.st.shape(name)[-1] % self.group:
                        raise ConvertError(f"experts of layer {layer} ({name}): {self.st.shape(name)[-1]} input "
                                           f"columns are not a multiple of the int8 group {self.group}")


def _write(w: ContainerWriter, st: SafeTensors, formats: _Formats, trunk_plan: list[TrunkEntry],
           bank_plan: dict[int, list[list[str]]]) -> str | None:
    """Streams every tensor into ``w``; returns the experts' format (None without MoE)."""
    group = formats.group
    for canon, src, shape, kind in trunk_plan:
        a = st.load(src)
        if kind == "conv":
            w.add_tensor(canon, a.reshape(shape), "f32")
        elif kind == "a_log":
            w.add_tensor(canon, _a_log(a, shape[0], src), "f32")
        elif kind == "vec":
            w.add_tensor(canon, a, "f32")
        else:
            fmt = formats.resolve(formats.trunk, src)
            w.add_tensor(canon, a, fmt, group if fmt == "int8" else 0, on_disk=(kind == "embed"))
    e_fmt = None
    for layer, srcs in sorted(bank_plan.items()):
        e_fmt = formats.resolve(formats.experts, srcs[0][0])
        w.add_bank(layer, ([st.load(n) for n in names] for names in srcs), len(srcs), e_fmt,
                   group if e_fmt == "int8" else 0)
    return e_fmt


def convert(hf_dir: str | Path, out: str | Path, *, trunk: str = "source", experts: str = "source",
            group: int = 32, overwrite: bool = False) -> Path:
    """Converts ``hf_dir`` into the container ``out``; returns its path.

    Everything is read and checked before the first byte is written; a failure while
    writing removes the temporary directory.

    Raises:
        ConvertError: a bad config field, tensor, byte range or tokenizer file, by name.
        ContainerError: ``out`` exists (without ``overwrite``) or a format cannot be written.
        OSError: a file cannot be read or written.
    """
    hf_dir = Path(hf_dir)
    cfg = normalise_config(read_json(hf_dir / "config.json"))
    st = SafeTensors(hf_dir)
    trunk_plan, bank_plan = plan_tensors(cfg, st)
    tok = read_tokenizer(hf_dir, cfg["vocab_size"])
    formats = _Formats(st, trunk, experts, group)
    formats.check(trunk_plan, bank_plan)

    w = ContainerWriter(out, overwrite=overwrite)
    try:
        e_fmt = _write(w, st, formats, trunk_plan, bank_plan)
        if tok is not None:
            w.set_tokenizer(*tok)
        t_fmt = formats.resolve(trunk, "lm_head.weight")
        quant = {"trunk": t_fmt, "experts": e_fmt or "none",
                 "group": group if "int8" in (t_fmt, e_fmt) else 0}
        return w.finish("kimi_linear", cfg, quant)
    except BaseException:
        w.abandon()
        raise


def main(argv: list[str] | None = None) -> int:
    """The command line; prints the container path, or one error line and exits 1 (2 for usage)."""
    ap = argparse.ArgumentParser(prog="python -m waste.tools.convert", description=__doc__.splitlines()[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "bf16", "int8"], help="sets --trunk and --experts")
    ap.add_argument("--trunk", choices=["source", "f32", "bf16", "int8"], help="default: source")
    ap.add_argument("--experts", choices=["source", "f32", "bf16", "int8"], help="default: source")
    ap.add_argument("--group", type=int, choices=[32, 128], default=32)
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    if args.dtype and (args.trunk or args.experts):
        ap.error("--dtype sets both --trunk and --experts: give --dtype or those two, not both")
    trunk = args.dtype or args.trunk or "source"
    experts = args.dtype or args.experts or "source"
    try:
        path = convert(args.hf_dir, args.out, trunk=trunk, experts=experts, group=args.group,
                       overwrite=args.overwrite)
    except (ContainerError, OSError) as exc:
        print(f"convert: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
