"""A Hugging Face ``config.json`` (Moonshot's or transformers') → the container's config.

``normalise_config`` returns the canonical manifest config of docs/FORMAT.md §3.1: canonical
keys for every alias, explicit 0-based ``layer_types``/``mlp_layer_types``, every ε. Every
field it uses is type-checked, and what libwaste would refuse at open is refused here, by name.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from waste.tools.container import ContainerError

K3_KEYS = ("hidden_act", "activation_situ_beta", "activation_situ_linear_beta", "routed_expert_hidden_size",
           "latent_moe_use_norm", "attn_res_block_size", "mla_use_output_gate", "use_full_rank_gate", "kda_decay",
           "gate_lower_bound")
RELEASE_MODEL_TYPE = "kimi_k3"   # the K3 release's top-level config.json
TEXT_MODEL_TYPE = "kimi_linear"  # a flat checkpoint's, and the release's text_config
ATTENTION_KINDS = ("linear_attention", "full_attention")
MLP_KINDS = ("dense", "sparse")
_REQUIRED = object()


class ConvertError(ContainerError):
    """The checkpoint cannot be converted; the message names the file, key or tensor."""


def read_json(path: Path) -> Any:
    """The parsed JSON of ``path``; a syntax or encoding error names the file and position.

    Raises:
        ConvertError: not UTF-8 or not JSON.
        OSError: unreadable.
    """
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConvertError(f"{path}: not UTF-8 ({exc})") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ConvertError(f"{path}: not valid JSON ({exc!s:.200})") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Fields:
    """Typed reads of one config object; errors name ``where`` and the key."""

    def __init__(self, cfg: dict, where: str) -> None:
        self.cfg, self.where = cfg, where

    def get(self, *keys: str, default: Any = _REQUIRED) -> tuple[str, Any]:
        """(key, value) of the first of ``keys`` set to something other than null."""
        for key in keys:
            if self.cfg.get(key) is not None:
                return key, self.cfg[key]
        if default is _REQUIRED:
            raise ConvertError(f"{self.where}: missing {' / '.join(keys)}")
        return keys[0], default

    def integer(self, *keys: str, default: Any = _REQUIRED, minimum: int = 1) -> int:
        key, value = self.get(*keys, default=default)
        if not _is_int(value) or value < minimum:
            raise ConvertError(f"{self.where}: {key} must be an integer >= {minimum}, got {value!r}")
        return value

    def number(self, *keys: str, default: Any = _REQUIRED, below: float = math.inf) -> float:
        key, value = self.get(*keys, default=default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < below:
            limit = "" if below == math.inf else f" and below {below:g}"
            raise ConvertError(f"{self.where}: {key} must be a number above 0{limit}, got {value!r}")
        return float(value)

    def flag(self, *keys: str, default: bool) -> bool:
        key, value = self.get(*keys, default=default)
        if not isinstance(value, bool):
            raise ConvertError(f"{self.where}: {key} must be true or false, got {value!r}")
        return value

    def text(self, key: str, default: str) -> str:
        key, value = self.get(key, default=default)
        if not isinstance(value, str):
            raise ConvertError(f"{self.where}: {key} must be a string, got {value!r}")
        return value

    def token_id(self, key: str, vocab: int) -> int | None:
        value = self.cfg.get(key)
        if isinstance(value, list):  # transformers allows several eos ids; the first is the one
            value = value[0] if value else None
        if value is not None and (not _is_int(value) or not 0 <= value < vocab):
            raise ConvertError(f"{self.where}: {key} must be a token id below vocab_size {vocab}, got {value!r}")
        return value


# ==== layer kinds ======================================================================
def _kinds(value: Any, key: str, allowed: tuple[str, ...], n_layers: int) -> list[str]:
    if not isinstance(value, list) or len(value) != n_layers or any(v not in allowed for v in value):
        raise ConvertError(f"config.json: {key} must list {' or '.join(allowed)} for each of the "
                           f"{n_layers} layers, got {value!r}")
    return list(value)


def _one_based(lac: dict, key: str, n_layers: int) -> list[int]:
    """``linear_attn_config[key]`` as checked 1-based layer numbers."""
    where = f"config.json: linear_attn_config.{key}"
    items = lac.get(key, [])
    if not isinstance(items, list):
        raise ConvertError(f"{where} must be a list of 1-based layer numbers, got {items!r}")
    for i, layer in enumerate(items):
        if not _is_int(layer):
            raise ConvertError(f"{where}[{i}] must be an integer (a 1-based layer number), got {layer!r}")
        if not 1 <= layer <= n_layers:
            raise ConvertError(f"{where}[{i}] = {layer} is outside 1..{n_layers}: the lists are 1-based "
                               "(layer 1 is the first)")
        if items.index(layer) != i:
            raise ConvertError(f"{where}: layer {layer} appears twice")
    return items


def _layer_types(cfg: dict, lac: dict, n_layers: int) -> list[str]:
    """``layer_types``, or the checkpoint's 1-based ``kda_layers``/``full_attn_layers``; with
    ``kda_layers`` alone, every layer not listed is MLA (docs/ENGINE.md §4.2 item 8)."""
    if cfg.get("layer_types"):
        return _kinds(cfg["layer_types"], "layer_types", ATTENTION_KINDS, n_layers)
    if "kda_layers" not in lac and "full_attn_layers" not in lac:
        raise ConvertError("config.json: neither layer_types nor linear_attn_config.kda_layers/full_attn_layers")
    kda, full = _one_based(lac, "kda_layers", n_layers), _one_based(lac, "full_attn_layers", n_layers)
    if "full_attn_layers" not in lac:
        full = [i for i in range(1, n_layers + 1) if i not in kda]
    both = sorted(set(kda) & set(full))
    if both:
        raise ConvertError(f"config.json: layer {both[0]} (1-based) is in both linear_attn_config.kda_layers "
                           "and full_attn_layers")
    types = ["linear_attention" if i in kda else "full_attention" if i in full else None
             for i in range(1, n_layers + 1)]
    if None in types:
        raise ConvertError(f"config.json: layer {types.index(None) + 1} (1-based) is in neither "
                           "kda_layers nor full_attn_layers")
    return types


def _mlp_layer_types(fields: _Fields, n_layers: int, release: bool) -> list[str]:
    """``mlp_layer_types``, or ``first_k_dense_replace`` (default 1; 0 for the K3 release,
    as Moonshot's K3 class) and ``moe_layer_freq`` (default 1): MoE iff ℓ ≥ first_k_dense_replace
    and ℓ mod moe_layer_freq = 0."""
    if fields.cfg.get("mlp_layer_types"):
        return _kinds(fields.cfg["mlp_layer_types"], "mlp_layer_types", MLP_KINDS, n_layers)
    first_dense = fields.integer("first_k_dense_replace", default=0 if release else 1, minimum=0)
    freq = fields.integer("moe_layer_freq", default=1)
    return ["sparse" if i >= first_dense and i % freq == 0 else "dense" for i in range(n_layers)]


# ==== the config ========================================================================
def _linear_attention(fields: _Fields, lac: _Fields) -> dict:
    """KDA's dimensions: ``linear_attn_config`` first, then the transformers names."""
    def pick(lac_key: str, key: str, default: Any = _REQUIRED) -> int:
        if lac.cfg.get(lac_key) is not None:
            return lac.integer(lac_key)
        return fields.integer(key, default=default)

    return {"linear_num_heads": pick("num_heads", "linear_num_heads"),
            "linear_head_dim": pick("head_dim", "linear_head_dim"),
            "linear_conv_kernel_dim": pick("short_conv_kernel_size", "linear_conv_kernel_dim", 4)}


def _moe(fields: _Fields) -> dict:
    """The router's and experts' fields, under their canonical names. Moonshot's
    ``moe_renormalize`` divides by the selected sum only when k > 1; transformers'
    ``norm_topk_prob`` at any k (docs/DECISIONS.md): the manifest holds the resolved flag."""
    top_k = fields.integer("num_experts_per_token", "num_experts_per_tok")
    key, _ = fields.get("moe_renormalize", "norm_topk_prob", default=True)
    renorm = fields.flag("moe_renormalize", "norm_topk_prob", default=True)
    return {
        "num_experts": fields.integer("num_experts", "num_local_experts", "n_routed_experts"),
        "num_experts_per_token": top_k,
        "num_shared_experts": fields.integer("num_shared_experts", "n_shared_experts", default=0, minimum=0),
        "moe_renormalize": renorm and (top_k > 1 or key != "moe_renormalize"),
        "routed_scaling_factor": fields.number("routed_scaling_factor"),
        "num_expert_group": fields.integer("num_expert_group", "n_group", default=1),
        "topk_group": fields.integer("topk_group", default=1),
    }


def _check_supported(out: dict) -> None:
    """What libwaste refuses at open (docs/ENGINE.md §4.1), refused before anything is written."""
    if out["hidden_act"] not in ("silu", "situ"):
        raise ConvertError(f"config.json: hidden_act {out['hidden_act']!r} is not supported (libwaste "
                           "implements silu and situ)")
    if out["num_key_value_heads"] != out["num_attention_heads"]:
        raise ConvertError(f"config.json: num_key_value_heads {out['num_key_value_heads']} must equal "
                           f"num_attention_heads {out['num_attention_heads']} (MLA has no grouped KV heads)")
    if out["num_expert_group"] > 1:
        raise ConvertError(f"config.json: num_expert_group / n_group {out['num_expert_group']} > 1: grouped "
                           "routing is not supported")
    if out["num_experts_per_token"] > out["num_experts"]:
        raise ConvertError(f"config.json: num_experts_per_token {out['num_experts_per_token']} exceeds "
                           f"num_experts {out['num_experts']}")


def normalise_config(raw: Any) -> dict:
    """The canonical manifest config (FORMAT.md §3.1) from a Moonshot or transformers config.

    Raises:
        ConvertError: a missing or mistyped field, inconsistent layer lists, or a feature
            libwaste does not implement, each naming the key.
    """
    if not isinstance(raw, dict) or not isinstance(raw.get("text_config") or {}, dict):
        raise ConvertError("config.json: must be a JSON object (with an object text_config, if any)")
    release = bool(raw.get("text_config"))
    top = raw.get("model_type")
    if release and top != RELEASE_MODEL_TYPE:
        raise ConvertError(f"config.json: model_type {top!r} with a text_config is not supported (the K3 release "
                           f"says {RELEASE_MODEL_TYPE!r})")
    cfg = dict(raw.get("text_config") or raw)
    if cfg.get("model_type") not in (None, TEXT_MODEL_TYPE):
        where = "text_config.model_type" if release else "model_type"
        raise ConvertError(f"config.json: {where} {cfg.get('model_type')!r} is not supported "
                           f"({TEXT_MODEL_TYPE!r})")
    lac = cfg.get("linear_attn_config") or {}
    if not isinstance(lac, dict):
        raise ConvertError(f"config.json: linear_attn_config must be an object, got {lac!r}")
    fields, lac_fields = _Fields(cfg, "config.json"), _Fields(lac, "config.json: linear_attn_config")
    n_layers = fields.integer("num_hidden_layers")
    vocab = fields.integer("vocab_size")
    heads = fields.integer("num_attention_heads")
    out = {
        "hidden_size": fields.integer("hidden_size"),
        "vocab_size": vocab,
        "num_hidden_layers": n_layers,
        "intermediate_size": fields.integer("intermediate_size"),
        "moe_intermediate_size": fields.integer("moe_intermediate_size"),
        **_moe(fields),
        "layer_types": _layer_types(cfg, lac, n_layers),
        "mlp_layer_types": _mlp_layer_types(fields, n_layers, release),
        **_linear_attention(fields, lac_fields),
        "num_attention_heads": heads,
        "num_key_value_heads": fields.integer("num_key_value_heads", default=heads),
        "kv_lora_rank": fields.integer("kv_lora_rank"),
        "q_lora_rank": fields.integer("q_lora_rank", default=0, minimum=0),
        "qk_nope_head_dim": fields.integer("qk_nope_head_dim", minimum=0),
        "qk_rope_head_dim": fields.integer("qk_rope_head_dim", minimum=0),
        "v_head_dim": fields.integer("v_head_dim"),
        "hidden_act": fields.text("hidden_act", default="silu"),
        "rms_norm_eps": fields.number("rms_norm_eps", default=1e-5, below=1),
        "mla_norm_eps": 1e-6,
        "kda_l2_eps": 1e-6,
        "bos_token_id": fields.token_id("bos_token_id", vocab),
        "eos_token_id": fields.token_id("eos_token_id", vocab),
        "pad_token_id": fields.token_id("pad_token_id", vocab),
        "model_max_length": fields.integer("model_max_length", "max_position_embeddings", default=0, minimum=0),
    }
    _check_supported(out)
    out.update(_k3(fields, lac_fields, out))
    return out


def _k3(fields: _Fields, lac: _Fields, out: dict) -> dict:
    """The K3 deltas (docs/ENGINE.md §4.2), each from its own key and written resolved."""
    k3: dict = {}
    if out["hidden_act"] == "situ":
        beta = fields.cfg.get("activation_situ_beta")
        k3["activation_situ_beta"] = 1.0 if beta in (None, 0) else fields.number("activation_situ_beta")
        k3["activation_situ_linear_beta"] = (fields.number("activation_situ_linear_beta")
                                             if fields.cfg.get("activation_situ_linear_beta") is not None else None)
    else:
        for key in ("activation_situ_beta", "activation_situ_linear_beta"):
            if fields.cfg.get(key) not in (None, 0):
                raise ConvertError(f"config.json: {key} is set but hidden_act is {out['hidden_act']!r} (it needs "
                                   "'situ')")
    rz = fields.integer("routed_expert_hidden_size", default=0, minimum=0)
    k3["routed_expert_hidden_size"] = rz
    k3["latent_moe_use_norm"] = fields.flag("latent_moe_use_norm", default=False)
    if k3["latent_moe_use_norm"] and not rz:
        raise ConvertError("config.json: latent_moe_use_norm is true but routed_expert_hidden_size is unset "
                           "(no latent MoE to normalise)")
    k3["attn_res_block_size"] = fields.integer("attn_res_block_size", default=0, minimum=0)
    k3["mla_use_output_gate"] = fields.flag("mla_use_output_gate", default=False)
    k3["use_full_rank_gate"] = fields.flag("use_full_rank_gate", default=False)
    bound = lac.cfg.get("gate_lower_bound")
    if bound is None:
        k3["kda_decay"] = "softplus"
    else:
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not -1e6 <= bound < 0:
            raise ConvertError(f"config.json: linear_attn_config.gate_lower_bound must be a negative number, "
                               f"got {bound!r}")
        k3["kda_decay"], k3["gate_lower_bound"] = "lower_bound", float(bound)
    return k3
