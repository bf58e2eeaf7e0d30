"""Queueing, disconnects, concurrency and shutdown over real sockets (http.md §6)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.contract.serving import fake, running, state_of
from tests.contract.sse import join_deltas, read_events
from waste.app import Settings

SLOW = {"token_delay_s": 0.05, "replies": [
    {"when": "long", "content": "x" * 400},
]}


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def _wait_until(predicate, timeout: float = 10.0) -> None:
    # Test-side wait on server state observed from another thread.
    done = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        done.wait(0.005)
    raise AssertionError("condition not reached")


def test_disconnect_mid_stream_frees_the_engine_within_a_token():
    with running(fake(SLOW), Settings(fake_engine="builtin", thinking=False)) as (base, app):
        record = state_of(app).host.engine.record
        received = 0
        with httpx.Client(base_url=base, timeout=10) as c:
            with c.stream("POST", "/v1/chat/completions", json=chat("long", stream=True)) as r:
                for line in r.iter_lines():
                    if '"content":"x"' in line:
                        received += 1
                        if received == 5:
                            break  # leaving the block closes the connection
        _wait_until(lambda: len(record.stop_reasons) == 1)
        assert record.stop_reasons == ["callback"]
        # generated = what the client read + the one in flight + the one whose callback stopped
        assert record.generated[0] <= received + 2, record.generated
        with httpx.Client(base_url=base, timeout=10) as c:
            ok = c.post("/v1/chat/completions", json=chat("next", max_tokens=3))
            assert ok.status_code == 200
        assert state_of(app).host.requests_cancelled == 1


def test_queued_request_whose_client_left_never_reaches_the_engine():
    with running(fake(SLOW), Settings(fake_engine="builtin", thinking=False)) as (base, app):
        host = state_of(app).host
        record = host.engine.record
        holder_done = threading.Event()

        def hold_engine():
            with httpx.Client(base_url=base, timeout=30) as c:
                c.post("/v1/chat/completions", json=chat("long", max_tokens=40))
            holder_done.set()

        holder = threading.Thread(target=hold_engine)
        holder.start()
        _wait_until(lambda: host.running is not None)
        with httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=0.3)) as c:
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/chat/completions", json=chat("ghost-request"))
        holder.join(30)
        with httpx.Client(base_url=base, timeout=10) as c:
            assert c.post("/v1/chat/completions", json=chat("after", max_tokens=2)).status_code == 200
        texts = ["".join(chr(t) for t in p if t < 0x110000) for p in record.prompts]
        assert not any("ghost-request" in t for t in texts)
        assert len(record.prompts) == 2 and record.resets == 2


def test_eight_concurrent_clients_all_answered_in_fifo():
    with running(fake({"token_delay_s": 0.001}), Settings(fake_engine="builtin")) as (base, app):
        def ask(i: int) -> tuple[int, str]:
            with httpx.Client(base_url=base, timeout=30) as c:
                if i % 2:
                    with c.stream("POST", "/v1/chat/completions",
                                  json=chat(f"client {i}", stream=True)) as r:
                        return i, join_deltas(read_events(r))["content"]
                body = c.post("/v1/chat/completions", json=chat(f"client {i}")).json()
                return i, body["choices"][0]["message"]["content"]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = dict(pool.map(ask, range(8)))
        assert answers == {i: f"Echo: client {i}" for i in range(8)}
        record = state_of(app).host.engine.record
        assert len(record.prompts) == 8 and record.positions_at_generate == [0] * 8


def test_queue_full_is_503():
    settings = Settings(fake_engine="builtin", thinking=False, max_queue=0)
    with running(fake(SLOW), settings) as (base, app):
        with httpx.Client(base_url=base, timeout=10) as c:
            r = c.post("/v1/chat/completions", json=chat("x"))
            assert r.status_code == 503
            err = r.json()["error"]
            assert (err["code"], err["type"]) == ("queue_full", "unavailable_error")
            assert r.headers["Retry-After"] == "30"


def test_keepalive_while_queued():
    import waste.adapters.http.generation as generation

    old = generation.KEEPALIVE_S
    generation.KEEPALIVE_S = 0.05
    try:
        with running(fake(SLOW), Settings(fake_engine="builtin", thinking=False)) as (base, app):
            host = state_of(app).host
            holder = threading.Thread(target=lambda: httpx.post(
                base + "/v1/chat/completions", json=chat("long", max_tokens=10), timeout=30))
            holder.start()
            _wait_until(lambda: host.running is not None)
            with httpx.Client(base_url=base, timeout=30) as c:
                with c.stream("POST", "/v1/chat/completions",
                              json=chat("queued", stream=True, max_tokens=3)) as r:
                    events = read_events(r)
            holder.join(30)
        assert ": keep-alive" in events
        assert events[-1] == "[DONE]"
    finally:
        generation.KEEPALIVE_S = old


def test_shutdown_fails_queued_and_aborts_the_running_generation():
    with running(fake(SLOW), Settings(fake_engine="builtin", thinking=False)) as (base, app):
        host = state_of(app).host
        host.shutdown_grace_s = 0.2
        results: dict = {}

        def long_stream():
            with httpx.Client(base_url=base, timeout=30) as c:
                with c.stream("POST", "/v1/chat/completions", json=chat("long", stream=True)) as r:
                    results["running"] = read_events(r)

        def queued():
            with httpx.Client(base_url=base, timeout=30) as c:
                results["queued"] = c.post("/v1/chat/completions", json=chat("q"))

        t1 = threading.Thread(target=long_stream)
        t1.start()
        _wait_until(lambda: host.running is not None)
        t2 = threading.Thread(target=queued)
        t2.start()
        _wait_until(lambda: host.queue_depth == 1)
        import trio

        trio.from_thread.run(host.begin_shutdown, trio_token=host_token(app))
        t1.join(30)
        t2.join(30)
    queued_response = results["queued"]
    assert queued_response.status_code == 503
    assert queued_response.json()["error"]["code"] == "shutting_down"
    events = results["running"]
    assert events[-1]["error"]["code"] == "shutting_down"


def host_token(app):
    return state_of(app).host.trio_token


def test_cli_serves_and_exits_cleanly_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "waste", "--fake-engine", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WASTE_LOG_LEVEL": "warning"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        base = line.split()[-1]
        with httpx.Client(base_url=base, timeout=10) as c:
            for _ in range(500):
                if c.get("/health").status_code == 200:
                    break
            body = c.post("/v1/chat/completions", json=chat("cli")).json()
            assert body["choices"][0]["message"]["content"] == "Echo: cli"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        proc.kill()


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
    import socket as socket_module

    probe = socket_module.socket()
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
            for _ in range(2000):
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
