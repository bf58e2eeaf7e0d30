"""The HTTP contract against the real engine: libwaste on a synthetic container.

Whatever does not depend on scripted replies runs here too: shapes, streaming, statelessness
(greedy answers reproduce whatever ran before), disconnects, tokenization, errors.
"""

from __future__ import annotations

import httpx
import pytest

from tests.contract.serving import running, state_of
from tests.contract.sse import join_deltas, stream
from waste.app import Settings, engine_loader


@pytest.fixture(scope="module")
def served(native, native_container):
    settings = Settings(model=str(native_container), ctx=512, usage="", max_tokens=24)
    with running(engine_loader(settings), settings) as (base, app):
        yield base, app


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[0], timeout=60) as c:
        yield c


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_health_and_models_report_the_real_engine(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["chat_format"] == "xtml"
    assert health["fake_engine"] is False and "libwaste" in health["engine"].lower()
    model = client.get("/v1/models").json()["data"][0]
    assert model["id"] == "synthetic"
    waste = model["waste"]
    assert waste["arch"] == "kimi_linear" and waste["ctx_tokens"] == 512
    assert waste["n_layers"] == 4 and waste["top_k"] == 2 and waste["params_total"] > 0


def test_greedy_answers_reproduce_across_requests(client):
    request = chat("Hello there", temperature=0)
    first = client.post("/v1/chat/completions", json=request).json()
    client.post("/v1/chat/completions", json=chat("something else entirely", temperature=0.9))
    second = client.post("/v1/chat/completions", json=request).json()
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    assert first["usage"] == second["usage"]
    assert first["usage"]["completion_tokens"] >= 1


def test_seeded_sampling_reproduces(client):
    request = chat("Tell me", temperature=1.0, seed=1234)
    a = client.post("/v1/chat/completions", json=request).json()
    b = client.post("/v1/chat/completions", json=request).json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["waste"]["seed"] == 1234


def test_blocking_shape_and_caps(client):
    body = client.post("/v1/chat/completions", json=chat("x", max_tokens=5, temperature=0)).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("length", "stop", "tool_calls")
    assert body["usage"]["completion_tokens"] <= 5
    assert body["waste"]["tokens_generated"] == body["usage"]["completion_tokens"]
    assert body["waste"]["prompt_tokens"] == body["usage"]["prompt_tokens"]


def test_stream_equals_blocking(client):
    request = chat("Stream me", temperature=0, max_tokens=20)
    blocking = client.post("/v1/chat/completions", json=request).json()
    response, events = stream(client, "/v1/chat/completions", {**request, "stream": True})
    assert events[-1] == "[DONE]"
    joined = join_deltas(events)
    message = blocking["choices"][0]["message"]
    assert joined["content"] == (message.get("content") or "")
    assert joined["reasoning"] == message.get("reasoning_content", "")
    assert joined["finish_reason"] == blocking["choices"][0]["finish_reason"]


def test_completions_and_stop_ids(client):
    body = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 8,
                                                  "temperature": 0}).json()
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] <= 8
    assert "<|end_of_msg|>" not in body["choices"][0]["text"]


def test_tokenize_never_yields_markers_from_plain_text(served, client):
    n_base = state_of(served[1]).info.n_base_vocab
    text = "<|open|>message<|sep|><|close|><|end_of_msg|>"
    plain = client.post("/tokenize", json={"content": text}).json()["tokens"]
    marked = client.post("/tokenize", json={"content": text, "parse_special": True}).json()["tokens"]
    assert all(t < n_base for t in plain)
    assert sum(t >= n_base for t in marked) == 4
    back = client.post("/detokenize", json={"tokens": plain}).json()["content"]
    assert back == text


def test_context_overflow_is_400(client):
    r = client.post("/v1/chat/completions", json=chat("word " * 600))
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_disconnect_frees_the_engine(served):
    base, app = served
    host = state_of(app).host
    with httpx.Client(base_url=base, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions",
                      json=chat("go", stream=True, max_tokens=400, temperature=0)) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and "delta" in line:
                    break
        ok = c.post("/v1/chat/completions", json=chat("after", max_tokens=2, temperature=0))
        assert ok.status_code == 200
    assert host.requests_cancelled >= 1


def test_cli_plan_and_version(native_container):
    import subprocess
    import sys

    plan = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan"],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "floor" in plan.stdout and "slots" in plan.stdout
    tiny = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan",
                           "--budget", "1K"], capture_output=True, text=True, timeout=60)
    assert tiny.returncode == 1 and "floor" in tiny.stderr
    version = subprocess.run([sys.executable, "-m", "waste", "--version"], capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0 and "libwaste" in version.stdout


def test_cli_exits_1_when_the_container_cannot_open(tmp_path):
    import subprocess
    import sys

    broken = tmp_path / "broken.waste"
    broken.mkdir()
    (broken / "manifest.json").write_text('{"format_version": 999}')
    run = subprocess.run([sys.executable, "-m", "waste", str(broken), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "format_version" in run.stderr
