"""Fixtures for the native Engine contract: one synthetic container per session.

The container comes from ``waste.tools.make_container`` (deterministic, seed 0); the engine
is libwaste through the cffi extension that ``pip install -e .`` builds. Without a C
compiler the native tests skip, saying so (fail under ``WASTE_REQUIRE_ORACLE=1``, as the
engine tests do); with one, a missing build is an error.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.contract.engines import ENGINE_KINDS, serve
from tests.contract.vllm_server import require_vllm, running_vllm
from tests.engine.conftest import require_compiler
from waste.tools.make_container import build_container

NATIVE_CTX_TOKENS = 256


def load_native():
    """The ``waste.adapters.native`` package, or a skip (no compiler) / failure (not built)."""
    try:
        import waste.adapters.native as native
    except ImportError as exc:
        require_compiler()
        pytest.fail(f"a C compiler exists but libwaste is not built ({exc}); run `pip install -e .`")
    return native


@pytest.fixture(scope="session")
def native():
    """The native adapter package (skips only when libwaste cannot be built)."""
    return load_native()


@pytest.fixture(scope="session")
def native_container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic K3-XTML container (seed 0, default geometry), built once."""
    out = tmp_path_factory.mktemp("native") / "synthetic.waste"
    build_container(out, seed=0)
    return out


@pytest.fixture(scope="session")
def kimi_linear_container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same geometry with the Kimi-Linear markers and a chat.json."""
    out = tmp_path_factory.mktemp("native") / "kimi-linear.waste"
    build_container(out, seed=0, chat_json="kimi-linear")
    return out


DEMO_MODEL = Path(__file__).resolve().parents[2] / "data" / "demo-model"


@pytest.fixture(scope="session")
def demo_container(native, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed demo model (data/demo-model) converted by the project's converter, once."""
    from waste.tools.convert import convert

    return convert(DEMO_MODEL, tmp_path_factory.mktemp("demo") / "demo.waste")


@contextlib.contextmanager
def serving_demo(container: Path, max_tokens: int) -> Iterator[str]:
    """The demo container served by libwaste on a real socket: its base URL. One engine
    thread: on a loaded machine, threads pinned to busy cores wait on each other."""
    from tests.contract.serving import running
    from waste.app import Settings, engine_opener

    settings = Settings(model=str(container), usage="", max_tokens=max_tokens, threads=1)
    with running(engine_opener(settings), settings) as (base, _):
        yield base


@pytest.fixture
def native_engine(native, native_container: Path):
    """A fresh ``NativeEngine`` on the session container (closed afterwards)."""
    engine = native.NativeEngine.open(
        native_container, native.NativeOptions(ctx_tokens=NATIVE_CTX_TOKENS, usage_path=""))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Qwen2 checkpoint vLLM serves (waste.tools.tiny_qwen2), built once."""
    require_vllm()
    from tests.engine.conftest import require_module

    require_module("transformers", "the tiny Qwen2 checkpoint for vLLM is written with it")
    from waste.tools.tiny_qwen2 import write_model

    return write_model(tmp_path_factory.mktemp("vllm") / "tiny-qwen2")


@pytest.fixture(scope="session")
def vllm_server(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory):
    """One vLLM server for the whole run (skips, or fails under make test, without the venv)."""
    yield from running_vllm(tiny_qwen2, tmp_path_factory.mktemp("vllm-log") / "vllm.log")


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def engine_kind(request) -> str:
    """Each engine the HTTP contract runs against; "native" skips only without a compiler,
    "vllm" only without the vLLM venv."""
    if request.param == "native":
        load_native()
    if request.param == "vllm":
        require_vllm()
    return request.param


@pytest.fixture(scope="module")
def served(engine_kind, request):
    """One server per module and engine kind (modules with their own setup override this)."""
    with serve(engine_kind, request) as running:
        yield running


@pytest.fixture
def client(served):
    """An httpx client on ``served`` (modules that serve otherwise define their own)."""
    with httpx.Client(base_url=served.base, timeout=60) as c:
        yield c
