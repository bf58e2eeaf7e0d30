"""The ASan+UBSan build (``make -C native asan``) runs the C tests (manifest fuzzing among
them) with LeakSanitizer on, and the robustness, hotlist and library-rule modules without a
sanitizer report."""

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


LEAKY = r'''
#include <stdio.h>
#include "waste.h"
int main(int argc, char **argv) {
    waste_cfg cfg; waste_cfg_init(&cfg); cfg.usage_path = "";
    char err[512]; waste_ctx *ctx = NULL;
    if (waste_open(argv[1], &cfg, &ctx, err, sizeof err)) { printf("open: %s\n", err); return 2; }
    ctx = NULL;   /* never closed: every allocation of the ctx leaks */
    return 0;
}
'''


def asan_lib_built() -> None:
    proc = subprocess.run(["make", "-C", str(NATIVE), "-j2", "asan"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_leak_sanitizer_catches_a_leaked_ctx(libwaste, tiny_f32, tmp_path):
    """The C tests run with detect_leaks=1; this proves LeakSanitizer works here and sees
    libwaste's allocations (a driver that never closes its ctx must be reported)."""
    sanitizer_runtime()
    asan_lib_built()
    src = tmp_path / "leaky.c"
    src.write_text(LEAKY)
    exe = tmp_path / "leaky"
    subprocess.run(["gcc", "-std=c11", "-g", "-fsanitize=address,undefined", f"-I{NATIVE / 'include'}", str(src),
                    str(NATIVE / "build-asan" / "libwaste.a"), "-lm", "-pthread", "-o", str(exe)], check=True)
    run = subprocess.run([str(exe), str(tiny_f32[1])], capture_output=True, text=True,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1"))
    if "LeakSanitizer has encountered a fatal error" in run.stderr or "LeakSanitizer does not work" in run.stderr:
        pytest.skip(f"LeakSanitizer cannot run in this environment: {run.stderr[-300:]}")
    assert "ERROR: LeakSanitizer: detected memory leaks" in run.stderr, run.stdout + run.stderr[-2000:]
    assert "waste_open" in run.stderr


def test_asan_build_runs_c_tests_and_robustness(libwaste, tiny_f32):
    libasan = sanitizer_runtime()
    proc = subprocess.run(["make", "-C", str(NATIVE), "-j2", "test-asan"], capture_output=True, text=True,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "LeakSanitizer" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    # The Python session keeps leak detection off: the interpreter and torch leave ~30 MB
    # unfreed at exit, and LeakSanitizer cannot tell libwaste's allocations from theirs
    # (libwaste's own open/eval/close paths are leak-checked by the C tests above).
    env = dict(os.environ, WASTE_TEST_LIB=str(NATIVE / "build-asan" / "libwaste.so"), LD_PRELOAD=libasan,
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                           "tests/engine/test_robustness.py", "tests/engine/test_hotlist.py",
                           "tests/engine/test_native_rules.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report, report
