"""The peer engine: llama-cpp-python built from its PyPI sdist into a virtualenv of its own.

``ensure_peer(venv)`` reuses a venv whose ``llama_cpp`` imports at the pinned version, else
creates it, downloads the sdist (``pip download --no-binary``), unpacks it next to the venv
(its ``convert_hf_to_gguf.py`` and ``gguf-py`` are needed later) and builds it with cmake:
CPU only, ``-march=native``, no GPU backends, no web UI (nothing is downloaded at build
time: only PyPI is reachable here). ≈15 min on 2 cores.

``python bench/peer_build.py [VENV]`` does just that step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import attrs

PEER_PACKAGE = "llama-cpp-python"
PEER_VERSION = "0.3.36"
DEFAULT_VENV = Path(__file__).resolve().parent / ".peer-venv"

# Every GPU/remote backend off, the native CPU backend on, nothing optional that would fetch
# files (LLAMA_USE_PREBUILT_UI downloads the server's web UI) or build tools we do not use:
# quantizing goes through llama_cpp's own llama_model_quantize.
CMAKE_ARGS = " ".join([
    "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DGGML_HIP=OFF", "-DGGML_METAL=OFF",
    "-DGGML_VULKAN=OFF", "-DGGML_SYCL=OFF", "-DGGML_OPENCL=OFF", "-DGGML_RPC=OFF",
    "-DGGML_BLAS=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF",
])


class PeerUnavailable(Exception):
    """The peer cannot be built or run here; the message says why (it goes into the row)."""


@attrs.frozen
class Peer:
    """A built peer: its venv's python, the vendored llama.cpp source tree, the build log."""

    python: Path
    llama_src: Path  # .../vendor/llama.cpp (convert_hf_to_gguf.py, gguf-py/)
    how: str  # "reused" | "built now in N s"

    @property
    def converter(self) -> Path:
        return self.llama_src / "convert_hf_to_gguf.py"

    @property
    def gguf_py(self) -> Path:
        return self.llama_src / "gguf-py"


def _installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


def _run_logged(cmd: list[str], log: Path, env: dict | None = None) -> None:
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise PeerUnavailable(
            f"`{' '.join(cmd[:4])} …` exited {done.returncode}; last lines of {log}: "
            + " | ".join(tail))


def _source_tree(src_dir: Path, log: Path, python: Path) -> Path:
    """The unpacked sdist (downloaded once into ``src_dir``)."""
    tree = src_dir / f"llama_cpp_python-{PEER_VERSION}"
    if (tree / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").exists():
        return tree
    src_dir.mkdir(parents=True, exist_ok=True)
    _run_logged([str(python), "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                 f"{PEER_PACKAGE}=={PEER_VERSION}", "-d", str(src_dir)], log)
    sdists = sorted(src_dir.glob(f"llama_cpp_python-{PEER_VERSION}.tar.gz"))
    if not sdists:
        raise PeerUnavailable(f"pip download left no llama_cpp_python-{PEER_VERSION}.tar.gz "
                              f"in {src_dir}")
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(src_dir, filter="data")
    return tree


def ensure_peer(venv: Path = DEFAULT_VENV, *, build: bool = True) -> Peer:
    """The peer in ``venv``: reused if ``llama_cpp`` imports at PEER_VERSION, else built."""
    python = venv / "bin" / "python"
    src_dir = venv / "src"
    version = _installed_version(python)
    tree = src_dir / f"llama_cpp_python-{PEER_VERSION}"
    if version == PEER_VERSION and (tree / "vendor" / "llama.cpp").exists():
        return Peer(python=python, llama_src=tree / "vendor" / "llama.cpp", how="reused")
    if not build:
        raise PeerUnavailable(f"{PEER_PACKAGE} {PEER_VERSION} is not built in {venv}")
    started = time.perf_counter()
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / "peer-build.log"
    if not python.exists():
        _run_logged([sys.executable, "-m", "venv", str(venv)], log)
    tree = _source_tree(src_dir, log, python)
    env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS,
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1), FORCE_CMAKE="1")
    _run_logged([str(python), "-m", "pip", "install", "-v", str(tree)], log, env=env)
    version = _installed_version(python)
    if version != PEER_VERSION:
        raise PeerUnavailable(f"after the build, llama_cpp imports as {version!r} in {venv}, "
                              f"expected {PEER_VERSION} (see {log})")
    return Peer(python=python, llama_src=tree / "vendor" / "llama.cpp",
                how=f"built now in {time.perf_counter() - started:.0f} s (log {log})")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_VENV
    try:
        peer = ensure_peer(target)
    except PeerUnavailable as err:
        sys.exit(f"peer_build: {err}")
    print(f"{peer.how}: {peer.python} (llama.cpp source {peer.llama_src})")
