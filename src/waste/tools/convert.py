"""Converts a Kimi-Linear Hugging Face checkpoint directory into a ``model.waste`` container.

``python -m waste.tools.convert HF_DIR OUT.waste [--dtype f32|bf16|int8|int4] [--group 32|128]``
reads config.json and safetensors (with or without an index) using numpy only, checks every
name, shape, byte range and config field before writing (hf_config.py, hf_checkpoint.py),
and streams tensor by tensor into a temporary directory renamed at the end. Routed experts
stored in compressed-tensors' ``mxfp4-pack-quantized`` form (``weight_packed`` +
``weight_scale``) are kept byte for byte with ``--experts source`` (the default).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from waste.tools.container import ContainerError, ContainerWriter, Mxfp4Source
from waste.tools.hf_checkpoint import RAW_DTYPES, SafeTensors, read_tokenizer
from waste.tools.hf_config import K3_KEYS, ConvertError, normalise_config, read_json

__all__ = ["ConvertError", "K3_KEYS", "SafeTensors", "convert", "main", "normalise_config", "plan_tensors",
           "read_tokenizer"]

TrunkEntry = tuple[str, str, tuple, str]  # (canonical name, source name, shape, kind)
# One routed-expert matrix: a weight's name, or (weight_packed, weight_scale) for MXFP4.
ExpertSource = str | tuple[str, str]
MXFP4_FORMAT = "mxfp4-pack-quantized"


def _expert_source(st: SafeTensors, m: str, e: int, w: str) -> ExpertSource:
    """``experts.E.w.weight``, or its compressed-tensors MXFP4 pair when that is stored."""
    base = m + f"experts.{e}.{w}."
    if (base + "weight_packed") in st.entries or (base + "weight_scale") in st.entries:
        return (base + "weight_packed", base + "weight_scale")
    return base + "weight"


def _source_names(src: ExpertSource) -> tuple[str, ...]:
    return src if isinstance(src, tuple) else (src,)


def _source_shape(st: SafeTensors, src: ExpertSource) -> tuple:
    """The logical [rows, cols] of an expert matrix; for MXFP4 the pair must be consistent
    (packed U8 [rows, cols/2], scale U8/F8_E8M0 [rows, cols/32])."""
    if not isinstance(src, tuple):
        return st.shape(src)
    packed, scale = src
    ps, ss = st.shape(packed), st.shape(scale)
    for name in src:
        if st.dtype(name) not in RAW_DTYPES:
            raise ConvertError(f"tensor {name}: dtype {st.dtype(name)}, expected U8 ({MXFP4_FORMAT})")
    if len(ps) != 2 or len(ss) != 2 or ps[1] % 16 or ss != (ps[0], ps[1] // 16):
        raise ConvertError(f"tensor {packed} {list(ps)} with {scale} {list(ss)}: not MXFP4 groups of 32 "
                           "(packed [rows, cols/2], scale [rows, cols/32])")
    return (ps[0], ps[1] * 2)


# ==== tensor plan ======================================================================
class TensorPlan:
    """What the checkpoint must hold: trunk entries in container order, expert sources per
    MoE layer, and every source name used (the rest are unknown tensors). ``prefix`` is
    prepended to every source name (``language_model.`` in the K3 release layout)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.trunk: list[TrunkEntry] = []
        self.banks: dict[int, list[list[str]]] = {}
        self.used: set[str] = set()

    def add(self, canon: str, src: str, shape: tuple, kind: str) -> None:
        """Plan trunk tensor ``canon`` from checkpoint tensor ``prefix + src`` of ``shape``."""
        self.trunk.append((canon, self.prefix + src, shape, kind))
        self.used.add(self.prefix + src)


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
    if cfg["use_full_rank_gate"]:
        plan.add(c + "kda.g_proj", a + "g_proj.weight", (hd, H), "mat")
    else:
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
    if cfg["mla_use_output_gate"]:
        plan.add(c + "mla.g_proj", a + "g_proj.weight", (nh * dv, H), "mat")


def _dense_mlp(plan: TensorPlan, cfg: dict, st: SafeTensors, p: str, c: str) -> None:
    # Moonshot's release names layer 0's MLP ``mlp.``; transformers writes ``block_sparse_moe.``.
    m = p + "mlp." if (plan.prefix + p + "mlp.gate_proj.weight") in st.entries else p + "block_sparse_moe."
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
            name = plan.prefix + m + f"shared_experts.{w}.weight"
            if name in st.entries and 0 in st.shape(name):
                plan.used.add(name)
    Rz = cfg["routed_expert_hidden_size"]
    if Rz:  # the latent MoE (docs/ENGINE.md §4.2 item 2)
        plan.add(c + "moe.latent_down", m + "routed_expert_down_proj.weight", (Rz, H), "mat")
        plan.add(c + "moe.latent_up", m + "routed_expert_up_proj.weight", (H, Rz), "mat")
        if cfg["latent_moe_use_norm"]:
            plan.add(c + "moe.latent_norm", m + "routed_expert_norm.weight", (Rz,), "vec")
    m = plan.prefix + m
    plan.banks[layer] = [[_expert_source(st, m, e, w) for w in ("w1", "w3", "w2")] for e in range(E)]
    plan.used.update(name for srcs in plan.banks[layer] for src in srcs for name in _source_names(src))


def _listed(what: str, names: list[str]) -> str:
    return f"{what}: {', '.join(names[:8])}" + (" ..." if len(names) > 8 else "")


# The release's vision tower and projector: not converted yet (a later issue), skipped with a note.
VISION_PREFIXES = ("vision_tower.", "mm_projector.", "multi_modal_projector.")


def _check_names(plan: TensorPlan, st: SafeTensors, note=None) -> None:
    missing = sorted(n for n in plan.used if n not in st.entries)
    if missing:
        raise ConvertError(_listed("missing tensors", missing))
    vision = sorted(n for n in st.entries if plan.prefix and n.startswith(VISION_PREFIXES))
    if vision and note is not None:
        note(f"skipped {len(vision)} vision tensors ({', '.join(sorted({n.split('.')[0] for n in vision}))}): "
             "the vision tower is not converted yet")
    unknown = sorted(n for n in st.entries if n not in plan.used and n not in vision)
    if unknown:
        raise ConvertError(_listed("unknown tensors", unknown))


def _shape_fits(got: tuple, shape: tuple, kind: str) -> bool:
    if kind == "conv":
        return got in ((shape[0], 1, shape[1]), shape)
    if kind == "a_log":  # per head, stored (1, 1, H, 1) by transformers
        return int(np.prod(got)) >= shape[0] and len([x for x in got if x != 1]) <= 1
    if kind == "row":  # an nn.Linear(H, 1): [1, H]
        return got in ((1, shape[0]), shape)
    return got == shape


def _check_shapes(plan: TensorPlan, cfg: dict, st: SafeTensors) -> None:
    for _canon, src, shape, kind in plan.trunk:
        if not _shape_fits(st.shape(src), shape, kind):
            raise ConvertError(f"tensor {src}: shape {list(st.shape(src))}, expected {list(shape)}")
    H, Im = cfg["routed_expert_hidden_size"] or cfg["hidden_size"], cfg["moe_intermediate_size"]
    for names in (names for srcs in plan.banks.values() for names in srcs):
        for name, shape in zip(names, ((Im, H), (Im, H), (H, Im))):
            if _source_shape(st, name) != shape:
                raise ConvertError(f"tensor {_source_names(name)[0]}: shape {list(_source_shape(st, name))}, "
                                   f"expected {list(shape)}")


def plan_tensors(cfg: dict, st: SafeTensors, prefix: str = "", note=None
                 ) -> tuple[list[TrunkEntry], dict[int, list[list[ExpertSource]]]]:
    """Trunk entries (canonical, source, shape, kind) and bank sources per MoE layer; every
    source name starts with ``prefix``. ``note`` receives what is skipped (vision tensors).

    ``kind`` is "mat" (trunk format), "vec" (always f32), "row" (an [1, H] f32 vector),
    "conv", "a_log" or "embed".

    Raises:
        ConvertError: a missing or unknown tensor (listing them), or a wrong shape (naming it).
    """
    plan = TensorPlan(prefix)
    H = cfg["hidden_size"]
    plan.add("embed", "model.embed_tokens.weight", (cfg["vocab_size"], cfg["hidden_size"]), "embed")
    for layer in range(cfg["num_hidden_layers"]):
        p, c = f"model.layers.{layer}.", f"blk.{layer}."
        plan.add(c + "attn_norm", p + "input_layernorm.weight", (cfg["hidden_size"],), "vec")
        plan.add(c + "ffn_norm", p + "post_attention_layernorm.weight", (cfg["hidden_size"],), "vec")
        if cfg["attn_res_block_size"]:  # attention residuals (docs/ENGINE.md §4.2 item 3)
            for canon, src in (("attn", "self_attention"), ("mlp", "mlp")):
                plan.add(c + f"res.{canon}_norm", p + f"{src}_res_norm.weight", (H,), "vec")
                plan.add(c + f"res.{canon}_proj", p + f"{src}_res_proj.weight", (H,), "row")
        mixer = _kda if cfg["layer_types"][layer] == "linear_attention" else _mla
        mixer(plan, cfg, p + "self_attn.", c)
        if cfg["mlp_layer_types"][layer] == "dense":
            _dense_mlp(plan, cfg, st, p, c)
        else:
            _moe(plan, cfg, st, layer, p, c)
    if cfg["attn_res_block_size"]:
        plan.add("output_res.norm", "model.output_attn_res_norm.weight", (H,), "vec")
        plan.add("output_res.proj", "model.output_attn_res_proj.weight", (H,), "row")
    plan.add("final_norm", "model.norm.weight", (cfg["hidden_size"],), "vec")
    plan.add("lm_head", "lm_head.weight", (cfg["vocab_size"], cfg["hidden_size"]), "mat")
    _check_names(plan, st, note)
    _check_shapes(plan, cfg, st)
    return plan.trunk, plan.banks


def _a_log(a: np.ndarray, heads: int, src: str) -> np.ndarray:
    flat = a.reshape(-1)
    if flat.size == heads:
        return flat
    if flat.size > heads and not np.any(flat[heads:]):
        return flat[:heads]
    raise ConvertError(f"tensor {src}: {flat.size} values for {heads} heads (a longer vector needs an all-zero tail)")


# ==== chat format =======================================================================
# XTML (K3) is chosen by the server itself when the tokenizer holds these markers as single
# specials; Kimi-Linear's turn markers get a chat.json, written from the checkpoint's own
# tokenizer_config.json specials (docs/CHATJSON.md), so synth → convert → serve answers chat.
XTML_MARKERS = ("<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>")
KIMI_LINEAR_MARKERS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>")
KIMI_LINEAR_CHAT = {"system": ["<|im_system|>system<|im_middle|>", "<|im_end|>"],
                    "user": ["<|im_user|>user<|im_middle|>", "<|im_end|>"],
                    "assistant": ["<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"],
                    "open": "<|im_assistant|>assistant<|im_middle|>"}


def chat_format(specials: list[tuple[int, str]]) -> tuple[str, dict | None]:
    """("xtml", None), ("kimi-linear", chat.json object) or ("none", None) from the specials."""
    texts = {t for _, t in specials}
    if all(m in texts for m in XTML_MARKERS):
        return "xtml", None
    if all(m in texts for m in KIMI_LINEAR_MARKERS):
        return "kimi-linear", dict(KIMI_LINEAR_CHAT)
    return "none", None


# ==== driver ============================================================================
class _Formats:
    """The on-disk format of each matrix: ``source`` keeps bf16 as bf16, MXFP4 experts as
    mxfp4 (their bytes), everything else f32."""

    def __init__(self, st: SafeTensors, trunk: str, experts: str, group: int) -> None:
        self.st, self.trunk, self.experts, self.group = st, trunk, experts, group

    def resolve(self, choice: str, src: ExpertSource) -> str:
        """The format ``choice`` ("source", "f32", "bf16", "int8", "int4") means for ``src``."""
        if choice == "source":
            if isinstance(src, tuple):
                return "mxfp4"
            return "bf16" if self.st.dtype(src) == "BF16" else "f32"
        return choice

    def group_of(self, fmt: str) -> int:
        return {"int8": self.group, "int4": self.group, "mxfp4": 32}.get(fmt, 0)

    def check(self, trunk_plan: list[TrunkEntry], bank_plan: dict[int, list[list[ExpertSource]]]) -> None:
        """Every int8/int4 matrix's input width is a multiple of the group (before writing)."""
        for canon, src, shape, kind in trunk_plan:
            fmt = self.resolve(self.trunk, src) if kind in ("mat", "embed") else "f32"
            if fmt in ("int8", "int4") and shape[-1] % self.group:
                raise ConvertError(f"tensor {canon} ({src}): {shape[-1]} input columns are not a multiple of "
                                   f"the {fmt} group {self.group}")
        kinds = {layer: self.resolve(self.experts, srcs[0][0]) for layer, srcs in bank_plan.items()}
        if len(set(kinds.values())) > 1:
            raise ConvertError("experts must be stored alike in every layer (all MXFP4 or none): " +
                               ", ".join(f"layer {layer} {fmt}" for layer, fmt in sorted(kinds.items())))
        for layer, srcs in bank_plan.items():
            for e, mats in enumerate(srcs):
                if any(isinstance(src, tuple) != isinstance(srcs[0][0], tuple) for src in mats):
                    raise ConvertError(f"expert {e} of layer {layer} mixes MXFP4 and unquantized matrices")
            fmt = kinds[layer]
            if fmt in ("int8", "int4"):
                for name in srcs[0]:
                    cols = _source_shape(self.st, name)[-1]
                    if cols % self.group:
                        raise ConvertError(f"experts of layer {layer} ({_source_names(name)[0]}): {cols} input "
                                           f"columns are not a multiple of the {fmt} group {self.group}")

    def expert(self, src: ExpertSource, fmt: str):
        """One expert matrix ready for ``add_bank``: MXFP4 bytes kept when ``fmt`` is mxfp4,
        otherwise f32 values (MXFP4 decoded exactly first)."""
        if not isinstance(src, tuple):
            return self.st.load(src)
        m = Mxfp4Source(self.st.load_bytes(src[0]), self.st.load_bytes(src[1]), src[0], src[1])
        return m if fmt == "mxfp4" else m.dequantize()


def _write(w: ContainerWriter, st: SafeTensors, formats: _Formats, trunk_plan: list[TrunkEntry],
           bank_plan: dict[int, list[list[str]]]) -> str | None:
    """Streams every tensor into ``w``; returns the experts' format (None without MoE)."""
    for canon, src, shape, kind in trunk_plan:
        a = st.load(src)
        if kind in ("conv", "row"):
            w.add_tensor(canon, a.reshape(shape), "f32")
        elif kind == "a_log":
            w.add_tensor(canon, _a_log(a, shape[0], src), "f32")
        elif kind == "vec":
            w.add_tensor(canon, a, "f32")
        else:
            fmt = formats.resolve(formats.trunk, src)
            w.add_tensor(canon, a, fmt, formats.group_of(fmt), on_disk=(kind == "embed"))
    e_fmt = None
    for layer, srcs in sorted(bank_plan.items()):
        e_fmt = fmt = formats.resolve(formats.experts, srcs[0][0])
        w.add_bank(layer, ([formats.expert(n, fmt) for n in names] for names in srcs), len(srcs), fmt,
                   formats.group_of(fmt))
    return e_fmt


def check_quantization_config(raw: dict, bank_plan: dict[int, list[list[ExpertSource]]]) -> None:
    """MXFP4 expert tensors need a compressed-tensors ``quantization_config`` (when the
    config has one) that names the ``mxfp4-pack-quantized`` format; other schemes are
    refused by name rather than misread."""
    if not any(isinstance(src, tuple) for srcs in bank_plan.values() for mats in srcs for src in mats):
        return
    for where, cfg in (("config.json", raw), ("config.json text_config", raw.get("text_config"))):
        qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
        if qc is None:
            continue
        groups = qc.get("config_groups") if isinstance(qc, dict) else None
        found = {qc.get("format")} if isinstance(qc, dict) else set()
        if isinstance(groups, dict):
            found |= {g.get("format") for g in groups.values() if isinstance(g, dict)}
        if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors" or MXFP4_FORMAT not in found:
            raise ConvertError(f"{where}: quantization_config must be compressed-tensors with format "
                               f"{MXFP4_FORMAT!r} for weight_packed/weight_scale experts (found "
                               f"{sorted(str(f) for f in found - {None}) or 'none'})")


def _stderr_note(text: str) -> None:
    print(f"convert: note: {text}", file=sys.stderr)


def convert(hf_dir: str | Path, out: str | Path, *, trunk: str = "source", experts: str = "source",
            group: int = 32, overwrite: bool = False, note=_stderr_note) -> Path:
    """Converts ``hf_dir`` into the container ``out``; returns its path.

    A flat checkpoint (the text config at the top of config.json, tensors under ``model.``)
    becomes arch ``kimi_linear``; the K3 release layout (``model_type: kimi_k3``, the text
    model under ``text_config``, tensors under ``language_model.``) becomes ``kimi_k3``. The
    engine keys every K3 delta on its config key, never on the arch. ``note`` receives what
    is skipped (the vision tower's tensors).

    Everything is read and checked before the first byte is written; a failure while
    writing removes the temporary directory.

    Raises:
        ConvertError: a bad config field, tensor, byte range or tokenizer file, by name.
        ContainerError: ``out`` exists (without ``overwrite``) or a format cannot be written.
        OSError: a file cannot be read or written.
    """
    hf_dir = Path(hf_dir)
    raw = read_json(hf_dir / "config.json")
    cfg = normalise_config(raw)
    release = isinstance(raw, dict) and bool(raw.get("text_config"))
    prefix = "language_model." if release else ""
    st = SafeTensors(hf_dir)
    trunk_plan, bank_plan = plan_tensors(cfg, st, prefix, note)
    tok = read_tokenizer(hf_dir, cfg["vocab_size"])
    formats = _Formats(st, trunk, experts, group)
    formats.check(trunk_plan, bank_plan)
    check_quantization_config(raw, bank_plan)

    w = ContainerWriter(out, overwrite=overwrite)
    try:
        e_fmt = _write(w, st, formats, trunk_plan, bank_plan)
        if tok is not None:
            w.set_tokenizer(*tok)
            kind, chat = chat_format(tok[1])
            if chat is not None:
                w.set_chat(chat)
            elif kind == "none" and note is not None:
                note("the tokenizer has neither the XTML markers nor Kimi-Linear's turn markers: no chat "
                     "format (the server answers completions only, until a chat.json is added)")
        t_fmt = formats.resolve(trunk, prefix + "lm_head.weight")
        quant = {"trunk": t_fmt, "experts": e_fmt or "none",
                 "group": max(formats.group_of(t_fmt), formats.group_of(e_fmt or "none"))}
        return w.finish("kimi_k3" if release else "kimi_linear", cfg, quant)
    except BaseException:
        w.abandon()
        raise


def main(argv: list[str] | None = None) -> int:
    """The command line; prints the container path, or one error line and exits 1 (2 for usage)."""
    ap = argparse.ArgumentParser(prog="python -m waste.tools.convert", description=__doc__.splitlines()[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "bf16", "int8", "int4"], help="sets --trunk and --experts")
    ap.add_argument("--trunk", choices=["source", "f32", "bf16", "int8", "int4"], help="default: source")
    ap.add_argument("--experts", choices=["source", "f32", "bf16", "int8", "int4"],
                    help="default: source (bf16 stays bf16, MXFP4 experts stay MXFP4 byte for byte)")
    ap.add_argument("--group", type=int, choices=[32, 128], default=32, help="int8/int4 group (mxfp4 is always 32)")
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
