"""The bench's measurement tools that are not run by the suite stay runnable:
bench/oracle_prefetch.patch (bench/bench_oracle.py's oracle predictor) still applies to and
compiles with the engine in this tree, and bench/policy_sim.py gives known answers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "bench" / "oracle_prefetch.patch"


def test_oracle_patch_applies_and_compiles(tmp_path):
    cc = shutil.which("cc")
    if shutil.which("git") is None or cc is None:
        pytest.skip("needs git and cc")
    shutil.copytree(ROOT / "native" / "src", tmp_path / "native" / "src")
    shutil.copytree(ROOT / "native" / "include", tmp_path / "native" / "include")
    applied = subprocess.run(["git", "apply", str(PATCH)], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, f"bench/oracle_prefetch.patch no longer applies: {applied.stderr}"
    patched = (tmp_path / "native" / "src" / "model.c").read_text()
    assert "WASTE_ORACLE_TRACE" in patched and "oracle_layer(ctx, ex, m, bank)" in patched
    native = tmp_path / "native"
    built = subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-Iinclude", "-Isrc",
                            "-fsyntax-only", "src/model.c"], cwd=native, capture_output=True, text=True)
    assert built.returncode == 0, f"the patched model.c does not compile: {built.stderr}"


def _policy_sim():
    import importlib.util
    spec = importlib.util.spec_from_file_location("policy_sim", ROOT / "bench" / "policy_sim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_policy_sim_known_answers(tmp_path):
    """bench/policy_sim.py on a hand-checked trace: the file format round-trips, Belady on a
    loop of 3 experts through 2 slots misses once per 2 accesses (the textbook optimum for a
    loop one longer than the cache), and a loop never repeats an expert on the next token."""
    sim = _policy_sim()
    trace = tmp_path / "t.bin"
    # one bank, one expert a layer: 0 1 2 0 1 2 ... (30 steps)
    rows = np.full((30, sim.ROW), -1, np.int32)
    rows[:, 0] = 0
    rows[:, 1] = np.arange(30) % 3
    rows.tofile(trace)
    seq, n_banks, n_experts = sim.load(trace)
    assert (n_banks, n_experts) == (1, 3) and seq[4] == (0, [1])
    victim, hook = sim.belady(seq, n_experts)
    # the first 2 misses fill the slots; then each miss evicts the one used furthest ahead:
    # of 28 later accesses, every other one hits
    assert sim.replay(seq, 1, 3, 2, 2, victim, hook) == pytest.approx(14 / 28)
    assert sim.replay(seq, 1, 3, 3, 3, sim.lfu_victim) == 1.0   # everything fits
    # locality: a loop of period 3 never repeats an expert on the next token
    assert sim.locality(seq, 1, 3, 0)[0] == 0.0


def test_policy_sim_row_follows_the_engine(tmp_path):
    """The trace's row width is the patch's oracle_row (bank + WE_REQS/2 ids) read from the
    engine's header, so a changed WE_REQS changes it; a trace of another width is refused."""
    sim = _policy_sim()
    header = tmp_path / "engine.h"
    header.write_text("#define WE_REQS 32  /* reads */\n")
    assert sim.trace_row_ints(header) == 17
    assert sim.ROW == sim.trace_row_ints()
    bad = tmp_path / "bad.bin"
    np.full(sim.ROW + 1, -1, np.int32).tofile(bad)
    with pytest.raises(SystemExit, match="not a whole number"):
        sim.load(bad)
