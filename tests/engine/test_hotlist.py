"""The expert hotlist (`usage.waste`, docs/FORMAT.md §8) and memory accounting (docs/ENGINE.md §5, §7).

Counts are checked against what the engine itself reports as hits + misses; the file is parsed
here from the FORMAT.md layout with the fingerprint recomputed (FNV-1a 64 of manifest.json).
Every test works on a private copy of the default synthetic container (8 experts in each of
3 MoE layers, no torch needed): usage.waste lands next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.engine.conftest import EXTENSION_ENV, NATIVE
from tests.engine.native import open_ctx, plan_of, try_open

HEADER = struct.Struct("<8sIIQ")
ENTRY = struct.Struct("<IIQ")


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_usage(path: Path) -> tuple[int, dict[tuple[int, int], int]]:
    """(fingerprint, {(layer, expert): count}) from a usage.waste, asserting its layout."""
    raw = path.read_bytes()
    magic, version, n, fingerprint = HEADER.unpack_from(raw)
    assert (magic, version) == (b"WSTUSE01", 1)
    assert len(raw) == HEADER.size + n * ENTRY.size
    entries = [ENTRY.unpack_from(raw, HEADER.size + i * ENTRY.size) for i in range(n)]
    keys = [(layer, expert) for layer, expert, _ in entries]
    assert keys == sorted(set(keys)), "entries are unique and in (layer, expert) order"
    return fingerprint, {(layer, expert): count for layer, expert, count in entries}


def write_usage(path: Path, fingerprint: int, entries, *, magic=b"WSTUSE01", version=1, n=None) -> None:
    body = b"".join(ENTRY.pack(*e) for e in entries)
    path.write_bytes(HEADER.pack(magic, version, len(entries) if n is None else n, fingerprint) + body)


def prompt_of(n, vocab, seed=11):
    return [int(x) for x in np.random.default_rng(seed).integers(3, vocab, n)]


@pytest.fixture()
def model(synthetic_f32, tmp_path) -> Path:
    dst = tmp_path / "m.waste"
    shutil.copytree(synthetic_f32, dst)
    return dst


@pytest.fixture()
def plan(model):
    return plan_of(model)


def plan_vocab(model: Path) -> int:
    return json.loads((model / "manifest.json").read_text())["config"]["vocab_size"]


def fingerprint_of(model: Path) -> int:
    return fnv1a64((model / "manifest.json").read_bytes())


def moe_layers(model: Path) -> list[int]:
    cfg = json.loads((model / "manifest.json").read_text())["config"]
    return [i for i, kind in enumerate(cfg["mlp_layer_types"]) if kind == "sparse"]


def save(ctx, path=None) -> tuple[str, str]:
    return ctx.save_usage(path)


def note(ctx) -> str:
    stats = ctx.stats()          # keep the owning cdata alive while the string is read
    return ctx.ffi.string(stats.usage_note).decode()


# ---- counting, saving, warming -------------------------------------------------------------
def test_rerun_after_save_usage_warms_and_misses_less(model, plan):
    budget = plan.floor_bytes + 4 * plan.record_bytes           # 8 of 24 experts fit
    with open_ctx(model, ram_budget_bytes=budget) as c:
        ids = prompt_of(40, c.vocab)
        first = c.eval(ids)
        s1 = c.stats()
        assert s1.warm_bytes == 0 and s1.warm_slots == 0 and s1.usage_entries == 0
        assert s1.slots_total == 8 and s1.misses > s1.slots_total
        assert save(c) == ("OK", "")
    fingerprint, counts = read_usage(model / "usage.waste")
    assert fingerprint == fingerprint_of(model)
    assert sum(counts.values()) == s1.hits + s1.misses          # one count per expert access
    assert {layer for layer, _ in counts} <= set(moe_layers(model))
    assert all(0 <= e < 8 and n > 0 for (_, e), n in counts.items())
    assert [p.name for p in model.iterdir() if ".tmp." in p.name] == []

    with open_ctx(model, ram_budget_bytes=budget) as c:
        s = c.stats()
        assert s.usage_entries == len(counts) and s.usage_skipped == 0 and note(c) == ""
        assert s.warm_slots == min(8, len(counts)) and s.slots_used == s.warm_slots
        assert s.warm_bytes == s.warm_slots * plan.record_bytes
        assert s.misses == 0 and s.reads == 0                    # warming is not a miss
        again = c.eval(ids)
        s2 = c.stats()
        assert again.tobytes() == first.tobytes()
        assert s2.hits + s2.misses == s1.hits + s1.misses
        assert s2.misses < s1.misses
        assert save(c) == ("OK", "")
    _, merged = read_usage(model / "usage.waste")
    assert merged == {k: 2 * n for k, n in counts.items()}       # same routing, counts merged


def test_floor_budget_rerun_is_warm_and_identical(model, plan):
    with open_ctx(model, ram_budget_bytes=plan.floor_bytes) as c:
        ids = prompt_of(30, c.vocab, seed=3)
        ref = [c.eval([t]).tobytes() for t in ids]                # decode-style: one per token
        s1 = c.stats()
        assert save(c) == ("OK", "")
    with open_ctx(model, ram_budget_bytes=plan.floor_bytes) as c:
        s = c.stats()
        assert s.warm_bytes == s.slots_total * plan.record_bytes > 0
        assert [c.eval([t]).tobytes() for t in ids] == ref
        s2 = c.stats()
        assert s2.misses <= s1.misses and s2.hits + s2.misses == s1.hits + s1.misses


def test_logits_identical_with_and_without_hotlist(model, plan):
    with open_ctx(model) as c:
        c.eval(prompt_of(50, c.vocab, seed=8))
        assert save(c) == ("OK", "")
    ids = prompt_of(25, plan_vocab(model), seed=9)
    for budget in (plan.floor_bytes, 0):
        with open_ctx(model, ram_budget_bytes=budget) as warm, \
                open_ctx(model, ram_budget_bytes=budget, usage_path="") as cold:
            assert warm.stats().warm_bytes > 0 and cold.stats().warm_bytes == 0
            assert warm.eval(ids).tobytes() == cold.eval(ids).tobytes()
            assert [warm.eval([t]).tobytes() for t in ids[:5]] == [cold.eval([t]).tobytes() for t in ids[:5]]


def test_generate_counts_decode_accesses(model):
    with open_ctx(model, usage_path="") as c:
        st, _, res, _ = c.generate(prompt_of(12, c.vocab), max_tokens=6)
        assert st == "OK"
        s = c.stats()
        out = model.parent / "gen.waste"
        assert save(c, out) == ("OK", "")
    _, counts = read_usage(out)
    assert sum(counts.values()) == s.hits + s.misses == res.experts_hit + res.experts_missed


# ---- the file is a hint only ---------------------------------------------------------------
def _saved(model) -> bytes:
    with open_ctx(model) as c:
        c.eval(prompt_of(20, c.vocab))
        assert save(c) == ("OK", "")
    return (model / "usage.waste").read_bytes()


@pytest.mark.parametrize("damage, needle", [
    (lambda raw, fp: b"XXXXXX01" + raw[8:], "bad magic"),
    (lambda raw, fp: raw[:8] + struct.pack("<I", 2) + raw[12:], "version"),
    (lambda raw, fp: raw[:16] + struct.pack("<Q", fp ^ 1) + raw[24:], "fingerprint"),
    (lambda raw, fp: raw[:-8], "truncated"),
    (lambda raw, fp: raw + b"\0" * 16, "truncated"),
    (lambda raw, fp: raw[:10], "header"),
    (lambda raw, fp: raw[:12] + struct.pack("<I", 0xFFFFFFFF) + raw[16:], "more entries"),
    (lambda raw, fp: b"", "header"),
])
def test_damaged_usage_file_is_ignored(model, damage, needle):
    raw = _saved(model)
    (model / "usage.waste").write_bytes(damage(raw, fingerprint_of(model)))
    status, detail, ctx = try_open(model)
    assert status == "OK", detail
    with ctx as c:
        s = c.stats()
        assert s.warm_bytes == 0 and s.warm_slots == 0 and s.usage_entries == 0 and s.slots_used == 0
        assert needle in note(c) and "usage.waste" in note(c)
        ids = prompt_of(10, c.vocab)
        got = c.eval(ids)
    with open_ctx(model, usage_path="") as ref:
        assert got.tobytes() == ref.eval(ids).tobytes()


def test_manifest_change_invalidates_the_hotlist(model):
    _saved(model)
    m = model / "manifest.json"
    m.write_bytes(m.read_bytes() + b"\n")                        # same model, new fingerprint
    with open_ctx(model) as c:
        s = c.stats()
        assert s.warm_bytes == 0 and "fingerprint" in note(c)


def test_bad_entries_are_skipped(model):
    moe = moe_layers(model)
    dense = next(i for i in range(4) if i not in moe)
    write_usage(model / "usage.waste", fingerprint_of(model), [
        (moe[0], 3, 5), (dense, 0, 9), (moe[1], 8, 7), (1000, 0, 4), (moe[1], 1, 0), (moe[2], 7, 2**64 - 1)])
    with open_ctx(model) as c:
        s = c.stats()
        assert (s.usage_entries, s.usage_skipped, s.warm_slots) == (2, 4, 2)
        assert "skipped 4" in note(c)
        assert save(c) == ("OK", "")
    _, counts = read_usage(model / "usage.waste")
    assert counts == {(moe[0], 3): 5, (moe[2], 7): 2**64 - 1}    # saturating, never wraps


def test_damaged_record_met_while_warming_fails_open_naming_it(model, plan):
    """The file is a hint, the container is not: a record that would fail its first use fails
    the warm-up, naming the record and the hotlist."""
    layer = moe_layers(model)[0]
    write_usage(model / "usage.waste", fingerprint_of(model), [(layer, 5, 3)])
    bank = model / f"experts-L{layer}.bin"
    raw = bytearray(bank.read_bytes())
    at = 4096 + 5 * plan.record_bytes
    raw[at + 16:at + 20] = struct.pack("<I", 6)                   # record says expert 6
    bank.write_bytes(bytes(raw))
    status, detail, _ = try_open(model)
    assert status == "E_FORMAT"
    assert f"warming the expert cache from {model}/usage.waste" in detail
    assert f"expert 5 of layer {layer}: record says layer {layer} expert 6" in detail
    with open_ctx(model, usage_path="") as c:               # without the hint it opens
        assert c.stats().warm_bytes == 0


def test_usage_path_directory_is_ignored(model):
    (model / "usage.waste").mkdir()
    with open_ctx(model) as c:
        assert c.stats().warm_bytes == 0 and "regular file" in note(c)


# ---- paths ---------------------------------------------------------------------------------
def test_empty_usage_path_reads_and_writes_nothing(model):
    raw = _saved(model)
    before = sorted(p.name for p in model.iterdir())
    with open_ctx(model, usage_path="") as c:
        s = c.stats()
        assert s.warm_bytes == 0 and s.usage_entries == 0 and note(c) == ""
        c.eval(prompt_of(20, c.vocab, seed=4))
        assert save(c) == ("OK", "")                             # NULL: the configured "none"
        assert save(c, "") == ("E_ARG", "path is empty (pass NULL for the ctx's usage_path)")
    assert (model / "usage.waste").read_bytes() == raw
    assert sorted(p.name for p in model.iterdir()) == before


def test_custom_usage_path(model, tmp_path):
    elsewhere = tmp_path / "hot" / "u.bin"
    elsewhere.parent.mkdir()
    with open_ctx(model, usage_path=str(elsewhere)) as c:
        c.eval(prompt_of(20, c.vocab))
        assert save(c) == ("OK", "")
    assert elsewhere.exists() and not (model / "usage.waste").exists()
    with open_ctx(model, usage_path=str(elsewhere)) as c:
        assert c.stats().warm_bytes > 0
    with open_ctx(model) as c:                          # the default is not it
        assert c.stats().warm_bytes == 0


def test_save_failure_is_a_clear_status(model, tmp_path):
    with open_ctx(model) as c:
        c.eval(prompt_of(5, c.vocab))
        missing = tmp_path / "no-such-dir" / "usage.waste"
        status, detail = save(c, missing)
        assert status == "E_IO" and str(missing) in detail and "No such file or directory" in detail
        target = tmp_path / "a-dir"
        (target / "inside").mkdir(parents=True)                 # rename cannot replace a non-empty dir
        status, detail = save(c, target)
        assert status == "E_IO" and str(target) in detail and "rename" in detail
        assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name] == []
        if os.geteuid() != 0:
            locked = tmp_path / "locked"
            locked.mkdir()
            locked.chmod(0o500)
            try:
                status, detail = save(c, locked / "usage.waste")
                assert status == "E_IO" and "Permission denied" in detail and str(locked) in detail
            finally:
                locked.chmod(0o700)
        assert c.eval_status([5]) == ("OK", "")                  # a failed save leaves the ctx usable
        assert save(c) == ("OK", "")


def test_tokenizer_only_ctx_has_no_hotlist(model):
    with open_ctx(model, tokenizer_only=1) as c:
        status, detail = save(c)
        assert status == "E_UNSUPPORTED" and "tokenizer_only" in detail


# ---- memory accounting ---------------------------------------------------------------------
def test_allocated_matches_plan_and_peak_is_a_high_water_mark(model, plan):
    with open_ctx(model, ram_budget_bytes=plan.floor_bytes, usage_path="") as c:
        s = c.stats()
        steady = plan.trunk_bytes + plan.state_bytes + plan.scratch_bytes + s.slots_total * plan.record_bytes
        assert s.allocated_bytes == steady == plan.floor_bytes   # measured at the allocation sites
        assert s.peak_bytes == s.allocated_bytes                 # the probe buffer fit under it
        st, _, res, ev = c.generate(prompt_of(10, c.vocab), max_tokens=8)
        assert st == "OK" and any(e["piece"] for e in ev)
        s = c.stats()
        assert s.allocated_bytes == steady                       # the piece buffer was freed
        assert s.peak_bytes > steady                             # ...but it was held
    _saved(model)
    with open_ctx(model) as c:
        s = c.stats()
        assert s.usage_entries > 0
        # reading the file and ranking its counts were held on top of everything else
        assert s.peak_bytes >= s.allocated_bytes + 16 * s.usage_entries


def test_peak_rss_stays_within_budget_plus_32_mib(libwaste, tmp_path):
    """docs/ENGINE.md §7: experts far larger than the budget, VmHWM <= budget + 32 MiB (a C driver,
    so no interpreter sits in the resident set)."""
    if os.environ.get(EXTENSION_ENV):
        pytest.skip("under the sanitizer build: its shadow memory is not the engine's")
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc/self/status: VmHWM cannot be read on this system")
    from waste.tools.make_container import Geometry, build_container

    geometry = Geometry(layers=4, hidden=256, intermediate=256, moe_intermediate=1024, experts=40,
                        top_k=2, dtype="int8", vocab_merges=40)
    model = build_container(tmp_path / "big.waste", seed=1, geometry=geometry, chat_json="none")
    exe = tmp_path / "mem_driver"
    build = subprocess.run(["gcc", "-std=c11", "-O2", f"-I{NATIVE / 'include'}", str(NATIVE / "tests" / "mem_driver.c"),
                            str(libwaste), "-lm", "-pthread", "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    plan = plan_of(model)
    mib = 1 << 20
    budget = plan.floor_bytes + 6 * plan.record_bytes
    assert plan.expert_bytes > budget + 32 * mib + 40 * mib, "caching every expert must break the bound"
    run = subprocess.run([str(exe), str(model), str(budget), "96"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    got = dict(zip(run.stdout.split()[::2], map(int, run.stdout.split()[1::2])))
    assert got["budget_bytes"] == budget and got["slots"] == 2 * 2 + 6
    assert got["misses"] > 3 * got["slots"]                       # the cache really churned
    assert got["peak_bytes"] <= budget                            # the engine's own high-water mark
    assert 0 < got["vmhwm_bytes"] <= budget + 32 * mib, got
