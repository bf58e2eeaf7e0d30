"""Library rules and container refusals added after the issue-4 audit (engine.md §1–§3):
each test names the rule it proves. ``WASTE_TEST_LIB`` points the module at another build
(the ASan/UBSan one, see test_sanitizers.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.engine.native import open_ctx, try_open


@pytest.fixture(scope="module")
def lib(libwaste):
    return Path(os.environ.get("WASTE_TEST_LIB") or libwaste)


@pytest.fixture()
def copy(tiny_f32, tmp_path):
    """A fresh copy of the tiny f32 container (with tokenizer files)."""
    dst = tmp_path / "m.waste"
    shutil.copytree(tiny_f32[1], dst)
    return dst


def edit_manifest(path: Path, fn) -> None:
    m = json.loads((path / "manifest.json").read_text())
    fn(m)
    (path / "manifest.json").write_text(json.dumps(m))


def tensor(m, name):
    return next(t for t in m["tensors"] if t["name"] == name)


# ---- engine.md §3: only the input embedding is read from disk ---------------------------
@pytest.mark.parametrize("name", ["lm_head", "final_norm", "blk.1.moe.router", "blk.0.kda.q_proj"])
def test_on_disk_is_refused_except_for_the_embedding(lib, copy, name):
    edit_manifest(copy, lambda m: tensor(m, name).update(on_disk=True))
    st, detail, ctx = try_open(lib, copy)
    assert ctx is None
    assert st == "E_FORMAT" and f"tensor {name}: on_disk" in detail, detail


def test_a_resident_embedding_is_fine(lib, copy):
    edit_manifest(copy, lambda m: tensor(m, "embed").update(on_disk=False))
    with open_ctx(lib, copy) as c:
        assert c.eval_status([3, 4, 5]) == ("OK", "")


# ---- engine.md §4.3: transcendentals are the engine's own -------------------------------
def test_the_library_imports_no_transcendentals_from_libm(lib):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed: cannot list libwaste's imports")
    import subprocess

    out = subprocess.run([nm, "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    imported = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    libm = {"exp", "expf", "log", "logf", "log1p", "log1pf", "expm1", "expm1f", "tanh", "tanhf", "pow", "powf",
            "exp2", "exp2f"}
    assert not imported & libm, f"libwaste imports {sorted(imported & libm)} from libm"
    # sqrt and fma are IEEE-exact (correctly rounded), so libm's are allowed.


# ---- the C tests (native/tests/test_*.c) under pytest -----------------------------------
def test_c_tests_pass(libwaste):
    """``make -C native test``: API rules, sampling, numerics, manifest fuzzing with data files.
    (test_sanitizers.py runs the same binaries built with ASan/UBSan.)"""
    import subprocess

    from tests.engine.conftest import NATIVE

    proc = subprocess.run(["make", "-C", str(NATIVE), "test"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in ("test_api: ok", "test_sampling: ok", "test_numerics:", "data campaign: 1000 runs"):
        assert name in proc.stdout, proc.stdout[-4000:]
