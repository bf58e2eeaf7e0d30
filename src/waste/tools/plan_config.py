"""A memory plan from a ``config.json`` alone (no weights): what a converted container of that
model would need (docs/ENGINE.md §5), computed by libwaste's own sizing code.

``python -m waste.tools.plan_config CONFIG.json [--trunk bf16] [--experts mxfp4] [--budget BYTES]
[--read-gbps 7]`` writes the manifest the converter would write (every canonical tensor of
docs/FORMAT.md §3.2 with its shape, format and length; one bank per MoE layer with its record
size) into a temporary directory, asks ``waste_plan_memory`` for the plan (it reads the
manifest only), and prints it with the parameter counts, the bytes one cold token reads (every
routed expert of every MoE layer missed: the working set) and the tok/s that read bounds at
``--read-gbps`` (docs/ENGINE.md §8: B_r / cold bytes). ``python -m waste MODEL --plan`` takes a
config.json (or a checkpoint directory without weights) the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from waste.tools.container import RECORD_HEADER_BYTES, ContainerError, row_bytes
from waste.tools.hf_config import ConvertError, normalise_config, read_json

FORMAT_VERSION = 1
TRUNK_ALIGN = 64


def canonical_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(canonical name, shape, kind) of every trunk tensor of a normalised config, in the
    converter's order; kind is "embed", "mat" (trunk format) or "vec" (f32)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    Hk, d, K = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    hd = Hk * d
    nh, r, rq = cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["q_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    E, Im, S, Rz = (cfg["num_experts"], cfg["moe_intermediate_size"], cfg["num_shared_experts"],
                    cfg.get("routed_expert_hidden_size", 0))
    out: list[tuple[str, tuple[int, ...], str]] = [("embed", (V, H), "embed")]
    for layer in range(cfg["num_hidden_layers"]):
        c = f"blk.{layer}."
        out += [(c + "attn_norm", (H,), "vec"), (c + "ffn_norm", (H,), "vec")]
        if cfg.get("attn_res_block_size"):
            out += [(c + f"res.{n}", (H,), "vec") for n in ("attn_norm", "attn_proj", "mlp_norm", "mlp_proj")]
        if cfg["layer_types"][layer] == "linear_attention":
            out += [(c + f"kda.{x}_proj", (hd, H), "mat") for x in "qkv"]
            out += [(c + f"kda.{x}_conv", (hd, K), "vec") for x in "qkv"]
            out += [(c + "kda.a_log", (Hk,), "vec"), (c + "kda.dt_bias", (hd,), "vec"),
                    (c + "kda.f_a", (d, H), "mat"), (c + "kda.f_b", (hd, d), "mat"), (c + "kda.b_proj", (Hk, H), "mat")]
            out += ([(c + "kda.g_proj", (hd, H), "mat")] if cfg.get("use_full_rank_gate")
                    else [(c + "kda.g_a", (d, H), "mat"), (c + "kda.g_b", (hd, d), "mat")])
            out += [(c + "kda.o_norm", (d,), "vec"), (c + "kda.o_proj", (H, hd), "mat")]
        else:
            qh = nh * (dn + dr)
            out += ([(c + "mla.q_a", (rq, H), "mat"), (c + "mla.q_a_norm", (rq,), "vec"),
                     (c + "mla.q_b", (qh, rq), "mat")] if rq else [(c + "mla.q_proj", (qh, H), "mat")])
            out += [(c + "mla.kv_a", (r + dr, H), "mat"), (c + "mla.kv_a_norm", (r,), "vec"),
                    (c + "mla.kv_b", (nh * (dn + dv), r), "mat"), (c + "mla.o_proj", (H, nh * dv), "mat")]
            if cfg.get("mla_use_output_gate"):
                out.append((c + "mla.g_proj", (nh * dv, H), "mat"))
        if cfg["mlp_layer_types"][layer] == "dense":
            I = cfg["intermediate_size"]
            out += [(c + "ffn.gate", (I, H), "mat"), (c + "ffn.up", (I, H), "mat"), (c + "ffn.down", (H, I), "mat")]
        else:
            out += [(c + "moe.router", (E, H), "vec"), (c + "moe.router_bias", (E,), "vec")]
            if S:
                out += [(c + "moe.shared_gate", (S * Im, H), "mat"), (c + "moe.shared_up", (S * Im, H), "mat"),
                        (c + "moe.shared_down", (H, S * Im), "mat")]
            if Rz:
                out += [(c + "moe.latent_down", (Rz, H), "mat"), (c + "moe.latent_up", (H, Rz), "mat")]
                if cfg.get("latent_moe_use_norm"):
                    out.append((c + "moe.latent_norm", (Rz,), "vec"))
    if cfg.get("attn_res_block_size"):
        out += [("output_res.norm", (H,), "vec"), ("output_res.proj", (H,), "vec")]
    out += [("final_norm", (H,), "vec"), ("lm_head", (V, H), "mat")]
    return out


def _group(fmt: str, group: int) -> int:
    return 0 if fmt in ("f32", "bf16") else (32 if fmt == "mxfp4" else group)


def manifest_for(raw: dict, trunk: str = "bf16", experts: str = "mxfp4", group: int = 32) -> dict:
    """The manifest a conversion of ``raw`` (a config.json object) at these formats writes,
    without data: tensor lengths and offsets, bank record sizes.

    Raises:
        ConvertError: the config is refused (naming the key).
        ContainerError: a width the format's group does not divide (naming the tensor).
    """
    cfg = normalise_config(raw)
    tensors, at = [], 0
    for name, shape, kind in canonical_tensors(cfg):
        fmt = "f32" if kind == "vec" else trunk
        g = _group(fmt, group)
        try:
            length = row_bytes(fmt, g, shape[-1]) * (shape[0] if len(shape) == 2 else 1)
        except ContainerError as exc:
            raise ContainerError(f"tensor {name} {list(shape)}: {exc}") from None
        tensors.append({"name": name, "format": fmt, "group": g, "shape": list(shape), "file": "trunk.bin",
                        "offset": at, "length": length, "on_disk": kind == "embed"})
        at += (length + TRUNK_ALIGN - 1) // TRUNK_ALIGN * TRUNK_ALIGN
    H, Im = cfg.get("routed_expert_hidden_size") or cfg["hidden_size"], cfg["moe_intermediate_size"]
    shapes = [(Im, H), (Im, H), (H, Im)]
    g = _group(experts, group)
    try:
        lengths = [row_bytes(experts, g, cols) * rows for rows, cols in shapes]
    except ContainerError as exc:
        raise ContainerError(f"routed experts {shapes}: {exc}") from None
    body = sum((n + 63) // 64 * 64 for n in lengths[:2]) + lengths[2]
    record = (RECORD_HEADER_BYTES + body + 4095) // 4096 * 4096
    banks = [{"layer": layer, "file": f"experts-L{layer}.bin", "n_experts": cfg["num_experts"], "format": experts,
              "group": g, "record_bytes": record, "shapes": [list(s) for s in shapes]}
             for layer, kind in enumerate(cfg["mlp_layer_types"]) if kind == "sparse"]
    arch = "kimi_k3" if raw.get("text_config") else "kimi_linear"
    return {"format_version": FORMAT_VERSION, "arch": arch, "config": cfg,
            "quant": {"trunk": trunk, "experts": experts, "group": group}, "tensors": tensors, "banks": banks,
            "tokenizer": None}


def params(manifest: dict) -> tuple[int, int]:
    """(total, active) parameters as libwaste counts them (docs/ENGINE.md §2): every tensor but
    the router bias; active leaves out the embedding and keeps top_k experts per MoE layer."""
    cfg = manifest["config"]
    size = {t["name"]: (t["shape"][0] * (t["shape"][1] if len(t["shape"]) == 2 else 1)) for t in manifest["tensors"]
            if not t["name"].endswith(".moe.router_bias")}
    per_expert = 3 * (cfg.get("routed_expert_hidden_size") or cfg["hidden_size"]) * cfg["moe_intermediate_size"]
    n_moe = len(manifest["banks"])
    total = sum(size.values()) + n_moe * cfg["num_experts"] * per_expert
    active = sum(size.values()) - size["embed"] + n_moe * cfg["num_experts_per_token"] * per_expert
    return total, active


def is_config_only(model: str | Path) -> bool:
    """True for a config.json file, or a directory with config.json and no manifest.json."""
    p = Path(model)
    return (p.is_file() and p.suffix == ".json") or (p.is_dir() and not (p / "manifest.json").exists()
                                                      and (p / "config.json").exists())


def default_formats(raw: dict) -> tuple[str, str]:
    """The release's formats: bf16 trunk; MXFP4 experts when config.json declares a
    quantization_config (K3's compressed-tensors release), else bf16."""
    return "bf16", ("mxfp4" if raw.get("quantization_config") or (raw.get("text_config") or {}).get(
        "quantization_config") else "bf16")


@contextlib.contextmanager
def plannable(model: str | Path, trunk: str | None = None, experts: str | None = None,
              group: int = 32) -> Iterator[tuple[Path, dict | None]]:
    """(a directory ``waste_plan_memory`` reads, its manifest when written from a config).
    A container passes through unchanged; a config.json becomes a temporary manifest."""
    if not is_config_only(model):
        yield Path(model), None
        return
    p = Path(model)
    raw = read_json(p if p.is_file() else p / "config.json")
    if not isinstance(raw, dict):
        raise ConvertError(f"{p}: config.json must be a JSON object")
    t, e = default_formats(raw)
    manifest = manifest_for(raw, trunk or t, experts or e, group)
    with tempfile.TemporaryDirectory(prefix="waste-plan-") as tmp:
        (Path(tmp) / "manifest.json").write_text(json.dumps(manifest))
        yield Path(tmp), manifest


def cold_token_lines(plan, manifest: dict | None, read_gbps: float) -> list[tuple[str, str]]:
    """Extra --plan lines: bytes per cold token and the read-bound tok/s (and parameters)."""
    cold = int(plan.working_set_bytes)
    lines = [("cold_token_bytes", str(cold))]
    if cold:
        lines.append((f"tok_s_at_{read_gbps:g}GBps", f"{read_gbps * 1e9 / cold:.3f}"))
    if manifest is not None:
        total, active = params(manifest)
        lines += [("params_total", str(total)), ("params_active", str(active))]
    return lines


def plan_anyway(path: Path, options) -> tuple[object, str | None]:
    """(the plan, None), or (the plan as far as sizing got, the engine's refusal) when the
    budget is refused (E_BUDGET: e.g. a floor above this machine's RAM): a config-only plan
    is mostly asked about a bigger machine, so its numbers are still worth printing."""
    import attrs

    from waste.adapters.native import NativeOptions
    from waste.adapters.native.context import _ERR_CAP, MemoryPlan, ffi, lib, new_cfg
    from waste.domain.engine import EngineError

    keep: list = []
    cfg = new_cfg(NativeOptions.coerce(options), keep)
    plan = ffi.new("waste_plan *")
    lib.waste_plan_init(plan)
    err = ffi.new("char[]", _ERR_CAP)
    status = lib.waste_plan_memory(str(path).encode("utf-8"), cfg, plan, err, _ERR_CAP)
    detail = ffi.string(err).decode("utf-8", "replace")
    if status not in (lib.WASTE_OK, lib.WASTE_E_BUDGET):
        raise EngineError(f"{detail}")
    values = MemoryPlan(**{f.name: int(getattr(plan, f.name)) for f in attrs.fields(MemoryPlan)})
    return values, (detail if status == lib.WASTE_E_BUDGET else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m waste.tools.plan_config", description=__doc__.splitlines()[0])
    ap.add_argument("config", help="a config.json, or a checkpoint directory holding one")
    ap.add_argument("--trunk", choices=["f32", "bf16", "int8", "int4"], help="default bf16")
    ap.add_argument("--experts", choices=["f32", "bf16", "int8", "int4", "mxfp4"],
                    help="default: mxfp4 with a quantization_config (the K3 release), else bf16")
    ap.add_argument("--group", type=int, choices=[32, 128], default=32)
    ap.add_argument("--budget", type=int, default=0, help="bytes (default 0: auto)")
    ap.add_argument("--ctx", type=int, default=0, help="ctx_tokens (default 4096)")
    ap.add_argument("--read-gbps", type=float, default=7.0, help="SSD read GB/s for the tok/s bound (default 7)")
    args = ap.parse_args(argv)
    from waste.adapters.native import NativeOptions  # libwaste's own sizing
    from waste.domain.engine import EngineError

    if not is_config_only(args.config):
        ap.error(f"{args.config}: not a config.json (for a container, use python -m waste MODEL --plan)")
    try:
        with plannable(args.config, args.trunk, args.experts, args.group) as (path, manifest):
            options = NativeOptions(ram_budget_bytes=args.budget, ctx_tokens=args.ctx, usage_path="")
            plan, refused = plan_anyway(path, options)
    except (ContainerError, OSError, EngineError) as exc:
        print(f"plan_config: error: {exc}", file=sys.stderr)
        return 1
    for key, value in [*plan.items(), *cold_token_lines(plan, manifest, args.read_gbps)]:
        print(f"{key:>20}: {value}")
    if refused:
        print(f"{'this_machine':>20}: does not fit ({refused})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
