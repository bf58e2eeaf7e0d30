"""Every malformed checkpoint is refused by ``python -m waste.tools.convert`` with one error
line naming the key, tensor or file, exit code 1, no traceback and nothing left behind.

One table: each case damages a copy of transformers' tiny checkpoint (built once per session)
in its config, its safetensors bytes or header, its index, or its tokenizer files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tests.engine.tiny import write_safetensors
from waste.tools import convert as cv

ST = "model.safetensors"


class Checkpoint:
    """A mutable copy of the base checkpoint; ``damage`` hooks run on the written files."""

    def __init__(self, base) -> None:
        config, tensors, files = base
        self.config = json.loads(json.dumps(config))
        self.tensors = dict(tensors)
        self.files = dict(files)
        self.damage: list[Callable[[Path], None]] = []

    def write(self, hf: Path) -> None:
        hf.mkdir()
        (hf / "config.json").write_text(json.dumps(self.config))
        write_safetensors(hf / ST, self.tensors)
        for name, data in self.files.items():
            (hf / name).write_bytes(data)
        for fn in self.damage:
            fn(hf)


@pytest.fixture(scope="module")
def base(tiny_hf):
    _, hf = tiny_hf
    hf = Path(hf)
    st = cv.SafeTensors(hf)
    tensors = {name: st.load(name) for name in st.entries}
    files = {n: (hf / n).read_bytes() for n in ("tiktoken.model", "tokenizer_config.json")}
    return json.loads((hf / "config.json").read_text()), tensors, files


# ---- damage helpers ------------------------------------------------------------------------
def edit_header(fn):
    """Rewrite model.safetensors' JSON header with ``fn(header)``; the data stays as it was."""
    def damage(hf: Path) -> None:
        raw = (hf / ST).read_bytes()
        (n,) = struct.unpack_from("<Q", raw)
        header = json.loads(raw[8:8 + n])
        fn(header)
        text = json.dumps(header).encode()
        (hf / ST).write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    return damage


def garble_header(hf: Path) -> None:
    raw = (hf / ST).read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    (hf / ST).write_bytes(raw[:8] + b"{" + b" " * (n - 1) + raw[8 + n:])


def truncate(by: int | None = None, to: int | None = None):
    def damage(hf: Path) -> None:
        raw = (hf / ST).read_bytes()
        if to is not None:
            (hf / ST).write_bytes(raw[:to])
        else:
            assert by is not None, "truncate() needs by= or to="
            (hf / ST).write_bytes(raw[:-by])
    return damage


def raw_file(name: str, data: bytes):
    def damage(hf: Path) -> None:
        (hf / name).write_bytes(data)
    return damage


def kda_lists(ck: Checkpoint, kda, full) -> None:
    ck.config.pop("layer_types")
    ck.config["linear_attn_config"] = {"kda_layers": kda, "full_attn_layers": full, "num_heads": 4,
                                       "head_dim": 16, "short_conv_kernel_size": 4}


def set_config(**values):
    return lambda ck: ck.config.update(values)


def tokenizer_config(fn):
    def mutate(ck: Checkpoint) -> None:
        data = json.loads(ck.files["tokenizer_config.json"])
        fn(data["added_tokens_decoder"])
        ck.files["tokenizer_config.json"] = json.dumps(data).encode()
    return mutate


def rank_lines(fn):
    def mutate(ck: Checkpoint) -> None:
        lines = ck.files["tiktoken.model"].decode().splitlines()
        fn(lines)
        ck.files["tiktoken.model"] = ("\n".join(lines) + "\n").encode()
    return mutate


def drop_key(key):
    return lambda ck: ck.config.pop(key)


def alias_n_group(ck: Checkpoint) -> None:
    ck.config.pop("num_expert_group")
    ck.config["n_group"] = 4


def index_without(name: str):
    def mutate(ck: Checkpoint) -> None:
        weight_map = {n: ST for n in ck.tensors if n != name}
        ck.files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    return mutate


def index_naming(file: str):
    def mutate(ck: Checkpoint) -> None:
        weight_map = {n: ST for n in ck.tensors}
        weight_map["lm_head.weight"] = file
        ck.files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    return mutate


CASES = {
    # -- 1-based layer lists
    "kda_layer_past_the_end": (lambda ck: kda_lists(ck, [1, 2, 3], [5]),
                               "linear_attn_config.full_attn_layers[0] = 5 is outside 1..4"),
    "kda_layer_is_a_string": (lambda ck: kda_lists(ck, ["1", 2, 3], [4]),
                              "linear_attn_config.kda_layers[0] must be an integer (a 1-based layer number), got '1'"),
    "kda_layers_zero_based": (lambda ck: kda_lists(ck, [0, 1, 2], [3]),
                              "kda_layers[0] = 0 is outside 1..4: the lists are 1-based"),
    "kda_layer_negative": (lambda ck: kda_lists(ck, [1, 2, -3], [4]), "kda_layers[2] = -3 is outside 1..4"),
    "layer_in_both_lists": (lambda ck: kda_lists(ck, [1, 2, 3, 4], [4]),
                            "layer 4 (1-based) is in both linear_attn_config.kda_layers and full_attn_layers"),
    "layer_twice": (lambda ck: kda_lists(ck, [1, 2, 2, 3], [4]), "kda_layers: layer 2 appears twice"),
    "kda_layers_not_a_list": (lambda ck: kda_lists(ck, 3, [4]), "kda_layers must be a list"),
    "layer_in_neither_list": (lambda ck: kda_lists(ck, [1, 2], [4]), "layer 3 (1-based) is in neither"),
    "layer_types_a_string": (set_config(layer_types="linear_attention"), "config.json: layer_types must list"),
    "mlp_layer_types_short": (set_config(mlp_layer_types=["dense"]), "config.json: mlp_layer_types must list"),
    # -- field types and values
    "hidden_size_string": (set_config(hidden_size="abc"), "config.json: hidden_size must be an integer >= 1, got 'abc'"),
    "vocab_size_float": (set_config(vocab_size=512.0), "vocab_size must be an integer >= 1, got 512.0"),
    "layers_zero": (set_config(num_hidden_layers=0), "num_hidden_layers must be an integer >= 1, got 0"),
    "experts_bool": (set_config(num_experts=True), "num_experts must be an integer >= 1, got True"),
    "kv_lora_missing": (drop_key("kv_lora_rank"), "config.json: missing kv_lora_rank"),
    "renormalize_string": (set_config(moe_renormalize="yes"), "moe_renormalize must be true or false, got 'yes'"),
    "scaling_negative": (set_config(routed_scaling_factor=-1), "routed_scaling_factor must be a number above 0"),
    "eps_string": (set_config(rms_norm_eps="1e-5"), "rms_norm_eps must be a number above 0 and below 1"),
    "hidden_act_not_a_string": (set_config(hidden_act=["silu"]), "hidden_act must be a string"),
    "eos_past_the_vocab": (set_config(eos_token_id=512), "eos_token_id must be a token id below vocab_size 512, got 512"),
    "bos_negative": (set_config(bos_token_id=-1), "bos_token_id must be a token id below vocab_size 512, got -1"),
    "linear_attn_config_a_list": (set_config(linear_attn_config=[1]), "linear_attn_config must be an object"),
    # -- what libwaste would refuse at open, refused here
    "kv_heads_differ": (set_config(num_key_value_heads=2),
                        "num_key_value_heads 2 must equal num_attention_heads 4 (MLA has no grouped KV heads)"),
    "grouped_routing": (set_config(num_expert_group=2), "num_expert_group / n_group 2 > 1: grouped routing is not supported"),
    "grouped_routing_alias": (alias_n_group, "num_expert_group / n_group 4 > 1"),
    "hidden_act_gelu": (set_config(hidden_act="gelu"), "hidden_act 'gelu' is not supported (libwaste implements silu and situ)"),
    # -- K3 keys (docs/ENGINE.md §4.2): inconsistent combinations, by name
    "situ_beta_without_situ": (set_config(activation_situ_beta=4), "activation_situ_beta is set but hidden_act is 'silu'"),
    "situ_beta_negative": (set_config(hidden_act="situ", activation_situ_beta=-4),
                           "activation_situ_beta must be a number above 0"),
    "latent_norm_without_latent": (set_config(latent_moe_use_norm=True),
                                   "latent_moe_use_norm is true but routed_expert_hidden_size is unset"),
    "lower_bound_positive": (set_config(linear_attn_config={"gate_lower_bound": 5}),
                             "linear_attn_config.gate_lower_bound must be a negative number, got 5"),
    "res_block_negative": (set_config(attn_res_block_size=-1), "attn_res_block_size must be an integer >= 0"),
    "full_gate_without_g_proj": (set_config(use_full_rank_gate=True), "missing tensors: model.layers.0.self_attn.g_proj.weight"),
    "mla_gate_without_g_proj": (set_config(mla_use_output_gate=True), "missing tensors: model.layers.3.self_attn.g_proj.weight"),
    "latent_without_projections": (set_config(routed_expert_hidden_size=32),
                                   "missing tensors: model.layers.1.block_sparse_moe.routed_expert_down_proj.weight"),
    "text_config_not_k3": (lambda ck: ck.__setattr__("config", {"model_type": "llava", "text_config": ck.config}),
                           "model_type 'llava' with a text_config is not supported"),
    "flat_model_type_unknown": (set_config(model_type="deepseek_v3"), "model_type 'deepseek_v3' is not supported"),
    "top_k_over_experts": (set_config(num_experts_per_token=9), "num_experts_per_token 9 exceeds num_experts 8"),
    # -- config.json itself
    "config_not_json": (lambda ck: ck.damage.append(raw_file("config.json", b"{")), "config.json: not valid JSON"),
    "config_a_list": (lambda ck: ck.damage.append(raw_file("config.json", b"[]")), "config.json: must be a JSON object"),
    # -- safetensors bytes and header, checked before anything is written
    "truncated_tail": (lambda ck: ck.damage.append(truncate(by=100)),
                       "tensor model.norm.weight (model.safetensors): its data ends at byte"),
    "truncated_after_header": (lambda ck: ck.damage.append(truncate(to=8 + 2)), "model.safetensors: a header of"),
    "truncated_to_nothing": (lambda ck: ck.damage.append(truncate(to=4)), "model.safetensors: 4 bytes is too short"),
    "offsets_disagree_with_shape": (
        lambda ck: ck.damage.append(edit_header(lambda h: h["model.norm.weight"].update(shape=[63]))),
        "tensor model.norm.weight (model.safetensors): data_offsets"),
    "offsets_reversed": (
        lambda ck: ck.damage.append(edit_header(lambda h: h["model.norm.weight"].update(data_offsets=[9, 1]))),
        "tensor model.norm.weight (model.safetensors): data_offsets [9, 1] must be [begin, end]"),
    "dtype_unsupported": (
        lambda ck: ck.damage.append(edit_header(lambda h: h["lm_head.weight"].update(dtype="I64"))),
        "tensor lm_head.weight (model.safetensors): dtype 'I64' is not supported"),
    "shape_not_a_list": (
        lambda ck: ck.damage.append(edit_header(lambda h: h["lm_head.weight"].update(shape="512x64"))),
        "tensor lm_head.weight (model.safetensors): shape '512x64' is not a list"),
    "header_not_json": (lambda ck: ck.damage.append(garble_header), "model.safetensors: the header is not JSON"),
    # -- the index of a sharded checkpoint
    "index_lacks_a_tensor": (index_without("lm_head.weight"),
                             "tensor lm_head.weight (model.safetensors) is missing from model.safetensors.index.json"),
    "index_names_a_missing_file": (index_naming("model-00002-of-00002.safetensors"),
                                   "weight_map names 'model-00002-of-00002.safetensors', which is not a file"),
    "index_not_json": (lambda ck: ck.files.update({"model.safetensors.index.json": b"{"}),
                       "model.safetensors.index.json: not valid JSON"),
    # -- tokenizer files
    "bad_base64": (rank_lines(lambda lines: lines.__setitem__(2, "!!!! 2")), "tiktoken.model line 3: bad base64"),
    "rank_twice": (rank_lines(lambda lines: lines.__setitem__(3, "YWI= 2")),
                   "tiktoken.model line 4: rank 2 appears twice"),
    "rank_not_a_number": (rank_lines(lambda lines: lines.__setitem__(5, "YWI= x")), "tiktoken.model line 6: expected"),
    "special_past_the_vocab": (tokenizer_config(lambda d: d.update({"10000": {"content": "<|x|>", "special": True}})),
                               "special id 10000 ('<|x|>') is not below config.json's vocab_size 512"),
    "special_spelled_twice": (tokenizer_config(lambda d: d["509"].update(content="[BOS]")),
                              "ids 508 and 509 both spell '[BOS]'"),
    "special_id_not_a_number": (tokenizer_config(lambda d: d.update({"x": {"content": "<|x|>"}})),
                                "added_tokens_decoder['x'] must be a decimal id"),
    "special_without_content": (tokenizer_config(lambda d: d["510"].pop("content")), "added_tokens_decoder['510']"),
    "tokenizer_config_not_json": (lambda ck: ck.files.update({"tokenizer_config.json": b"{"}),
                                  "tokenizer_config.json: not valid JSON"),
    "more_ranks_than_vocab": (lambda ck: ck.config.update(vocab_size=300) or ck.tensors.update(
        {"model.embed_tokens.weight": np.zeros((300, 64), np.float32),
         "lm_head.weight": np.zeros((300, 64), np.float32)}), "508 base tokens exceed config.json's vocab_size 300"),
    # -- names and shapes
    "unknown_tensor": (lambda ck: ck.tensors.update({"model.layers.0.self_attn.surprise.weight": np.zeros(2, np.float32)}),
                       "unknown tensors: model.layers.0.self_attn.surprise.weight"),
    "missing_tensor": (lambda ck: ck.tensors.pop("model.layers.3.self_attn.kv_b_proj.weight"),
                       "missing tensors: model.layers.3.self_attn.kv_b_proj.weight"),
    "wrong_shape": (lambda ck: ck.tensors.update({"model.layers.0.self_attn.q_proj.weight": np.zeros((64, 63), np.float32)}),
                    "tensor model.layers.0.self_attn.q_proj.weight: shape [64, 63], expected [64, 64]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_checkpoint_is_one_clear_error(base, tmp_path, capsys, case):
    mutate, needle = CASES[case]
    ck = Checkpoint(base)
    mutate(ck)
    ck.write(tmp_path / "hf")
    out = tmp_path / "out.waste"
    assert cv.main([str(tmp_path / "hf"), str(out), "--dtype", "f32"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("convert: error: "), captured.err
    assert needle in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]          # no output, no .tmp


def test_the_base_checkpoint_converts(base, tmp_path, capsys):
    """The table's cases fail because of their damage, not because of the copy itself."""
    Checkpoint(base).write(tmp_path / "hf")
    assert cv.main([str(tmp_path / "hf"), str(tmp_path / "out.waste"), "--dtype", "f32"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out.waste")
