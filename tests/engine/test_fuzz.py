"""The libFuzzer targets (native/fuzz/: tokenizer, manifest reader, JSON reader, tokenizer
files) build with clang under ASan + UBSan and run a short smoke from the committed seeds
(which include the inputs of every crash fixed so far): any crash, sanitizer report, leak or
failed property fails the test. Long runs are ``make fuzz`` (README, "Fuzzing"). clang comes from ``make
fuzz-deps`` (run by ``make test``); without it the test says what is missing (a failure
under ``WASTE_REQUIRE_ORACLE=1``)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.engine.conftest import NATIVE, missing

TARGETS = sorted(p.stem for p in (NATIVE / "fuzz").glob("fuzz_*.c"))
SMOKE_RUNS = 4000


def test_every_target_has_seeds_and_a_dictionary():
    assert TARGETS == ["fuzz_json", "fuzz_manifest", "fuzz_tokenizer", "fuzz_tokfiles"]
    for target in TARGETS:
        assert any((NATIVE / "fuzz" / "corpus" / target).iterdir()), target
        assert (NATIVE / "fuzz" / f"{target}.dict").is_file(), target


@pytest.fixture(scope="module")
def fuzz_built():
    probe = subprocess.run(["make", "-s", "-C", str(NATIVE), "fuzz-check"], capture_output=True, text=True)
    if probe.returncode != 0:
        missing("clang with libFuzzer (-fsanitize=fuzzer,address,undefined) cannot build a probe "
                f"({(probe.stderr or probe.stdout).strip()[-300:]}); `make fuzz-deps` installs it")
    build = subprocess.run(["make", "-C", str(NATIVE), "-j2", "fuzz-build"], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_smoke(fuzz_built, target):
    proc = subprocess.run(["make", "-C", str(NATIVE), "fuzz-smoke", f"FUZZ_TARGETS={target}",
                           f"SMOKE_RUNS={SMOKE_RUNS}"], capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"Done {SMOKE_RUNS} runs" in out, out[-3000:]
    for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "property failed", "deadly signal"):
        assert bad not in out, out[-6000:]
    done = re.search(r"#\d+\s+DONE\s+cov: (\d+) ft: (\d+)", out)
    assert done and int(done.group(1)) > 0, out[-3000:]


def test_a_failing_input_fails_the_smoke(fuzz_built, tmp_path):
    """The smoke's failure path works: a seed that trips libFuzzer (here a malloc over a 1 MiB
    limit: the JSON reader allocates ~70 bytes of DOM per input byte) stops `make fuzz-smoke`
    with a non-zero status and the report this test looks for."""
    (tmp_path / "big.json").write_text("[" + "0," * 20000 + "0]")
    proc = subprocess.run(["make", "-C", str(NATIVE), "fuzz-smoke", "FUZZ_TARGETS=fuzz_json", "SMOKE_RUNS=10",
                           f"FUZZ_ARGS=-malloc_limit_mb=1 {tmp_path}"], capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "out-of-memory (malloc(" in out, out[-3000:]


def test_long_text_smoke(fuzz_built):
    """fuzz_tokenizer's -waste_long=1 campaign: texts repeated past Kimi's 25,000 code-point run
    limit, so the pre-chunking cuts (and specials split by a cut) are fuzzed too."""
    proc = subprocess.run(["make", "-C", str(NATIVE), "fuzz-smoke", "FUZZ_TARGETS=fuzz_tokenizer",
                           "SMOKE_RUNS=300", "FUZZ_ARGS=-waste_long=1"], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Done 300 runs" in out, out[-3000:]
    for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "property failed", "deadly signal"):
        assert bad not in out, out[-6000:]
