"""``python -m waste`` as users run it, in a subprocess: startup, signals, exit codes
(docs/HTTP.md §6 Shutdown, §9).

The server is a black box here; the test synchronises on what it prints (``listening on``,
its log lines) and on its HTTP answers, never on sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest

LINE_WAIT_S = 30.0  # a safety net for a server that never says it, not a synchronisation


class CliServer:
    """One ``python -m waste`` process, its stdout and stderr read line by line."""

    def __init__(self, *args: str, log_level: str = "info") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "waste", "--port", "0", *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, "WASTE_LOG_LEVEL": log_level})
        self.stderr: queue.Queue[str] = queue.Queue()
        self.stderr_seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        assert self.proc.stdout is not None  # stdout=PIPE
        line = self.proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, self.read_stderr())
        self.base = line.split()[-1].strip()

    def _pump(self) -> None:
        assert self.proc.stderr is not None  # stderr=PIPE
        for line in self.proc.stderr:
            self.stderr.put(line)

    def wait_stderr(self, text: str) -> str:
        """Block until a stderr line containing ``text``; return it."""
        while True:
            try:
                line = self.stderr.get(timeout=LINE_WAIT_S)
            except queue.Empty:
                raise AssertionError(
                    f"the server never logged {text!r}: {self.stderr_seen}") from None
            self.stderr_seen.append(line)
            if text in line:
                return line

    def read_stderr(self) -> list[str]:
        while not self.stderr.empty():
            self.stderr_seen.append(self.stderr.get())
        return self.stderr_seen

    def signal(self, signum: int = signal.SIGINT) -> None:
        self.proc.send_signal(signum)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def cli():
    started: list[CliServer] = []

    def start(*args: str, **kwargs) -> CliServer:
        server = CliServer(*args, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "thinking": False, **extra}


def script(**keys) -> str:
    return json.dumps(keys)


LONG = script(token_delay_s=0.05, replies=[{"when": "long", "content": "x" * 1000}])


def test_cli_serves_and_exits_cleanly_on_sigterm(cli):
    server = cli("--fake-engine")
    server.wait_stderr("engine ready")
    with httpx.Client(base_url=server.base, timeout=10) as c:
        body = c.post("/v1/chat/completions", json=chat("cli")).json()
        assert body["choices"][0]["message"]["content"] == "Echo: cli"
    server.signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0
    server.wait_stderr("shutting down")
    logged = server.read_stderr()
    # hypercorn logs through our handler: once, in our format (it used to add its own).
    assert sum("Running on http://" in line for line in logged) == 1, logged


def _stream(base: str, body: dict, out: dict, started: threading.Event | None = None) -> None:
    """Read one stream into ``out``: its events, and how many content deltas came when."""
    events: list[str] = []
    out["events"] = events
    try:
        _read_stream(base, body, out, events, started)
    except httpx.TransportError as exc:  # a server that exited at once
        out["error"] = exc


def _read_stream(base, body, out, events, started) -> None:
    with httpx.Client(base_url=base, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            out["status"] = r.status_code
            buffer = ""
            for text in r.iter_text():
                buffer += text
                while "\n\n" in buffer:
                    raw, buffer = buffer.split("\n\n", 1)
                    events.append(raw)
                    if started is not None and '"content":"x"' in raw:
                        started.set()


def _refuses_connections(base: str) -> bool:
    """Whether the listener is closed. Hypercorn closes it a few scheduler steps after the
    signal is handled; a connection accepted in between is served as shutting down (never
    200), so attempts are repeated until one is refused."""
    host, port = base.removeprefix("http://").split(":")
    for _ in range(1000):
        try:
            sock = socket.create_connection((host, int(port)), timeout=5)
        except ConnectionRefusedError:
            return True
        with sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert not sock.recv(64).startswith(b"HTTP/1.1 200"), "served after the signal"
    return False


def test_shutdown_through_the_cli(cli):
    """SIGINT: the listener closes at once; queued requests get 503 shutting_down (JSON, or
    the SSE error event once their headers are out); the running stream gets its 10 s grace,
    then the same error; exit 0. A second signal exits 1 at once (a second server)."""
    server = cli("--fake-engine", LONG)
    second = cli("--fake-engine", LONG)
    server.wait_stderr("engine ready")
    second.wait_stderr("engine ready")
    running: dict = {}
    generating = threading.Event()
    threads = [threading.Thread(target=_stream, args=(server.base, chat("long", stream=True),
                                                      running, generating))]
    threads[0].start()
    assert generating.wait(LINE_WAIT_S)
    queued_stream: dict = {}
    threads.append(threading.Thread(target=_stream, args=(server.base, chat("q", stream=True),
                                                          queued_stream)))
    threads[-1].start()
    queued: dict = {}

    def queued_blocking() -> None:
        queued["response"] = httpx.post(server.base + "/v1/chat/completions", json=chat("b"),
                                        timeout=60)

    threads.append(threading.Thread(target=queued_blocking))
    threads[-1].start()
    with httpx.Client(base_url=server.base, timeout=10) as c:
        while c.get("/health").json()["queue_depth"] < 2:  # the server's own count
            pass

    server.signal()
    server.wait_stderr("shutting down")
    deltas_at_signal = sum('"content":"x"' in e for e in running.get("events", []))
    threads[2].join(LINE_WAIT_S)
    response = queued["response"]
    assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
    assert _refuses_connections(server.base)  # step 1: no new connections

    # Meanwhile, the other server: a second signal does not wait for anything.
    blocker: dict = {}
    blocking = threading.Event()
    threading.Thread(target=_stream, args=(second.base, chat("long", stream=True), blocker,
                                           blocking), daemon=True).start()
    assert blocking.wait(LINE_WAIT_S)  # generating: alone, the first signal would take 10 s
    second.signal()
    second.wait_stderr("shutting down")
    second.signal()
    assert second.proc.wait(5) == 1

    threads[1].join(LINE_WAIT_S)
    events = queued_stream["events"]
    assert queued_stream["status"] == 200 and '"role":"assistant"' in events[0]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
    threads[0].join(LINE_WAIT_S)
    assert server.proc.wait(LINE_WAIT_S) == 0
    events = running["events"]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
    assert "data: [DONE]" not in events
    # it kept generating through the grace (tokens are 50 ms; the grace is 10 s)
    assert sum('"content":"x"' in e for e in events) > deltas_at_signal + 20
    server.wait_stderr("aborted after 10 s")


def test_a_second_signal_while_loading_exits_1_at_once(cli):
    server = cli("--fake-engine", script(load_delay_s=120), log_level="warning")
    server.signal()
    server.wait_stderr("once the engine has finished loading")
    server.signal()
    assert server.proc.wait(10) == 1  # the load has ~2 minutes left


def test_the_first_signal_while_loading_waits_for_the_load(cli):
    server = cli("--fake-engine", script(load_delay_s=1), log_level="info")
    server.signal()
    server.wait_stderr("once the engine has finished loading")
    server.wait_stderr("engine ready")  # the load did finish
    assert server.proc.wait(LINE_WAIT_S) == 0


def test_cli_usage_errors_exit_2():
    bad = subprocess.run([sys.executable, "-m", "waste", "--fake-engine", "--port", "x"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--port" in bad.stderr
    env = {**os.environ, "WASTE_VISION": "maybe"}
    bad = subprocess.run([sys.executable, "-m", "waste", "--fake-engine"], capture_output=True,
                         text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "WASTE_VISION" in bad.stderr
    none = subprocess.run([sys.executable, "-m", "waste"], capture_output=True, text=True,
                          timeout=30, env={k: v for k, v in os.environ.items() if k != "WASTE_MODEL"})
    assert none.returncode == 2 and "MODEL" in none.stderr


def test_cli_warns_on_non_loopback_without_key():
    proc = subprocess.Popen([sys.executable, "-m", "waste", "--fake-engine", "--port", "0",
                             "--host", "0.0.0.0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        assert "warning:" in proc.stderr.read()
    finally:
        proc.kill()


def test_hypercorn_serves_the_asgi_app_from_the_environment():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env = {**os.environ, "WASTE_FAKE_ENGINE": "builtin", "WASTE_MODEL_ID": "asgi-fake",
           "WASTE_API_KEY": "k"}
    proc = subprocess.Popen([sys.executable, "-m", "hypercorn", "--worker-class", "trio",
                             "--bind", f"127.0.0.1:{port}", "waste.app:app"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            for _ in range(2000):  # a black box whose logs hypercorn owns: poll its probe
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                threading.Event().wait(0.01)
            models = c.get("/v1/models", headers={"Authorization": "Bearer k"}).json()
            assert models["data"][0]["id"] == "asgi-fake"
            assert c.get("/v1/models").status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        finally:
            proc.kill()
