"""The ASan+UBSan build (``make -C native asan``) runs the C tests (manifest fuzzing among
them), then the robustness and hotlist modules through the binding itself: the cffi
extension is recompiled against ``build-asan/libwaste.a`` with the sanitizers on and loaded
in place of the installed one (``WASTE_TEST_EXTENSION``), without a sanitizer report."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.engine.conftest import EXTENSION_ENV, NATIVE, REPO, sanitizer_runtime

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]


def test_asan_build_runs_c_tests_and_robustness(libwaste, tmp_path):
    libasan = sanitizer_runtime()
    proc = subprocess.run(["make", "-C", str(NATIVE), "-j2", "test-asan"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from waste.adapters.native._build import make_builder

    extension = make_builder(NATIVE / "build-asan" / "libwaste.a", SANITIZE).compile(tmpdir=str(tmp_path))
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1", **{EXTENSION_ENV: extension})
    probe = subprocess.run([sys.executable, "-c", "import sys, tests.engine.conftest; "
                            "print(sys.modules['waste.adapters.native._libwaste'].__file__)"],
                           cwd=REPO, env=env, capture_output=True, text=True)
    assert probe.stdout.strip() == extension, probe.stderr   # the tests below run on the ASan build
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                           "tests/engine/test_robustness.py", "tests/engine/test_hotlist.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report, report
    summary = proc.stdout.strip().splitlines()[-1]
    # Only the RSS bound skips there: ASan's shadow memory is not the engine's.
    assert re.fullmatch(r"\d+ passed, 1 skipped in .*", summary), report
