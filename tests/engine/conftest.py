"""Engine test fixtures: build libwaste once per session and make tiny containers.

The library is built with ``make -C native``; without gcc every engine test is skipped
with that reason. Checkpoints come from transformers' own KimiLinearForCausalLM (see
tiny.py); tests that need torch/transformers skip when they are not importable.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"


def pytest_configure(config):
    config.addinivalue_line("markers", "oracle: compares libwaste logits against transformers")


@pytest.fixture(scope="session")
def libwaste() -> Path:
    """Path to a freshly built native/build/libwaste.so."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("gcc is not installed: cannot build libwaste")
    proc = subprocess.run(["make", "-C", str(NATIVE), "-j2"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"make -C native failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return NATIVE / "build" / "libwaste.so"


@pytest.fixture(scope="session")
def torch_stack():
    """(torch, transformers) or a skip naming what is missing."""
    torch = pytest.importorskip("torch", reason="torch is not importable: the oracle needs torch==2.13.0")
    transformers = pytest.importorskip("transformers", reason="transformers is not importable (needs 5.23.0)")
    if not hasattr(transformers, "KimiLinearForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no KimiLinearForCausalLM")
    torch.set_num_threads(1)
    return torch, transformers


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_f32(torch_stack, tiny_dir, libwaste):
    """(hf_model, container path) for the spec's tiny config, f32 container."""
    from tests.engine import tiny

    model, hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-a", tiny.CONFIG_A, seed=0)
    out = tiny.convert(hf, tiny_dir / "a-f32.waste", "f32")
    return model, out
