"""The ASan+UBSan build (``make -C native asan``) runs the C tests (manifest fuzzing among
them) and the robustness and hotlist modules without a sanitizer report."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.engine.conftest import NATIVE, REPO


def sanitizer_runtime() -> str:
    out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not out or not os.path.isabs(out) or not os.path.exists(out):
        pytest.skip("the ASan runtime (libasan.so) is not available to gcc")
    return out


def test_asan_build_runs_c_tests_and_robustness(libwaste, tiny_f32):
    libasan = sanitizer_runtime()
    proc = subprocess.run(["make", "-C", str(NATIVE), "-j2", "test-asan"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env = dict(os.environ, WASTE_TEST_LIB=str(NATIVE / "build-asan" / "libwaste.so"), LD_PRELOAD=libasan,
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                           "tests/engine/test_robustness.py", "tests/engine/test_hotlist.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report, report
