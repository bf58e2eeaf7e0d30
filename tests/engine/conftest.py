"""Engine test fixtures: libwaste through the API-mode binding, containers, prerequisites.

Prerequisites are gcc (libwaste, the C tokenizer), tiktoken (the tokenizer oracle), torch +
transformers (the logit oracle) and libasan (the sanitizer run). A missing one skips the
tests that need it, naming it; with ``WASTE_REQUIRE_ORACLE=1`` (``make test`` sets it: it is
the command CI runs) it is a failure naming it, since there it means a broken setup.

Most containers are synthetic (``waste.tools.make_container``, no torch); only the oracle
and the converter tests start from transformers' own checkpoints (tiny.py). The oracle's
measured errors are printed in the terminal summary. ``WASTE_TEST_EXTENSION=<path>`` loads
another build of the cffi extension in place of the installed one (test_sanitizers.py
points it at the ASan+UBSan build).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"
STRICT_ENV = "WASTE_REQUIRE_ORACLE"
EXTENSION_ENV = "WASTE_TEST_EXTENSION"
EXTENSION_MODULE = "waste.adapters.native._libwaste"


# ---- prerequisites: skip, or fail in strict mode ----------------------------------------
def strict() -> bool:
    """True when a missing prerequisite must fail (``WASTE_REQUIRE_ORACLE`` set, not "0")."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def missing(prerequisite: str, *, module_level: bool = False) -> NoReturn:
    """Skip because ``prerequisite`` is missing; in strict mode, fail saying so instead."""
    if strict():
        pytest.fail(f"missing prerequisite: {prerequisite} ({STRICT_ENV}=1 makes this a "
                    "failure: the project installs it, so its absence is a broken setup)",
                    pytrace=False)
    pytest.skip(f"missing prerequisite: {prerequisite}", allow_module_level=module_level)


def require_module(name: str, why: str, *, module_level: bool = False) -> Any:
    """The imported module ``name``, or ``missing`` naming it and ``why`` it is needed."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"{name} is not importable ({exc}); {why}", module_level=module_level)


def require_compiler() -> None:
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        missing("gcc is not installed: libwaste and the C tokenizer cannot be built")


def sanitizer_runtime(library: str = "libasan.so") -> str:
    """The absolute path of gcc's ASan runtime, or ``missing`` naming it."""
    require_compiler()
    out = subprocess.run(["gcc", f"-print-file-name={library}"], capture_output=True,
                         text=True).stdout.strip()
    if not out or not os.path.isabs(out) or not os.path.exists(out):
        missing(f"the ASan runtime ({library}) is not available to gcc")
    return out


# ---- the extension under test -------------------------------------------------------------
def _load_test_extension() -> None:
    """Install ``$WASTE_TEST_EXTENSION`` as the binding's compiled module, before any import."""
    path = os.environ.get(EXTENSION_ENV)
    if not path:
        return
    if EXTENSION_MODULE in sys.modules:
        raise RuntimeError(f"{EXTENSION_ENV}: {EXTENSION_MODULE} was imported before the engine conftest")
    spec = importlib.util.spec_from_file_location(EXTENSION_MODULE, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{EXTENSION_ENV}={path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[EXTENSION_MODULE] = module


_load_test_extension()


def _native_sources() -> list[Path]:
    return [*NATIVE.glob("src/*.[ch]"), *NATIVE.glob("include/*.h")]


@pytest.fixture(scope="session")
def libwaste() -> Path:
    """``native/build/libwaste.a``, freshly made, and a binding compiled from current sources.

    The tests call libwaste through the API-mode extension that ``pip install -e .`` links
    from libwaste.a; an extension older than a native source would test stale code.
    """
    require_compiler()
    proc = subprocess.run(["make", "-C", str(NATIVE), "-j2"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"make -C native failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    try:
        built = importlib.import_module(EXTENSION_MODULE).__file__
    except ImportError as exc:
        pytest.fail(f"the cffi extension is not built ({exc}): run `make setup`", pytrace=False)
    assert built is not None  # an extension module is loaded from a file
    extension = Path(built)
    newest = max(_native_sources(), key=lambda p: p.stat().st_mtime)
    if newest.stat().st_mtime > extension.stat().st_mtime:
        pytest.fail(f"{extension} is older than {newest.relative_to(REPO)}: rebuild it with "
                    "`make setup` (or `.venv/bin/pip install -e .`)", pytrace=False)
    return NATIVE / "build" / "libwaste.a"


# ---- containers ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synthetic")


@pytest.fixture(scope="session")
def synthetic_f32(synthetic_dir, libwaste) -> Path:
    """The default synthetic container (seed 0, no torch): 4 layers KDA×3 + MLA, a dense
    first layer, 8 experts top-2 with one shared, hidden 64, XTML specials + ``[EOS]``."""
    from waste.tools.make_container import build_container

    return build_container(synthetic_dir / "default-f32.waste", seed=0)


@pytest.fixture(scope="session")
def torch_stack():
    """(torch, transformers) with KimiLinearForCausalLM, or ``missing`` naming what is not."""
    torch = require_module("torch", "the logit oracle needs torch==2.13.0")
    transformers = require_module("transformers", "the logit oracle needs transformers==5.23.0")
    if not hasattr(transformers, "KimiLinearForCausalLM"):
        missing(f"transformers {transformers.__version__} has no KimiLinearForCausalLM (needs 5.23.0)")
    torch.set_num_threads(1)
    return torch, transformers


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_hf(torch_stack, tiny_dir):
    """(model, checkpoint dir) of transformers' tiny config A (docs/ENGINE.md §7), seed 0."""
    from tests.engine import tiny

    return tiny.make_checkpoint(torch_stack, tiny_dir / "hf-a", tiny.CONFIG_A, seed=0)


@pytest.fixture(scope="session")
def tiny_f32(tiny_hf, tiny_dir, libwaste):
    """(hf_model, container path) for the spec's tiny config, f32 container."""
    from tests.engine import tiny

    model, hf = tiny_hf
    return model, tiny.convert(hf, tiny_dir / "a-f32.waste", "f32")


# ---- the oracle's measured errors, printed at the end of the run -----------------------
_MEASURED: list[str] = []


@pytest.fixture(scope="session")
def report_measurement() -> Callable[[str], None]:
    """Records one line for the terminal summary (issue 4: "report the measured value")."""
    return _MEASURED.append


def pytest_terminal_summary(terminalreporter) -> None:
    if _MEASURED:
        terminalreporter.write_sep("-", "oracle: measured libwaste vs transformers")
        for line in _MEASURED:
            terminalreporter.write_line(line)
