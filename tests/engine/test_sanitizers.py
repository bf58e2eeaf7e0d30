"""The ASan+UBSan build (``make -C native asan``) runs the C tests (manifest fuzzing among
them) with LeakSanitizer on, then the robustness, hotlist and library-rule modules through
the binding itself: the cffi extension is recompiled against ``build-asan/libwaste.a`` with
the sanitizers on and loaded in place of the installed one (``WASTE_TEST_EXTENSION``),
without a sanitizer report."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.engine.conftest import EXTENSION_ENV, NATIVE, REPO, sanitizer_runtime

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
# What may skip inside the sanitizer session, and why (anything else fails this test).
EXPECTED_SKIPS = ("shadow memory is not the engine's",      # the RSS bound
                  "runs on the ASan build",                 # `make test` C binaries: run above
                  "localedef")                              # a decimal-comma locale cannot be built

LEAKY = r'''
#include <stdio.h>
#include "waste.h"
int main(int argc, char **argv) {
    waste_cfg cfg; waste_cfg_init(&cfg); cfg.usage_path = "";
    char err[512]; waste_ctx *ctx = NULL;
    if (argc < 2 || waste_open(argv[1], &cfg, &ctx, err, sizeof err)) { printf("open: %s\n", err); return 2; }
    ctx = NULL;   /* never closed: every allocation of the ctx leaks */
    return 0;
}
'''


def asan_tests_run() -> None:
    """``make test-asan`` with LeakSanitizer on: a leak in any C test fails it."""
    proc = subprocess.run(["make", "-C", str(NATIVE), "-j2", "test-asan"], capture_output=True, text=True,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "LeakSanitizer" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_leak_sanitizer_catches_a_leaked_ctx(libwaste, synthetic_f32, tmp_path):
    """The C tests run with detect_leaks=1; this proves LeakSanitizer works here and sees
    libwaste's allocations (a driver that never closes its ctx must be reported)."""
    sanitizer_runtime()
    asan_tests_run()
    src = tmp_path / "leaky.c"
    src.write_text(LEAKY)
    exe = tmp_path / "leaky"
    subprocess.run(["gcc", "-std=c11", "-g", *SANITIZE, f"-I{NATIVE / 'include'}", str(src),
                    str(NATIVE / "build-asan" / "libwaste.a"), "-lm", "-pthread", "-o", str(exe)], check=True)
    run = subprocess.run([str(exe), str(synthetic_f32)], capture_output=True, text=True,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1"))
    assert "ERROR: LeakSanitizer: detected memory leaks" in run.stderr, run.stdout + run.stderr[-2000:]
    assert "waste_open" in run.stderr


def test_asan_build_runs_robustness_and_rules(libwaste, tmp_path):
    libasan = sanitizer_runtime()
    asan_tests_run()
    from waste.adapters.native._build import make_builder

    extension = make_builder(NATIVE / "build-asan" / "libwaste.a", SANITIZE).compile(tmpdir=str(tmp_path))
    # The Python session keeps leak detection off: the interpreter and torch leave ~30 MB
    # unfreed at exit, and LeakSanitizer cannot tell libwaste's allocations from theirs
    # (libwaste's own open/eval/close paths are leak-checked by the C tests above).
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1", **{EXTENSION_ENV: extension})
    probe = subprocess.run([sys.executable, "-c", "import sys, tests.engine.conftest; "
                            "print(sys.modules['waste.adapters.native._libwaste'].__file__)"],
                           cwd=REPO, env=env, capture_output=True, text=True)
    assert probe.stdout.strip() == extension, probe.stderr   # the tests below run on the ASan build
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "-p", "no:warnings", "tests/engine/test_robustness.py", "tests/engine/test_hotlist.py",
                           "tests/engine/test_native_rules.py",
                           "tests/engine/test_k3_oracle.py::test_k3_synthetic_threads_and_kernels_are_exact"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report, report
    assert re.fullmatch(r"\d+ passed(, \d+ skipped)? in .*", proc.stdout.strip().splitlines()[-1]), report
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    unexpected = [line for line in skips if not any(reason in line for reason in EXPECTED_SKIPS)]
    assert not unexpected, unexpected
