"""Raw HTTP a hostile or odd client sends (issue 11, faults 6 and 10).

Malformed HTTP that the HTTP layer refuses before any route still gets the OpenAI error
envelope; a client that half-closes its write side after sending its request still gets
the answer (the generation routes: test_hardening_halfclose.py).
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.contract.serving import fake, running
from waste.app import Settings


@pytest.fixture(scope="module")
def address():
    with running(fake(), Settings(fake_engine="builtin")) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        yield host, int(port)


def exchange(address, raw: bytes, *, half_close: bool = False) -> bytes:
    with socket.create_connection(address, timeout=20) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def split(reply: bytes) -> tuple[int, dict, bytes]:
    """Status, headers and body of the final response (a half-closed client whose answer
    takes a while is sent ``103`` probes first, docs/HTTP.md §6)."""
    head, _, body = reply.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 1"):
        head, _, body = body.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in
               (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode() + extra + b"\r\n" + body


MALFORMED = {
    "content_length_negative": b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
    "content_length_letters": b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    "content_length_21_digits": (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                 + b"9" * 21 + b"\r\n\r\n{}"),
    "content_length_twice": (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                             b"Content-Length: 3\r\n\r\n{}"),
    "garbage_request_line": b"\x16\x03\x01 garbage here\r\n\r\n",
    "nul_in_header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "header_200_kb": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
    "url_100_kb": b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_http_gets_the_error_envelope(address, name):
    status, headers, body = split(exchange(address, MALFORMED[name]))
    assert status in (400, 431), status
    assert headers["content-type"].startswith("application/json")
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == ("headers_too_large" if status == 431 else "malformed_http")
    assert error["message"]


@pytest.mark.parametrize("path,body", [("/tokenize", b'{"content":"hello there"}'),
                                       ("/detokenize", b'{"tokens":[1,2]}')])
def test_a_half_closed_client_gets_its_answer(address, path, body):
    status, _, reply = split(exchange(address, post(path, body), half_close=True))
    assert status == 200
    assert json.loads(reply)


def test_a_half_closed_client_gets_a_get_answer(address):
    raw = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    status, _, reply = split(exchange(address, raw, half_close=True))
    assert status == 200 and json.loads(reply)["object"] == "list"


@pytest.mark.parametrize("path", ["/v1/models/a%0d%0ab", "/v1/models/x/y", "/v1/models/%0a"])
def test_any_unknown_model_id_is_model_not_found(address, path):
    raw = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    status, _, body = split(exchange(address, raw))
    assert status == 404
    error = json.loads(body)["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
