"""Builds a deterministic synthetic ``kimi_linear`` container for tests and demos.

``python -m waste.tools.make_container OUT.waste [--seed N] [geometry flags] [--dtype D]
[--chat-json xtml|kimi-linear|glm|none]``: random weights (numpy, seeded per tensor), a
byte-level BPE vocabulary trained on a built-in corpus, chat-format specials. Same seed and
flags → byte-identical container.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zlib
from pathlib import Path

import attrs
import numpy as np

from waste.domain.chatjson import glmtools
from waste.tools.bpe_train import train_ranks
from waste.tools.container import ContainerError, ContainerWriter, Shape, TensorSpec
from waste.tools.hf_config import normalise_config

XTML_SPECIALS = ("<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "<|media_begin|>",
                 "<|media_content|>", "<|media_pad|>", "<|media_end|>",
                 "<|kimi_image_placeholder|>")
KIMI_LINEAR_SPECIALS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                        "<|im_end|>")
K2_TOOL_MARKERS = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                   "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
GLM_TOOL_MARKERS = glmtools.TOOL_MARKERS
EOS = "[EOS]"
CHAT_FORMATS = ("xtml", "kimi-linear", "glm", "none")
# The kimi-linear and glm chat.json files are the source tree's examples/ (the server's tests
# and docs use the same files); a packaged install without them refuses those two by name.
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# A marker inside a chat.json string: <|…|>, [gMASK]-style or <think>-style (as the fake engine).
_CHAT_MARKER = re.compile(r"<\|[^<>|\s]+\|>|\[[A-Za-z][A-Za-z0-9_]*\]|</?[A-Za-z][A-Za-z0-9_]*>")

# Enough variety that merges cover words, camelCase, digits, code, CJK and emoji.
CORPUS = (
    "The quick brown fox jumps over the lazy dog. She said: \"It's fine, we'll see.\"\n",
    "Once upon a time there was a small model that answered every question with care. "
    "It thought before it spoke, and when it did not know, it said so.\n",
    "def generate(prompt, max_tokens=64):\n    for index in range(max_tokens):\n"
    "        yield sample(logits[index])\n",
    '{"role": "user", "content": "What is the weather in Paris today?", "tools": []}\n',
    "message role=\"assistant\" think name=\"get_weather\" arguments json string number\n",
    "camelCaseWords snake_case_words HTTPServer getHTTPResponse parseJSON2Value\n",
    "Numbers: 0 1 2 3 42 256 1024 65536 3.14159 2026-12-02 12:30:45 +1 (555) 010-2030\n",
    "你好，世界！今天天气很好。我们一起学习语言模型。日本語のテキストも少しあります。\n",
    "Emoji 🙂🚀🌍 and accents: café naïve résumé Ångström façade — “quotes” ‘too’.\n",
    "\t\tIndented\r\n\r\nWindows lines\n\n\nand   runs   of   spaces.\n",
)


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be a positive integer, got {value!r}")


@attrs.frozen(kw_only=True)
class Geometry:
    """The synthetic model's shape. Defaults: 4 layers (KDA×3 + MLA), hidden 64, 8 experts."""

    layers: int = attrs.field(default=4, validator=_positive)
    hidden: int = attrs.field(default=64, validator=_positive)
    intermediate: int = attrs.field(default=128, validator=_positive)
    moe_intermediate: int = attrs.field(default=32, validator=_positive)
    experts: int = attrs.field(default=8, validator=_positive)
    top_k: int = attrs.field(default=2, validator=_positive)
    shared: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    dense: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    layout: str | None = None  # "KKKM": K = KDA, M = MLA; None = MLA at every 4th layer
    kda_heads: int = attrs.field(default=2, validator=_positive)
    kda_head_dim: int = attrs.field(default=32, validator=_positive)
    conv_kernel: int = attrs.field(default=4, validator=_positive)
    mla_heads: int = attrs.field(default=4, validator=_positive)
    kv_lora_rank: int = attrs.field(default=32, validator=_positive)
    qk_nope: int = attrs.field(default=16, validator=_positive)
    qk_rope: int = attrs.field(default=8, validator=_positive)
    v_head: int = attrs.field(default=16, validator=_positive)
    vocab_merges: int = attrs.field(default=240, validator=attrs.validators.ge(0))
    dtype: str = attrs.field(default="f32", validator=attrs.validators.in_(("f32", "bf16", "int8", "int4")))
    group: int = attrs.field(default=32, validator=attrs.validators.in_((32, 128)))
    # Every Kimi K3 delta on (docs/ENGINE.md §4.2): SiTU (β 4, β_l 25), a latent MoE of width
    # hidden/2 with its norm, attention residuals in blocks of 2, MLA q-LoRA (rank 32) with the
    # output gate, the full-rank KDA gate, the lower-bound decay (λ = -5); arch kimi_k3.
    k3: bool = False

    def __attrs_post_init__(self) -> None:
        if self.top_k > self.experts:
            raise ValueError(f"--top-k {self.top_k} exceeds --experts {self.experts}")
        if self.layout is not None and (len(self.layout) != self.layers or set(self.layout) - {"K", "M"}):
            raise ValueError(f"--layout {self.layout!r} must be {self.layers} letters K (KDA) or M (MLA)")

    def layer_types(self) -> list[str]:
        letters = self.layout or "".join("M" if i % 4 == 3 else "K" for i in range(self.layers))
        return ["full_attention" if c == "M" else "linear_attention" for c in letters]


def chat_specials(chat_format: str) -> tuple[tuple[str, ...], dict | None]:
    """The specials (EOS last) and chat.json object of ``chat_format``.

    Raises:
        ValueError: an unknown format.
        ContainerError: the format's examples/chat-*.json is not where the source tree has it.
    """
    if chat_format == "xtml":
        return XTML_SPECIALS + (EOS,), None
    if chat_format == "none":
        return (EOS,), None
    if chat_format not in ("kimi-linear", "glm"):
        raise ValueError(f"--chat-json must be one of {', '.join(CHAT_FORMATS)}, got {chat_format!r}")
    path = EXAMPLES / f"chat-{chat_format}.json"
    try:
        chat = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContainerError(f"--chat-json {chat_format} copies {path}, which is not there: it ships in the "
                             "source tree's examples/ (run from a checkout, or use --chat-json xtml or none)") from None
    if chat_format == "kimi-linear":
        return KIMI_LINEAR_SPECIALS + K2_TOOL_MARKERS + (EOS,), chat
    # No vision tower, and libwaste's only image placeholder is <|media_pad|>: an image block
    # would make the chat.json unloadable, so the synthetic GLM container has none.
    chat = {key: value for key, value in chat.items() if key != "image"}
    markers: list[str] = []
    for value in _strings(chat):
        markers += [m for m in _CHAT_MARKER.findall(value) if m not in markers]
    if chat.get("tools") == "glm":  # GLM's tool markers appear in no chat.json string
        markers += [m for m in GLM_TOOL_MARKERS if m not in markers]
    return tuple(markers) + (EOS,), chat


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


def raw_config(g: Geometry, vocab: int, eos_id: int) -> dict:
    """A transformers-style config, normalised by the converter's own ``normalise_config``."""
    return {
        "model_type": "kimi_linear", "hidden_size": g.hidden, "vocab_size": vocab,
        "num_hidden_layers": g.layers, "intermediate_size": g.intermediate,
        "moe_intermediate_size": g.moe_intermediate, "num_experts": g.experts,
        "num_experts_per_token": g.top_k, "num_shared_experts": g.shared,
        "moe_renormalize": True, "routed_scaling_factor": 2.446, "num_expert_group": 1,
        "topk_group": 1, "layer_types": g.layer_types(),
        "mlp_layer_types": ["dense" if i < g.dense else "sparse" for i in range(g.layers)],
        "linear_attn_config": {"num_heads": g.kda_heads, "head_dim": g.kda_head_dim,
                               "short_conv_kernel_size": g.conv_kernel},
        "num_attention_heads": g.mla_heads, "num_key_value_heads": g.mla_heads,
        "kv_lora_rank": g.kv_lora_rank, "q_lora_rank": None, "qk_nope_head_dim": g.qk_nope,
        "qk_rope_head_dim": g.qk_rope, "v_head_dim": g.v_head, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "bos_token_id": None, "eos_token_id": eos_id,
        "pad_token_id": None, "model_max_length": 4096,
        **(_K3_KEYS(g) if g.k3 else {}),
    }


def _K3_KEYS(g: Geometry) -> dict:
    """The K3 delta keys of ``Geometry.k3`` (config.json spelling)."""
    return {"hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
            "routed_expert_hidden_size": g.hidden // 2, "latent_moe_use_norm": True, "attn_res_block_size": 2,
            "q_lora_rank": 32, "mla_use_output_gate": True, "use_full_rank_gate": True,
            "linear_attn_config": {"num_heads": g.kda_heads, "head_dim": g.kda_head_dim,
                                   "short_conv_kernel_size": g.conv_kernel, "gate_lower_bound": -5.0}}


def trunk_plan(cfg: dict) -> list[TensorSpec]:
    """(canonical name, shape, kind) of every trunk tensor, in the converter's order.

    kind: "embed", "mat" (the --dtype), "vec", "norm", "a_log", "dt_bias", "conv", "router".
    """
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    Hk, d, K = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    hd = Hk * d
    nh, dn, dr, dv, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"],
                         cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"])
    E, Im, S, I = (cfg["num_experts"], cfg["moe_intermediate_size"], cfg["num_shared_experts"],
                   cfg["intermediate_size"])
    Rz, rq = cfg.get("routed_expert_hidden_size", 0), cfg["q_lora_rank"]
    plan: list[TensorSpec] = [("embed", (V, H), "embed")]
    for layer in range(cfg["num_hidden_layers"]):
        c = f"blk.{layer}."
        plan += [(c + "attn_norm", (H,), "norm"), (c + "ffn_norm", (H,), "norm")]
        if cfg.get("attn_res_block_size"):
            plan += [(c + "res.attn_norm", (H,), "norm"), (c + "res.attn_proj", (H,), "res_proj"),
                     (c + "res.mlp_norm", (H,), "norm"), (c + "res.mlp_proj", (H,), "res_proj")]
        if cfg["layer_types"][layer] == "linear_attention":
            plan += [(c + f"kda.{x}_proj", (hd, H), "mat") for x in "qkv"]
            plan += [(c + f"kda.{x}_conv", (hd, K), "conv") for x in "qkv"]
            plan += [(c + "kda.a_log", (Hk,), "a_log"), (c + "kda.dt_bias", (hd,), "dt_bias"),
                     (c + "kda.f_a", (d, H), "mat"), (c + "kda.f_b", (hd, d), "mat"),
                     (c + "kda.b_proj", (Hk, H), "mat")]
            plan += ([(c + "kda.g_proj", (hd, H), "mat")] if cfg.get("use_full_rank_gate") else
                     [(c + "kda.g_a", (d, H), "mat"), (c + "kda.g_b", (hd, d), "mat")])
            plan += [(c + "kda.o_norm", (d,), "norm"), (c + "kda.o_proj", (H, hd), "mat")]
        else:
            plan += ([(c + "mla.q_a", (rq, H), "mat"), (c + "mla.q_a_norm", (rq,), "norm"),
                      (c + "mla.q_b", (nh * (dn + dr), rq), "mat")] if rq else
                     [(c + "mla.q_proj", (nh * (dn + dr), H), "mat")])
            plan += [(c + "mla.kv_a", (r + dr, H), "mat"), (c + "mla.kv_a_norm", (r,), "norm"),
                     (c + "mla.kv_b", (nh * (dn + dv), r), "mat"),
                     (c + "mla.o_proj", (H, nh * dv), "mat")]
            if cfg.get("mla_use_output_gate"):
                plan.append((c + "mla.g_proj", (nh * dv, H), "mat"))
        if cfg["mlp_layer_types"][layer] == "dense":
            plan += [(c + "ffn.gate", (I, H), "mat"), (c + "ffn.up", (I, H), "mat"),
                     (c + "ffn.down", (H, I), "mat")]
        else:
            plan += [(c + "moe.router", (E, H), "router"), (c + "moe.router_bias", (E,), "vec")]
            if S:
                plan += [(c + "moe.shared_gate", (S * Im, H), "mat"),
                         (c + "moe.shared_up", (S * Im, H), "mat"),
                         (c + "moe.shared_down", (H, S * Im), "mat")]
            if Rz:
                plan += [(c + "moe.latent_down", (Rz, H), "mat"), (c + "moe.latent_up", (H, Rz), "mat")]
                if cfg.get("latent_moe_use_norm"):
                    plan.append((c + "moe.latent_norm", (Rz,), "norm"))
    if cfg.get("attn_res_block_size"):
        plan += [("output_res.norm", (H,), "norm"), ("output_res.proj", (H,), "res_proj")]
    return plan + [("final_norm", (H,), "norm"), ("lm_head", (V, H), "mat")]


def random_tensor(seed: int, name: str, shape: Shape, kind: str) -> np.ndarray:
    """Deterministic values for one tensor: its own stream, so names never shift each other."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
    if kind == "norm":
        values = 1.0 + 0.1 * rng.standard_normal(shape)
    elif kind == "a_log":
        values = np.log(rng.uniform(1.0, 16.0, shape))
    elif kind == "embed":
        values = rng.standard_normal(shape)
    elif kind in ("vec", "dt_bias", "conv"):
        values = 0.5 * rng.standard_normal(shape)
    else:  # a matrix: unit-variance outputs for unit-variance inputs
        values = rng.standard_normal(shape) / np.sqrt(shape[-1])
    return values.astype(np.float32)


def _matrix_format(name: str, shape: Shape, g: Geometry) -> tuple[str, int]:
    if g.dtype not in ("int8", "int4"):
        return g.dtype, 0
    if shape[-1] % g.group:
        raise ContainerError(f"--dtype {g.dtype}: tensor {name} has {shape[-1]} columns, not a multiple "
                             f"of the group {g.group}; change the geometry or --group")
    return g.dtype, g.group


def build_container(out: str | Path, *, seed: int = 0, geometry: Geometry | None = None,
                    chat_json: str = "xtml", overwrite: bool = False) -> Path:
    """Writes the synthetic container to ``out`` and returns its path.

    Raises:
        ContainerError: ``out`` exists (without ``overwrite``), the geometry cannot be
            written in the requested dtype (the message names the tensor), or the chat.json
            example is missing (see ``chat_specials``).
        ValueError: an unknown ``chat_json``.
    """
    g = geometry or Geometry()
    specials, chat = chat_specials(chat_json)
    ranks = train_ranks(list(CORPUS), g.vocab_merges)
    n_base = len(ranks)
    special_ids = [(n_base + i, text) for i, text in enumerate(specials)]
    cfg = normalise_config(raw_config(g, n_base + len(specials), special_ids[-1][0]))
    writer = ContainerWriter(out, overwrite=overwrite)
    try:
        for name, shape, kind in trunk_plan(cfg):
            values = random_tensor(seed, name, shape, kind)
            if kind in ("mat", "embed"):
                fmt, group = _matrix_format(name, shape, g)
                writer.add_tensor(name, values, fmt, group, on_disk=kind == "embed")
            else:
                writer.add_tensor(name, values, "f32")
        H, Im = cfg.get("routed_expert_hidden_size") or cfg["hidden_size"], cfg["moe_intermediate_size"]
        for layer, kind in enumerate(cfg["mlp_layer_types"]):
            if kind != "sparse":
                continue
            names = [(f"experts.{layer}.{e}.{w}", shape) for e in range(g.experts)
                     for w, shape in (("gate", (Im, H)), ("up", (Im, H)), ("down", (H, Im)))]
            fmt, group = _matrix_format(names[2][0], (H, Im), g)
            _matrix_format(names[0][0], (Im, H), g)
            experts = ([random_tensor(seed, n, s, "mat") for n, s in names[3 * e:3 * e + 3]]
                       for e in range(g.experts))
            writer.add_bank(layer, experts, g.experts, fmt, group)
        writer.set_tokenizer([token for token, _ in sorted(ranks.items(), key=lambda kv: kv[1])],
                             special_ids)
        if chat is not None:
            writer.set_chat(chat)
        quant = {"trunk": g.dtype, "experts": g.dtype, "group": g.group if g.dtype in ("int8", "int4") else 0}
        return writer.finish("kimi_k3" if g.k3 else "kimi_linear", cfg, quant)
    except BaseException:
        writer.abandon()
        raise


_FLAG_HELP = {"dense": "the first N layers have a dense MLP, the rest are MoE",
              "shared": "shared experts per MoE layer", "top_k": "experts per token",
              "vocab_merges": "BPE merges after the 256 byte tokens",
              "intermediate": "dense MLP width", "moe_intermediate": "expert width"}


def add_geometry_flags(ap: argparse.ArgumentParser) -> None:
    """``--layout`` and one ``--NAME`` per integer ``Geometry`` field (``--group`` is the
    caller's: not every tool has group quantization)."""
    ap.add_argument("--layout", help="one letter per layer: K = KDA, M = MLA (default: every 4th is MLA)")
    for field in attrs.fields(Geometry):
        if field.type == "int" and field.name != "group":
            ap.add_argument("--" + field.name.replace("_", "-"), type=int, default=field.default,
                            help=f"{_FLAG_HELP.get(field.name, '')} (default {field.default})")


def geometry_from_flags(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Geometry:
    """The ``Geometry`` the parsed flags describe (fields the parser lacks keep their
    defaults); a bad ``--seed`` or field value exits 2 naming it."""
    if args.seed < 0:
        ap.error(f"--seed must be a non-negative integer, got {args.seed}")
    values = {f.name: getattr(args, f.name) for f in attrs.fields(Geometry) if hasattr(args, f.name)}
    try:
        return Geometry(**values)
    except ValueError as exc:  # a flag's value, named by the validator
        ap.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    """The command line; prints the container path, or an error and exits 1 (2 for a bad flag)."""
    ap = argparse.ArgumentParser(prog="python -m waste.tools.make_container",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chat-json", choices=CHAT_FORMATS, default="xtml")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--dtype", choices=("f32", "bf16", "int8", "int4"), default="f32")
    ap.add_argument("--group", type=int, choices=(32, 128), default=32)
    ap.add_argument("--k3", action="store_true", help="switch every Kimi K3 delta on (arch kimi_k3)")
    add_geometry_flags(ap)
    args = ap.parse_args(argv)
    geometry = geometry_from_flags(ap, args)
    try:
        path = build_container(args.out, seed=args.seed, geometry=geometry,
                               chat_json=args.chat_json, overwrite=args.overwrite)
    except (ValueError, OSError) as exc:
        print(f"make_container: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
