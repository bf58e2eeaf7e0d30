"""bench/oracle_prefetch.patch (bench/bench_oracle.py's oracle predictor) still applies to and
compiles with the engine in this tree, so the measurement in bench/README.md can be re-run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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
