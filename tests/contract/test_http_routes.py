"""HTTP routes over real sockets, against each engine: docs/HTTP.md §1, §2.1, §5, §6, §8."""

from __future__ import annotations

import contextlib
import socket
import threading

import httpx
import pytest
import trio

from tests.contract.engines import serve
from tests.contract.serving import fake, running, state_of
from tests.contract.vllm_server import MAX_MODEL_LEN
from waste.app import Settings
from waste.domain.ports import EngineFormatError

# What each engine reports about itself (the synthetic container: seed 0, default geometry).
IDENTITY = {
    "fake": {"model": "fake", "arch": "fake", "fake_engine": True, "engine": "fake"},
    "native": {"model": "synthetic", "arch": "kimi_linear", "fake_engine": False,
               "engine": "libwaste"},
    "vllm": {"model": "tiny", "arch": "vllm", "fake_engine": False, "engine": "vllm"},
}


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["code"], str)
    return body["error"]


def say(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_health(served, client):
    r = client.get("/health")
    assert r.status_code == 200
    body = r.json()
    identity = IDENTITY[served.kind]
    assert body["status"] == "ok" and body["model"] == identity["model"]
    assert body["chat_format"] == "xtml" and body["generating"] is False
    assert body["queue_depth"] == 0 and identity["engine"] in body["engine"].lower()
    assert body["fake_engine"] is identity["fake_engine"]


def test_models_list_and_one(served, client):
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list" and len(listing["data"]) == 1
    model = listing["data"][0]
    identity = IDENTITY[served.kind]
    assert model["id"] == identity["model"] and model["object"] == "model"
    assert model["owned_by"] == "waste"
    waste = model["waste"]
    assert waste["arch"] == identity["arch"]
    if served.kind == "vllm":  # the shape is the remote engine's; what it is, is said
        assert waste["engine"].startswith("vllm ") and waste["engine"].endswith(" serving tiny")
        assert waste["vocab"] == 660 and waste["ctx_tokens"] == MAX_MODEL_LEN
    else:
        assert waste["n_layers"] == 4 and waste["top_k"] == 2
        assert waste["params_total"] > waste["params_active"] > 0
    assert waste["chat_format"] == {"kind": "xtml", "reasoning": True, "tools": True,
                                    "images": False, "error": None}
    assert waste["defaults"]["thinking"] is True
    assert client.get(f"/v1/models/{identity['model']}").json() == model


@pytest.fixture(scope="module")
def fake_client():
    """The fake alone, for what docs/HTTP.md §9.1 fixes about it."""
    with running(fake(), Settings(fake_engine="builtin")) as (base, app), \
            httpx.Client(base_url=base, timeout=10) as c:
        yield c


def test_fake_model_shape(fake_client):
    waste = fake_client.get("/v1/models").json()["data"][0]["waste"]
    assert waste["params_total"] == 1_000_000 and waste["params_active"] == 250_000
    assert waste["defaults"] == {"max_tokens": 4096, "thinking": True}


def test_unknown_model_is_404(client):
    r = client.get("/v1/models/gpt-4")
    assert r.status_code == 404
    err = error_of(r)
    assert (err["code"], err["type"], err["param"]) == ("model_not_found", "not_found_error", "model")


@pytest.mark.parametrize("path", ["/nope", "/v1/models/", "/health/", "/v1/chat/completion",
                                  "//health", "/v1//models", "/v1/models//", "/metrics/"])
def test_paths_match_exactly(served, path):
    # Raw bytes: an HTTP client could normalise the path before sending it.
    response, _ = raw_request(served.base, f"GET {path} HTTP/1.1\r\nHost: x\r\n"
                                           "Connection: close\r\n\r\n".encode())
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404"), head
    assert b"location:" not in head.lower()  # never a redirect
    assert b'"code":"unknown_route"' in body


def test_wrong_method_is_405_with_allow(client):
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405
    assert error_of(r)["code"] == "method_not_allowed"
    assert "POST" in r.headers["Allow"]
    r = client.post("/health", content=b"{}")
    assert r.status_code == 405 and "GET" in r.headers["Allow"]


def test_options_is_405_without_cors(client):
    assert client.options("/v1/models").status_code == 405


def test_head_works_where_get_does(client):
    assert client.head("/health").status_code == 200
    assert client.head("/v1/models").status_code == 200


def test_metrics(client):
    client.post("/v1/chat/completions", json=say("m"))
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'waste_requests_total{route="/v1/chat/completions",status="200"}' in text
    for series in ("waste_requests_cancelled_total", "waste_prompt_tokens_total",
                   "waste_generated_tokens_total", "waste_queue_seconds_total",
                   "waste_prefill_seconds_total", "waste_decode_seconds_total",
                   "waste_expert_hits_total", "waste_expert_misses_total",
                   "waste_expert_bytes_read_total", "waste_queue_depth",
                   "waste_requests_running", "waste_direct_io", "waste_memory_budget_bytes",
                   "waste_memory_peak_bytes", "waste_info{"):
        assert f"\n{series}" in text, series
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["waste_generated_tokens_total"] >= 1
    assert values["waste_decode_seconds_total"] > 0


def test_tokenize_detokenize(served, client):
    n_base = served.engine.n_base_vocab
    text = "a<|open|>b"
    plain = client.post("/tokenize", json={"content": text}).json()["tokens"]
    assert all(t < n_base for t in plain)
    marked = client.post("/tokenize", json={"content": text, "parse_special": True}).json()["tokens"]
    assert sum(t >= n_base for t in marked) == 1
    assert client.post("/detokenize", json={"tokens": marked}).json() == {"content": text}
    assert client.post("/detokenize", json={"tokens": plain}).json() == {"content": text}
    pieces = client.post("/tokenize", json={"content": "é", "with_pieces": True}).json()["tokens"]
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                      for p in pieces)
    assert joined == "é".encode()
    bad = client.post("/detokenize", json={"tokens": [1, -1]})
    assert bad.status_code == 400 and error_of(bad)["param"] == "tokens[1]"
    missing = client.post("/tokenize", json={})
    assert error_of(missing)["code"] == "missing_required_parameter"


def test_fake_tokens_are_code_points(fake_client):
    client = fake_client
    assert client.post("/tokenize", json={"content": "a<|open|>b"}).json() == \
        {"tokens": [ord(c) for c in "a<|open|>b"]}
    pieces = client.post("/tokenize", json={"content": "é", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": 0xE9, "piece": "é"}]}


@pytest.mark.parametrize("raw", [b"", b"[]", b"nope", b'{"a": NaN}', b"\xff\xfe", b"1"])
def test_body_not_a_json_object(client, raw):
    r = client.post("/v1/chat/completions", content=raw)
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == "invalid_json" and err["param"] is None and "JSON" in err["message"]


def test_any_content_type_is_accepted(client):
    r = client.post("/v1/chat/completions", content=b'{"messages":[{"role":"user","content":"x"}]}',
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200


def raw_request(base: str, data: bytes, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Send raw bytes; return (response bytes, whether the server closed the connection)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        closed = False
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    closed = True
                    break
                chunks.append(chunk)
        except socket.timeout:
            pass
        return b"".join(chunks), closed


def test_post_without_content_length_is_411_and_closes(served):
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n")
    response, closed = raw_request(served.base, data)
    assert response.startswith(b"HTTP/1.1 411")
    assert b"length_required" in response and b"connection: close" in response.lower()
    assert closed


def test_declared_body_over_64_mib_is_413_before_reading(served):
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 67108865\r\n"
            b"Content-Type: application/json\r\n\r\n{")
    response, closed = raw_request(served.base, data)
    assert response.startswith(b"HTTP/1.1 413")
    assert b"request_too_large" in response
    assert closed  # the connection closes although the body never arrived


def test_content_length_zero_is_invalid_json(client):
    r = client.post("/v1/chat/completions", content=b"")
    assert error_of(r)["code"] == "invalid_json"


def test_http10_stream_ends(served):
    body = b'{"messages":[{"role":"user","content":"x"}],"stream":true}'
    data = (b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)
    response, closed = raw_request(served.base, data)
    assert b"data: [DONE]" in response and closed


def test_connection_close_is_honoured(served):
    data = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    response, closed = raw_request(served.base, data)
    assert response.startswith(b"HTTP/1.1 200") and closed


def test_x_request_id(client):
    ok = client.post("/v1/chat/completions", json=say("x"))
    assert ok.headers["x-request-id"] == ok.json()["id"]
    assert ok.json()["id"].startswith("chatcmpl-") and len(ok.json()["id"]) == 9 + 24
    done = client.post("/v1/completions", json={"prompt": "x"})
    assert done.headers["x-request-id"] == done.json()["id"]
    assert done.json()["id"].startswith("cmpl-")
    bad = client.post("/v1/completions", json={})
    assert bad.headers["x-request-id"].startswith("req-")


def test_body_incomplete_after_the_timeout_is_408_and_closes(engine_kind, request):
    with serve(engine_kind, request, body_timeout_s=0.3) as served:
        data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                b'{"mes')
        response, closed = raw_request(served.base, data)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), response
    assert b"connection: close" in head.lower()
    assert b'"code":"request_timeout"' in body and b"0.3 s" in body
    assert closed


# -- auth ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed(engine_kind, request):
    with serve(engine_kind, request, api_key="s3cret") as served:
        yield served.base


@pytest.mark.parametrize("headers,ok", [
    ({}, False),
    ({"Authorization": "Bearer wrong"}, False),
    ({"Authorization": "Bearer s3cret"}, True),
    ({"Authorization": "bearer s3cret"}, True),
    ({"Authorization": "BEARER s3cret"}, True),
    ({"x-api-key": "s3cret"}, True),
    ({"x-api-key": "s3cre"}, False),
    ({"Authorization": "Basic s3cret"}, False),
])
def test_api_key(keyed, headers, ok):
    with httpx.Client(base_url=keyed, timeout=10) as c:
        r = c.get("/v1/models", headers=headers)
        if ok:
            assert r.status_code == 200
        else:
            assert r.status_code == 401
            err = error_of(r)
            assert (err["code"], err["type"]) == ("invalid_api_key", "authentication_error")
            assert r.headers["WWW-Authenticate"] == "Bearer"
            assert r.headers["Connection"].lower() == "close"
            assert "s3cret" not in r.text


def test_health_needs_no_key(keyed):
    with httpx.Client(base_url=keyed, timeout=10) as c:
        assert c.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 200
        assert c.get("/metrics").status_code == 401


def test_without_a_key_any_authorization_is_accepted(client):
    assert client.get("/v1/models", headers={"Authorization": "Bearer whatever"}).status_code == 200


def test_route_check_precedes_key(keyed):
    with httpx.Client(base_url=keyed, timeout=10) as c:
        assert c.get("/nope").status_code == 404
        assert c.get("/v1/chat/completions").status_code == 405


@pytest.fixture(scope="module")
def utf8_keyed():
    with running(fake(), Settings(fake_engine="builtin", api_key="clé")) as (base, app):
        yield base


@pytest.mark.parametrize("header,ok", [
    (b"Authorization: Bearer cl\xc3\xa9", True),  # the key's UTF-8 bytes
    (b"x-api-key: cl\xc3\xa9", True),
    (b"Authorization: Bearer cl\xe9", False),  # latin-1 bytes are another key
    (b"Authorization: Bearer cle", False),
])
def test_a_non_ascii_key_is_compared_as_utf8_bytes(utf8_keyed, header, ok):
    response, _ = raw_request(utf8_keyed, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + header
                              + b"\r\nConnection: close\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 200" if ok else b"HTTP/1.1 401"), response[:200]


# -- CORS ------------------------------------------------------------------------------------

def test_cors_when_enabled(engine_kind, request):
    with serve(engine_kind, request, cors_origins=("https://ui.example",), api_key="k") as served, \
            httpx.Client(base_url=served.base) as c:
        pre = c.options("/v1/chat/completions", headers={"Origin": "https://ui.example"})
        assert pre.status_code == 204
        assert pre.headers["Access-Control-Allow-Origin"] == "https://ui.example"
        assert "POST" in pre.headers["Access-Control-Allow-Methods"]
        assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
        assert pre.headers["Access-Control-Max-Age"] == "600"
        assert "Access-Control-Allow-Credentials" not in pre.headers
        r = c.get("/v1/models", headers={"Origin": "https://ui.example", "x-api-key": "k"})
        assert r.headers["Access-Control-Allow-Origin"] == "https://ui.example"
        assert "Origin" in r.headers["Vary"]
        other = c.get("/v1/models", headers={"Origin": "https://evil.example", "x-api-key": "k"})
        assert "Access-Control-Allow-Origin" not in other.headers


# -- loading and a failed load ---------------------------------------------------------------

ENGINE_SERIES = ("waste_expert_hits_total", "waste_expert_misses_total",
                 "waste_expert_bytes_read_total", "waste_direct_io",
                 "waste_memory_budget_bytes", "waste_memory_peak_bytes")


def test_routes_answer_503_while_loading():
    gate = threading.Event()

    @contextlib.asynccontextmanager
    async def slow_opener():
        engine = await trio.to_thread.run_sync(lambda: gate.wait(20) and fake())
        yield engine, engine

    with running(slow_opener, Settings(fake_engine="builtin"), wait_ready=False) as (base, app):
        with httpx.Client(base_url=base, timeout=10) as c:
            health = c.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "loading"
            assert health.json()["engine"] is None
            r = c.post("/v1/chat/completions", json=say("x"))
            assert r.status_code == 503 and error_of(r)["code"] == "engine_loading"
            assert r.headers["Retry-After"] == "5"
            assert c.get("/v1/models").status_code == 503
            metrics = c.get("/metrics")
            assert metrics.status_code == 200 and "waste_queue_depth 0" in metrics.text
            for series in ENGINE_SERIES:
                assert series not in metrics.text, series
            gate.set()
            service = state_of(app).service
            trio.from_thread.run(service.ready.wait, trio_token=service.trio_token)
            assert c.get("/v1/models").status_code == 200
            assert "waste_expert_hits_total" in c.get("/metrics").text


def test_a_failed_load_answers_500_engine_error_naming_the_failure():
    @contextlib.asynccontextmanager
    async def broken_opener():
        raise EngineFormatError("manifest.json: format_version 999 is not 1")
        yield

    with running(broken_opener, Settings(fake_engine="builtin")) as (base, app):
        with httpx.Client(base_url=base, timeout=10) as c:
            health = c.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "failed"
            for method, path, body in (("POST", "/v1/chat/completions", say("x")),
                                       ("POST", "/v1/completions", {"prompt": "x"}),
                                       ("GET", "/v1/models", None),
                                       ("POST", "/tokenize", {"content": "x"})):
                r = c.request(method, path, json=body)
                assert r.status_code == 500, (path, r.text)
                err = error_of(r)
                assert (err["code"], err["type"]) == ("engine_error", "engine_error")
                assert "E_FORMAT" in err["message"] and "format_version 999" in err["message"]
                assert "load" in err["message"]
            metrics = c.get("/metrics")
            assert metrics.status_code == 200
            assert "waste_expert_hits_total" not in metrics.text
