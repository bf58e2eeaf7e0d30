"""HTTP routes over real sockets against the fake engine: http.md §1, §2.1, §5, §6, §8."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.contract.serving import fake, running
from waste.app import Settings


@pytest.fixture(scope="module")
def server():
    with running(fake(), Settings(fake_engine="builtin")) as (base, app):
        yield base, app


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server[0], timeout=10) as c:
        yield c


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["code"], str)
    return body["error"]


def test_health(client):
    r = client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["model"] == "fake"
    assert body["chat_format"] == "xtml" and body["generating"] is False
    assert body["queue_depth"] == 0 and "fake" in body["engine"]
    assert body["fake_engine"] is True


def test_models_list_and_one(client):
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list" and len(listing["data"]) == 1
    model = listing["data"][0]
    assert model["id"] == "fake" and model["object"] == "model" and model["owned_by"] == "waste"
    waste = model["waste"]
    assert waste["arch"] == "fake" and waste["n_layers"] == 4 and waste["top_k"] == 2
    assert waste["params_total"] == 1_000_000 and waste["params_active"] == 250_000
    assert waste["chat_format"] == {"kind": "xtml", "reasoning": True, "tools": True,
                                    "images": False, "error": None}
    assert waste["defaults"] == {"max_tokens": 4096, "thinking": True}
    assert client.get("/v1/models/fake").json() == model


def test_unknown_model_is_404(client):
    r = client.get("/v1/models/gpt-4")
    assert r.status_code == 404
    err = error_of(r)
    assert (err["code"], err["type"], err["param"]) == ("model_not_found", "not_found_error", "model")


@pytest.mark.parametrize("path", ["/nope", "/v1/models/", "/health/", "/v1/chat/completion"])
def test_unknown_route_is_404_envelope(client, path):
    r = client.get(path)
    if path == "/v1/models/":  # an empty model id is no route either
        assert r.status_code == 404
        return
    assert r.status_code == 404
    assert error_of(r)["code"] == "unknown_route"


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
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "m"}]})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'waste_requests_total{route="/v1/chat/completions",status="200"}' in text
    for series in ("waste_requests_cancelled_total", "waste_prompt_tokens_total",
                   "waste_generated_tokens_total", "waste_queue_seconds_total",
                   "waste_expert_hits_total", "waste_expert_misses_total",
                   "waste_expert_bytes_read_total", "waste_queue_depth",
                   "waste_requests_running", "waste_direct_io", "waste_memory_budget_bytes",
                   'waste_info{model="fake"'):
        assert series in text, series


def test_tokenize_detokenize(client):
    r = client.post("/tokenize", json={"content": "a<|open|>b"})
    assert r.json() == {"tokens": [ord(c) for c in "a<|open|>b"]}
    marked = client.post("/tokenize", json={"content": "a<|open|>b", "parse_special": True}).json()
    assert len(marked["tokens"]) == 3 and marked["tokens"][1] >= 0x110000
    pieces = client.post("/tokenize", json={"content": "é", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": 0xE9, "piece": "é"}]}
    back = client.post("/detokenize", json={"tokens": marked["tokens"]}).json()
    assert back == {"content": "a<|open|>b"}
    bad = client.post("/detokenize", json={"tokens": [1, -1]})
    assert bad.status_code == 400 and error_of(bad)["param"] == "tokens[1]"
    missing = client.post("/tokenize", json={})
    assert error_of(missing)["code"] == "missing_required_parameter"


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


def raw_request(base: str, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
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


def test_post_without_content_length_is_411_and_closes(server):
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n")
    response, closed = raw_request(server[0], data)
    assert response.startswith(b"HTTP/1.1 411")
    assert b"length_required" in response and b"connection: close" in response.lower()
    assert closed


def test_declared_body_over_64_mib_is_413_before_reading(server):
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 67108865\r\n"
            b"Content-Type: application/json\r\n\r\n{")
    response, closed = raw_request(server[0], data)
    assert response.startswith(b"HTTP/1.1 413")
    assert b"request_too_large" in response
    assert closed  # the connection closes although the body never arrived


def test_content_length_zero_is_invalid_json(client):
    r = client.post("/v1/chat/completions", content=b"")
    assert error_of(r)["code"] == "invalid_json"


def test_http10_stream_ends(server):
    body = b'{"messages":[{"role":"user","content":"x"}],"stream":true}'
    data = (b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)
    response, closed = raw_request(server[0], data)
    assert b"data: [DONE]" in response and closed


def test_connection_close_is_honoured(server):
    data = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    response, closed = raw_request(server[0], data)
    assert response.startswith(b"HTTP/1.1 200") and closed


# -- auth ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed():
    with running(fake(), Settings(fake_engine="builtin", api_key="s3cret")) as (base, app):
        yield base


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


# -- CORS ------------------------------------------------------------------------------------

def test_cors_when_enabled():
    settings = Settings(fake_engine="builtin", cors_origins=("https://ui.example",), api_key="k")
    with running(fake(), settings) as (base, app), httpx.Client(base_url=base) as c:
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


# -- loading -------------------------------------------------------------------------------

def test_routes_answer_503_while_loading():
    import threading

    gate = threading.Event()

    def slow_loader():
        gate.wait(20)
        engine = fake()
        return engine, engine

    with running(slow_loader, Settings(fake_engine="builtin"), wait_ready=False) as (base, app):
        with httpx.Client(base_url=base, timeout=10) as c:
            health = c.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "loading"
            assert health.json()["engine"] is None
            r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 503 and error_of(r)["code"] == "engine_loading"
            assert r.headers["Retry-After"] == "5"
            assert c.get("/v1/models").status_code == 503
            assert c.get("/metrics").status_code == 200
            gate.set()
            for _ in range(500):
                if c.get("/health").status_code == 200:
                    break
                threading.Event().wait(0.01)
            assert c.get("/v1/models").status_code == 200


def test_x_request_id(client):
    ok = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert ok.headers["x-request-id"] == ok.json()["id"]
    assert ok.json()["id"].startswith("chatcmpl-") and len(ok.json()["id"]) == 9 + 24
    bad = client.post("/v1/completions", json={})
    assert bad.headers["x-request-id"].startswith("req-")
