"""Bad containers, bad arguments and misuse give a clear status and detail, never a crash.

Each case damages a copy of the default synthetic container (no torch needed). The
sanitizer run (test_sanitizers.py) repeats this module on the ASan+UBSan build."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.engine.manifests import edit_manifest, tensor
from tests.engine.native import open_ctx, plan_of, try_open


@pytest.fixture()
def copy(synthetic_f32, tmp_path):
    """A fresh copy of the synthetic f32 container (with tokenizer files)."""
    dst = tmp_path / "m.waste"
    shutil.copytree(synthetic_f32, dst)
    return dst


# ---- manifest ----------------------------------------------------------------------------
@pytest.mark.parametrize("mutate,status,needle", [
    (lambda m: m.update(format_version=999), "E_FORMAT", "format_version 999"),
    (lambda m: m.pop("format_version"), "E_FORMAT", "missing field format_version"),
    (lambda m: m.update(arch="glm5"), "E_UNSUPPORTED", 'arch "glm5"'),
    (lambda m: m.update(arch="kimi_k2"), "E_UNSUPPORTED", 'arch "kimi_k2"'),
    (lambda m: m["config"].update(attn_res_block_size=12), "E_FORMAT", "missing tensor output_res.norm"),
    (lambda m: m["config"].update(hidden_act="gelu"), "E_UNSUPPORTED", "config.hidden_act"),
    (lambda m: m["config"].update(hidden_act="situ"), "E_FORMAT", "config.activation_situ_beta"),
    (lambda m: m["config"].update(activation_situ_beta=4), "E_FORMAT", "config.activation_situ_beta is set"),
    (lambda m: m["config"].update(latent_moe_use_norm=True), "E_FORMAT", "config.latent_moe_use_norm"),
    (lambda m: m["config"].update(routed_expert_hidden_size=32), "E_FORMAT", "banks[0].shapes"),
    (lambda m: m["config"].update(gate_lower_bound=-5), "E_FORMAT", "config.gate_lower_bound is set"),
    (lambda m: m["config"].update(kda_decay="lower_bound"), "E_FORMAT", "config.gate_lower_bound"),
    (lambda m: m["config"].update(kda_decay="lower_bound", gate_lower_bound=2), "E_FORMAT",
     "config.gate_lower_bound must be"),
    (lambda m: m["config"].update(kda_decay="clamp"), "E_UNSUPPORTED", "config.kda_decay"),
    (lambda m: m["config"].update(use_full_rank_gate=True), "E_FORMAT", "blk.0.kda.g_a is not a tensor"),
    (lambda m: m["config"].update(mla_use_output_gate="yes"), "E_FORMAT", "config.mla_use_output_gate"),
    (lambda m: m["config"].pop("kv_lora_rank"), "E_FORMAT", "missing field config.kv_lora_rank"),
    (lambda m: m["config"].update(hidden_size=1 << 40), "E_FORMAT", "config.hidden_size"),
    (lambda m: m["config"].update(num_experts=-3), "E_FORMAT", "config.num_experts"),
    (lambda m: m["config"].update(num_expert_group=8), "E_UNSUPPORTED", "num_expert_group"),
    (lambda m: m["config"]["layer_types"].pop(), "E_FORMAT", "config.layer_types"),
    (lambda m: m.update(tensors=[t for t in m["tensors"] if t["name"] != "blk.0.kda.q_proj"]),
     "E_FORMAT", "missing tensor blk.0.kda.q_proj"),
    (lambda m: tensor(m, "lm_head").update(shape=[1 << 40, 64]), "E_FORMAT", "tensor lm_head: shape[0]"),
    (lambda m: tensor(m, "lm_head").update(shape=[1 << 23, 1 << 23]), "E_FORMAT", "tensor lm_head: length"),
    (lambda m: tensor(m, "lm_head").update(length=12), "E_FORMAT", "tensor lm_head: length 12"),
    (lambda m: tensor(m, "final_norm").update(offset=1 << 50), "E_FORMAT", "tensor final_norm at offset"),
    (lambda m: tensor(m, "final_norm").update(offset=(1 << 64) - 64), "E_FORMAT", "final_norm"),
    (lambda m: tensor(m, "blk.1.ffn_norm").update(format="int4", group=32, length=68 // 2 + 2),
     "E_FORMAT", "blk.1.ffn_norm"),
    (lambda m: m["banks"][0].update(record_bytes=4096), "E_FORMAT", "banks[0].record_bytes"),
    (lambda m: m["banks"][0].update(file="../x.bin"), "E_FORMAT", "banks[0].file"),
    (lambda m: m["banks"].pop(), "E_FORMAT", "banks has 2 entries"),
])
def test_bad_manifest_is_refused_by_name(copy, mutate, status, needle):
    edit_manifest(copy, mutate)
    st, detail, ctx = try_open(copy)
    assert ctx is None
    assert st == status and needle in detail, detail


@pytest.mark.parametrize("text", ["", "{", '{"format_version": 1,}', "[" * 100 + "]" * 100,
                                  '{"a": "' + "x" * 5000 + '"}', '{"format_version": 1} trailing',
                                  '{"s": "\\ud800"}', "\x00"])
def test_malformed_json_is_e_format(copy, text):
    (copy / "manifest.json").write_text(text)
    st, detail, _ = try_open(copy)
    assert st == "E_FORMAT" and "manifest.json" in detail, detail


def test_missing_trunk_is_e_io(copy):
    (copy / "trunk.bin").unlink()
    st, detail, _ = try_open(copy)
    assert st == "E_IO" and "trunk.bin" in detail


# ---- banks and records ----------------------------------------------------------------------
def test_truncated_bank_is_refused_at_open_without_verify(copy):
    bank = copy / "experts-L2.bin"
    with open(bank, "r+b") as f:
        f.truncate(bank.stat().st_size - 4096)
    st, detail, _ = try_open(copy, verify=0)
    assert st == "E_FORMAT"
    assert "experts-L2.bin" in detail and "layer 2" in detail and "truncated" in detail


def flip_bodies(bank: Path) -> None:
    """Flips one body byte of every record, leaving headers intact."""
    hdr = bank.read_bytes()[:4096]
    record = int.from_bytes(hdr[56:64], "little")
    n = int.from_bytes(hdr[16:20], "little")
    with open(bank, "r+b") as f:
        for e in range(n):
            at = 4096 + e * record + 256 + 5
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x10]))


def test_flipped_byte_fails_under_verify_naming_the_record_and_poisons(copy):
    flip_bodies(copy / "experts-L2.bin")
    ids = list(range(3, 20))
    with open_ctx(copy, verify=1) as c:
        st, detail = c.eval_status(ids)
        assert st == "E_IO"
        assert re.search(r"expert \d+ of layer 2: checksum mismatch", detail), detail
        assert c.eval_status([5]) [0] == "E_STATE"          # poisoned until reset
        assert c.lib.waste_snapshot_save(c.ctx, c.ffi.NULL, 0, c.ffi.new("uint64_t *")) == c.lib.WASTE_E_STATE
        c.reset()
        assert c.position() == 0
        assert c.eval_status(ids)[0] == "E_IO"                # still corrupt, still caught
    with open_ctx(copy, verify=0) as c:
        assert c.eval_status(ids) == ("OK", "")             # completes without verify


def test_damaged_record_header_is_e_format_naming_expert_and_layer(copy):
    bank = copy / "experts-L1.bin"
    hdr = bank.read_bytes()[:4096]
    record = int.from_bytes(hdr[56:64], "little")
    with open(bank, "r+b") as f:
        for e in range(8):
            f.seek(4096 + e * record + 16)                   # the expert field
            f.write((77).to_bytes(4, "little"))
    with open_ctx(copy) as c:
        st, detail = c.eval_status(list(range(3, 12)))
        assert st == "E_FORMAT" and re.search(r"expert \d+ of layer 1: record says layer 1 expert 77", detail), detail


def test_budget_below_floor_names_the_floor(copy):
    st, detail, _ = try_open(copy, ram_budget_bytes=1 << 20)
    assert st == "E_BUDGET"
    assert re.search(r"budget 1048576 below the model's floor \d+ \(trunk \d+ \+ state \d+ \+ scratch \d+ "
                     r"\+ vision 0 \+ min cache \d+\)", detail), detail


def test_plan_matches_open(copy):
    plan = plan_of(copy)
    with open_ctx(copy) as c:
        s = c.stats()
        assert s.budget_bytes == plan.budget_bytes
        assert s.slots_total == plan.slots
        assert s.allocated_bytes == plan.floor_bytes - plan.min_cache_bytes + plan.slots * plan.record_bytes
        assert plan.record_bytes % 4096 == 0 and plan.min_cache_bytes == 2 * 2 * plan.record_bytes


# ---- arguments, context, busy, abort ----------------------------------------------------------
def test_context_bound_and_arguments(copy):
    with open_ctx(copy, ctx_tokens=16) as c:
        st, detail = c.eval_status(list(range(3, 20)))
        assert st == "E_CTX" and "ctx_tokens 16" in detail and c.position() == 0
        assert c.eval_status([])[0] == "E_ARG"
        assert c.eval_status([c.vocab])[0] == "E_ARG"
        assert c.eval_status([-1])[0] == "E_ARG"
        st, _, res, ev = c.generate(list(range(3, 19)))       # fills the context exactly
        assert st == "OK" and res.stop_reason == 3 and len(ev) == 1 and c.position() == 16
        st, _, _, _ = c.generate([5])
        assert st == "E_CTX"


def test_reentrant_and_concurrent_calls_are_busy(copy):
    with open_ctx(copy) as c:
        seen = []

        def on_token(ev):
            seen.append(c.eval_status([5])[0])                  # re-entrant, same thread
            out = []
            t = threading.Thread(target=lambda: out.append(c.eval_status([5])[0]))
            t.start()
            t.join()
            seen.append(out[0])                                 # concurrent, another thread
            return 0

        st, _, res, _ = c.generate([3, 4, 5], max_tokens=3, on_token=on_token)
        assert st == "OK" and res.tokens_generated == 3
        assert seen == ["E_BUSY"] * 6
        assert c.position() == 5


def test_abort_cancels_and_clears(copy):
    with open_ctx(copy) as c:
        c.abort()
        assert c.eval_status([3, 4])[0] == "E_CANCELLED"
        assert c.position() == 0
        assert c.eval_status([3, 4]) == ("OK", "")           # the flag was cleared
        st, _, res, ev = c.generate([5, 6], max_tokens=10, on_token=lambda ev: (c.abort(), 0)[1])
        assert st == "E_CANCELLED" and res.tokens_generated == 1 and len(ev) == 1
        assert c.position() == 4                              # prompt evaluated, no sampled token


def test_snapshot_refusals_leave_ctx_untouched(copy, tmp_path):
    with open_ctx(copy) as c:
        c.eval([3, 4, 5])
        blob = bytearray(c.snapshot())
        blob[40] ^= 1
        assert c.restore_status(bytes(blob))[0] == "E_FORMAT"
        assert c.restore_status(bytes(blob[:-8]))[0] == "E_FORMAT"
        assert c.position() == 3
    other = tmp_path / "other.waste"
    shutil.copytree(copy, other)
    edit_manifest(other, lambda m: m["config"].update(rms_norm_eps=2e-5))   # a different model
    with open_ctx(copy) as a, open_ctx(other) as b:
        a.eval([3, 4])
        st, detail = b.restore_status(a.snapshot())
        assert st == "E_FORMAT" and "different model" in detail and b.position() == 0


def _segment(c, whole=0) -> bytes:
    size, base, n = c.ffi.new("uint64_t *"), c.ffi.new("uint64_t *"), c.ffi.new("uint64_t *")
    c.check(c.lib.waste_snapshot_segment_size(c.ctx, whole, size, base))
    buf = c.ffi.new("char[]", size[0])
    c.check(c.lib.waste_snapshot_segment_save(c.ctx, whole, buf, size[0], n))
    return c.ffi.unpack(buf, n[0])


def _load_chain(c, segments) -> tuple[str, str]:
    keep = [c.ffi.from_buffer(s) for s in segments]
    return c.status_of(c.lib.waste_snapshot_chain_load(
        c.ctx, c.ffi.new("void *[]", keep), c.ffi.new("uint64_t[]", [len(s) for s in segments]),
        len(segments)))


def test_segment_chain_refusals_leave_ctx_untouched(copy, tmp_path):
    """docs/FORMAT.md §7.1: a flipped byte anywhere in a chain (header, ids, state, crc) or a
    segment from another model is E_FORMAT, and the ctx keeps its state."""
    with open_ctx(copy) as c:
        c.eval([3, 4, 5])
        root = _segment(c)
        c.eval([6, 7])
        child = _segment(c)
        assert _load_chain(c, [root, child]) == ("OK", "") and c.position() == 5
        c.reset()
        c.eval([9])
        rng = np.random.default_rng(0)
        for which, seg in enumerate((root, child)):
            for at in list(range(52)) + list(rng.integers(52, len(seg), 100)) + [len(seg) - 1]:
                broken = bytearray(seg)
                broken[at] ^= 0x10
                chain = [bytes(broken), child] if which == 0 else [root, bytes(broken)]
                st, detail = _load_chain(c, chain)
                assert st == "E_FORMAT" and f"segment {which}" in detail, (which, at, detail)
                assert c.position() == 1
        assert _load_chain(c, [root, child[:-1]])[0] == "E_FORMAT"
    other = tmp_path / "other.waste"
    shutil.copytree(copy, other)
    edit_manifest(other, lambda m: m["config"].update(rms_norm_eps=2e-5))
    with open_ctx(other) as b:
        st, detail = _load_chain(b, [root, child])
        assert st == "E_FORMAT" and "different model" in detail and b.position() == 0


def test_container_without_tokenizer_opens(copy):
    (copy / "tokenizer.tiktoken").unlink()
    (copy / "specials.json").unlink()
    edit_manifest(copy, lambda m: m.update(tokenizer=None))
    with open_ctx(copy) as c:
        n = c.ffi.new("uint64_t *")
        out = c.ffi.new("int32_t[8]")
        assert c.name(c.lib.waste_tokenize(c.ctx, b"hi", 2, 0, out, 8, n)) == "E_UNSUPPORTED"
        assert "no tokenizer" in c.detail()
        assert c.eval_status([3, 4]) == ("OK", "")
        st, _, res, ev = c.generate([5], max_tokens=2)
        assert st == "OK" and all(e["piece"] == b"" for e in ev)


def test_struct_size_and_unsupported_options(copy):
    st, detail, _ = try_open(copy, struct_size=8)
    assert st == "E_ARG" and "struct_size" in detail
    st, detail, _ = try_open(copy, vision=1)
    assert st == "E_UNSUPPORTED" and "vision" in detail
    # reading ahead exists (docs/ENGINE.md §5); its bad values are refused by name
    for fields, words in (({"io_threads": 65}, "io_threads 65"), ({"lookahead": 1}, "needs cfg.io_threads"),
                          ({"io_threads": 1, "lookahead": 2}, "lookahead 2")):
        st, detail, _ = try_open(copy, **fields)
        assert st == "E_ARG" and words in detail, (fields, detail)
    with open_ctx(copy) as c:
        n = c.ffi.new("uint32_t *")
        assert c.name(c.lib.waste_image_add(c.ctx, c.ffi.NULL, 1, 1, n)) == "E_UNSUPPORTED"
        assert c.save_usage("")[0] == "E_ARG"                        # the hotlist: test_hotlist.py


def test_exclusive_open_is_busy_on_contention(copy):
    with open_ctx(copy, exclusive_open=1):
        st, detail, _ = try_open(copy, exclusive_open=1)
        assert st == "E_BUSY" and "locked" in detail


@pytest.mark.parametrize("cpu_list,n_threads,needle", [("3-1", 0, 'cfg.cpu_list "3-1"'), ("0,x", 0, "cfg.cpu_list"),
                                                        ("", 0, "cfg.cpu_list"), ("0", 4, "exceeds the 1 CPUs")])
def test_bad_cpu_list_is_e_arg(copy, cpu_list, n_threads, needle):
    st, detail, _ = try_open(copy, cpu_list=cpu_list, n_threads=n_threads)
    assert st == "E_ARG" and needle in detail, detail


def test_tokenizer_calls_through_the_api(copy):
    specials = {s["text"]: s["id"] for s in json.loads((copy / "specials.json").read_text())}
    with open_ctx(copy) as c:
        n_base = c.info.n_base_vocab
        assert n_base == c.vocab - len(specials) and c.info.has_tokenizer == 1
        text = "a<|sep|>b[EOS]".encode()
        plain = c.tokenize(text)
        assert all(i < n_base for i in plain) and c.detokenize(plain) == text
        marked = c.tokenize(text, markup=True)
        assert {specials["<|sep|>"], specials["[EOS]"]} <= set(marked) and c.detokenize(marked) == text
        n = c.ffi.new("uint64_t *")
        out = c.ffi.new("int32_t[8]")
        assert c.name(c.lib.waste_tokenize(c.ctx, b"hi", 2, 1, out, 8, n)) == "E_ARG"
        assert "no bos_token_id" in c.detail()                 # the synthetic model has none
    edit_manifest(copy, lambda m: m["config"].update(bos_token_id=specials["<|open|>"]))
    with open_ctx(copy) as c:
        assert c.tokenize(b"hi", add_bos=True)[0] == c.info.bos_id == specials["<|open|>"]
        n = c.ffi.new("uint64_t *")
        out = c.ffi.new("int32_t[1]")
        st = c.lib.waste_tokenize(c.ctx, b"hello world", 11, 1, out, 1, n)
        assert c.name(st) == "E_SPACE" and n[0] == len(c.tokenize(b"hello world")) + 1
        buf = c.ffi.new("char[2]")
        arr = c.ffi.new("int32_t[]", plain)
        assert c.name(c.lib.waste_detokenize(c.ctx, arr, len(plain), buf, 2, n)) == "E_SPACE" and n[0] == len(text)
        bad = c.ffi.new("int32_t[]", [c.vocab + 5])
        assert c.name(c.lib.waste_detokenize(c.ctx, bad, 1, buf, 2, n)) == "E_ARG" and "ids[0]" in c.detail()


def test_tokenizer_only_ctx(copy):
    with open_ctx(copy, tokenizer_only=1) as c:
        assert c.tokenize(b"abc")
        st, detail = c.eval_status([3])
        assert st == "E_UNSUPPORTED" and "tokenizer_only" in detail


def test_direct_io_is_reported(copy):
    with open_ctx(copy, direct_io=0) as c:
        s = c.stats()
        assert s.direct_io == 0 and c.ffi.string(s.io_note).decode() == "direct_io disabled by cfg"
        assert c.eval_status([3, 4]) == ("OK", "")
    with open_ctx(copy) as c:
        s = c.stats()
        note = c.ffi.string(s.io_note).decode()
        assert (s.direct_io == 1 and note == "") or (s.direct_io == 0 and "O_DIRECT unavailable" in note), note
        assert c.eval_status([3, 4]) == ("OK", "")
