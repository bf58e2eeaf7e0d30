"""``python -m waste.tools.synth``: a checkpoint that transformers and our converter both read.

transformers' own ``KimiLinearForCausalLM.from_pretrained`` loads every tensor it expects
(none missing, none unexpected: a missing one would be random-initialised, a renamed bias
left at zero), a ``KimiLinearConfig`` of the same parameters saves exactly our config.json, and the
container ``waste.tools.convert`` makes of the same directory gives transformers' logits
(f32, max-abs < 1e-3): so synth writes what transformers writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.engine.conftest import REPO
from waste.adapters.native import NativeEngine, NativeOptions
from waste.tools.hf_checkpoint import SafeTensors
from waste.tools.make_container import Geometry
from waste.tools.synth import synthesize

# KDA, MLA, a dense layer 0 and two MoE layers with one shared expert.
# Geometry's keyword arguments, ints but for the layout string.
SHAPE: dict[str, Any] = dict(
    layers=3, layout="KMK", hidden=64, intermediate=96, moe_intermediate=32, experts=6,
    top_k=2, shared=1, kda_heads=2, kda_head_dim=16, mla_heads=2, kv_lora_rank=32,
    qk_nope=16, qk_rope=8, v_head=16, vocab_merges=40)
FLAGS = [part for key, value in SHAPE.items() for part in (f"--{key.replace('_', '-')}", str(value))]
BIAS = "model.layers.1.block_sparse_moe.gate.e_score_correction_bias"


def start(out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "waste.tools.synth", str(out), *FLAGS, *flags],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def in_process(out: Path, seed: int, dtype: str = "f32") -> SafeTensors:
    return SafeTensors(synthesize(out, geometry=Geometry(**SHAPE, dtype=dtype), seed=seed, dtype=dtype))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The command line's f32 checkpoint, seed 3."""
    out = tmp_path_factory.mktemp("synth") / "hf"
    rc, stdout, err = finish(start(out, "--dtype", "f32", "--seed", "3"))
    assert rc == 0 and stdout.strip() == str(out), err
    return out


def transformers_config(transformers, ours: dict):
    """The config transformers builds from SHAPE's parameters (under its own argument names,
    as tests/engine/tiny.py passes them); ids and vocab size are synth's choices."""
    g = SHAPE
    return transformers.KimiLinearConfig(
        vocab_size=ours["vocab_size"], hidden_size=g["hidden"], intermediate_size=g["intermediate"],
        moe_intermediate_size=g["moe_intermediate"], num_hidden_layers=g["layers"],
        layer_types=["full_attention" if c == "M" else "linear_attention" for c in g["layout"]],
        mlp_layer_types=["dense"] + ["sparse"] * (g["layers"] - 1),
        num_attention_heads=g["mla_heads"], num_key_value_heads=g["mla_heads"],
        kv_lora_rank=g["kv_lora_rank"], q_lora_rank=None, qk_nope_head_dim=g["qk_nope"],
        qk_rope_head_dim=g["qk_rope"], v_head_dim=g["v_head"], num_local_experts=g["experts"],
        num_experts_per_tok=g["top_k"], n_shared_experts=g["shared"], n_group=1, topk_group=1,
        routed_scaling_factor=2.446, norm_topk_prob=True, linear_num_heads=g["kda_heads"],
        linear_head_dim=g["kda_head_dim"], linear_conv_kernel_dim=4,
        pad_token_id=ours["pad_token_id"], bos_token_id=ours["bos_token_id"],
        eos_token_id=ours["eos_token_id"])


def test_config_is_what_transformers_saves(torch_stack, checkpoint, tmp_path):
    _, transformers = torch_stack
    ours = json.loads((checkpoint / "config.json").read_text())
    config = transformers_config(transformers, ours)
    config.architectures, config.dtype = ["KimiLinearForCausalLM"], "float32"  # as the model's save adds
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == ours


def test_transformers_loads_every_tensor(torch_stack, checkpoint):
    _, transformers = torch_stack
    _, info = transformers.KimiLinearForCausalLM.from_pretrained(checkpoint, output_loading_info=True)
    assert {k: sorted(v) for k, v in info.items() if k != "error_msgs"} == {
        "missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}, info


def test_converted_container_matches_transformers_logits(torch_stack, libwaste, checkpoint, tmp_path):
    torch, transformers = torch_stack
    container = tmp_path / "synth.waste"
    done = subprocess.run([sys.executable, "-m", "waste.tools.convert", str(checkpoint), str(container),
                           "--dtype", "f32"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    model = transformers.KimiLinearForCausalLM.from_pretrained(checkpoint).eval()
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.config.vocab_size, 12)]
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0].double().numpy()
    with NativeEngine.open(container, NativeOptions(usage_path="")) as engine:
        got = np.array([engine.eval([t]) for t in prompt], dtype=np.float64)
    assert ref.std() > 0.3  # logits with a spread, so the comparison means something
    assert float(np.abs(got - ref).max()) < 1e-3


def test_same_seed_same_bytes_and_the_routing_bias_is_drawn(checkpoint, tmp_path):
    again, other = in_process(tmp_path / "again", 3), in_process(tmp_path / "other", 4)
    files = sorted(p.name for p in checkpoint.iterdir())
    assert files == sorted(p.name for p in (tmp_path / "again").iterdir())
    assert all((checkpoint / f).read_bytes() == (tmp_path / "again" / f).read_bytes() for f in files)
    bias = again.load(BIAS)
    assert bias.shape == (6,) and bias.std() > 0.1  # skewed routing (docs/ENGINE.md §8)
    assert not np.array_equal(bias, other.load(BIAS))


def test_bf16_holds_the_same_values_rounded(checkpoint, tmp_path):
    half, full = in_process(tmp_path / "bf16", 3, "bf16"), SafeTensors(checkpoint)
    assert half.dtype("lm_head.weight") == "BF16" and half.entries.keys() == full.entries.keys()
    for name in ("lm_head.weight", BIAS, "model.layers.0.self_attn.A_log"):
        np.testing.assert_allclose(half.load(name), full.load(name), rtol=8e-3, atol=1e-6)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_refusals_name_the_problem(checkpoint, tmp_path):
    exists, top_k, bias = (start(checkpoint), start(tmp_path / "x", "--top-k", "9"),
                           start(tmp_path / "y", "--bias-std", "-1"))
    rc, out, err = finish(exists)
    assert (rc, out) == (1, "") and f"{checkpoint} exists" in err and "Traceback" not in err
    rc, out, err = finish(top_k)
    assert rc == 2 and "--top-k 9 exceeds --experts 6" in err
    rc, out, err = finish(bias)
    assert rc == 2 and "--bias-std must be a number >= 0" in err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
