"""A missing prerequisite skips, naming it; under ``WASTE_REQUIRE_ORACLE=1`` (``make test``)
it fails instead. And the tests that need no transformers weights run without torch.

The end-to-end cases run pytest in a subprocess whose ``torch`` and ``tiktoken`` imports are
made to fail by shadow packages placed first on ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.engine import conftest
from tests.engine.conftest import REPO, STRICT_ENV

# One test per prerequisite, plus tests that must not need torch at all.
NEEDS_TORCH = "tests/engine/test_oracle.py::test_f32_matches_transformers[A-1]"
NEEDS_TIKTOKEN = "tests/engine/tokenizer/test_against_tiktoken.py::test_pre_chunking_matters_and_matches"
NO_TORCH = ["tests/engine/test_robustness.py::test_missing_trunk_is_e_io",
            "tests/engine/test_hotlist.py::test_usage_path_directory_is_ignored",
            "tests/engine/test_invariants.py::test_thread_count_is_exact[f32-odd]"]


@pytest.mark.parametrize("value,is_strict", [(None, False), ("", False), ("0", False), ("1", True)])
def test_missing_skips_or_fails_by_mode(monkeypatch, value, is_strict):
    if value is None:
        monkeypatch.delenv(STRICT_ENV, raising=False)
    else:
        monkeypatch.setenv(STRICT_ENV, value)
    expected = pytest.fail.Exception if is_strict else pytest.skip.Exception
    with pytest.raises(expected, match="missing prerequisite: torch is not importable"):
        conftest.missing("torch is not importable")


def test_missing_sanitizer_runtime_fails_in_strict_mode(monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"ASan runtime \(libwaste-no-such-asan.so\)"):
        conftest.sanitizer_runtime("libwaste-no-such-asan.so")
    monkeypatch.delenv(STRICT_ENV)
    with pytest.raises(pytest.skip.Exception, match="libwaste-no-such-asan.so"):
        conftest.sanitizer_runtime("libwaste-no-such-asan.so")


def test_require_module_names_the_module(monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_for_waste is not importable.*needed here"):
        conftest.require_module("no_such_module_for_waste", "needed here")
    assert conftest.require_module("json", "stdlib").dumps([1]) == "[1]"


def run_without(tmp_path, modules, strict: bool) -> subprocess.CompletedProcess:
    """pytest on NEEDS_* and NO_TORCH with ``modules`` made unimportable."""
    shadow = tmp_path / "shadow"
    for name in modules:
        (shadow / name).mkdir(parents=True, exist_ok=True)
        (shadow / name / "__init__.py").write_text(f"raise ImportError('{name} hidden by the test')\n")
    env = {k: v for k, v in os.environ.items() if k != STRICT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if strict:
        env[STRICT_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                           NEEDS_TORCH, NEEDS_TIKTOKEN, *NO_TORCH], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_without_torch_and_tiktoken_oracles_skip_and_the_rest_passes(libwaste, tmp_path):
    run = run_without(tmp_path, ["torch", "tiktoken"], strict=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "3 passed, 2 skipped" in out, out
    assert "missing prerequisite: torch is not importable (torch hidden by the test)" in out
    assert "missing prerequisite: tiktoken is not importable (tiktoken hidden by the test)" in out


def test_strict_mode_fails_naming_the_missing_prerequisites(libwaste, tmp_path):
    run = run_without(tmp_path, ["torch", "tiktoken"], strict=True)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "3 passed" in out and "skipped" not in out.splitlines()[-1], out
    assert f"missing prerequisite: torch is not importable (torch hidden by the test); the logit " \
           f"oracle needs torch==2.13.0 ({STRICT_ENV}=1 makes this a failure" in out, out
    assert "missing prerequisite: tiktoken is not importable" in out, out


def test_make_test_runs_in_strict_mode():
    """``make test`` (the README's and CI's command) is where strict mode is switched on."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("test:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line)
    assert any(line.lstrip().startswith(f"{STRICT_ENV}=1 $(PY) -m pytest") for line in recipe), recipe
