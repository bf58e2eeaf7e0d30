"""Chat and completions over real sockets against the scripted fake: what depends on a scripted
reply (docs/HTTP.md §2–§4, §6, §9.1). test_http_generation.py runs the rest against both engines."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.contract.serving import fake, running, state_of
from tests.contract.sse import join_deltas, stream
from waste.app import Settings

SCRIPT = {"replies": [
    {"when": "weather", "reasoning": "Need weather.", "content": "",
     "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
                    {"name": "clock", "arguments": "{\"tz\": "}]},
    {"when": "two calls", "content": "Sure.",
     "tool_calls": [{"name": "a", "arguments": {"x": [1, 2]}}, {"name": "b", "arguments": {}}]},
    {"when": "story", "reasoning": "Plan it.", "content": "Once upon a time, the END came. Then more."},
    {"when": "boom-late", "error": "io", "after_tokens": 5},
    {"when": "boom", "error": "nomem"},
    {"when": "raw-markup", "raw": "Hi<|close|>resp"},
]}


@pytest.fixture(scope="module")
def served():
    with running(fake(SCRIPT), Settings(fake_engine="builtin")) as (base, app):
        yield base, app


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[0], timeout=10) as c:
        yield c


@pytest.fixture
def record(served):
    return state_of(served[1]).service.engine.record


def user(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_blocking_reply_shape(client):
    body = client.post("/v1/chat/completions", json=user("hello")).json()
    assert body["object"] == "chat.completion" and body["model"] == "fake"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Echo: hello",
                                 "reasoning_content": "Thinking."}
    assert choice["finish_reason"] == "stop" and choice["logprobs"] is None
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage["completion_tokens_details"]["reasoning_tokens"] == len("Thinking.")
    waste = body["waste"]
    assert waste["tokens_generated"] == usage["completion_tokens"]
    assert waste["experts_hit"] == 3 * usage["completion_tokens"]
    assert waste["expert_hit_rate"] == 0.75 and waste["direct_io"] is True
    assert isinstance(waste["seed"], int) and 0 <= waste["seed"] < 2 ** 53
    assert set(waste["since_start"]) >= {"requests", "tokens_generated", "io_note"}


def test_tool_calls_blocking_and_streamed(client):
    # No tools declared, so no grammar: the scripted calls come back as written, the raw
    # `{"tz": ` one included (a declared tool set would refuse it: test_tool_constraint.py).
    blocking = client.post("/v1/chat/completions", json=user("weather?")).json()
    choice = blocking["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["reasoning_content"] == "Need weather."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "clock"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 3}
    assert calls[1]["function"]["arguments"] == '{"tz": '  # raw, unparseable, verbatim
    assert all(c["id"].startswith("call_") and len(c["id"]) == 29 for c in calls)
    _, events = stream(client, "/v1/chat/completions", user("weather?", stream=True))
    call_chunks = [e["choices"][0]["delta"]["tool_calls"] for e in events[:-1]
                   if e["choices"][0]["delta"].get("tool_calls")]
    assert len(call_chunks) == 4  # two chunks per call, arguments never split
    assert call_chunks[0][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert call_chunks[1][0] == {"index": 0, "function": {"arguments": calls[0]["function"]["arguments"]}}
    joined = join_deltas(events)
    assert [(c["name"], c["arguments"]) for c in joined["calls"]] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    assert joined["finish_reason"] == "tool_calls"


def test_content_and_calls(client):
    body = client.post("/v1/chat/completions", json=user("two calls")).json()
    message = body["choices"][0]["message"]
    assert message["content"] == "Sure." and len(message["tool_calls"]) == 2
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"x": [1, 2]}


@pytest.mark.parametrize("stops,expected", [
    ("END", "Once upon a time, the "),
    (["zzz", "the END"], "Once upon a time, "),
    (["upon a t"], "Once "),
    (["nothing matches"], "Once upon a time, the END came. Then more."),
])
def test_stop_strings_blocking_and_streaming(client, stops, expected):
    body = client.post("/v1/chat/completions", json=user("story", stop=stops)).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == expected
    assert choice["message"]["reasoning_content"] == "Plan it."  # stops never cut reasoning
    assert choice["finish_reason"] == "stop"
    _, events = stream(client, "/v1/chat/completions", user("story", stop=stops, stream=True))
    joined = join_deltas(events)
    assert joined["content"] == expected  # a stop split across tokens never leaks


def test_stop_string_stops_generation_early(client, record):
    before = len(record.stop_reasons)
    body = client.post("/v1/chat/completions", json=user("story", stop="upon")).json()
    assert body["choices"][0]["message"]["content"] == "Once "
    assert record.stop_reasons[before:] == ["callback"]
    full = client.post("/v1/chat/completions", json=user("story")).json()
    assert body["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]


def test_stop_applies_to_content_only(client):
    body = client.post("/v1/chat/completions", json=user("story", stop="Plan")).json()
    assert body["choices"][0]["message"]["reasoning_content"] == "Plan it."


def test_finish_reason_length_and_precedence(client):
    body = client.post("/v1/chat/completions", json=user("story", max_tokens=15)).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 15
    cut = client.post("/v1/chat/completions", json=user("weather", max_tokens=40)).json()
    # the first call is still unfinished at 40 tokens: dropped, so the cap decides
    assert cut["choices"][0]["finish_reason"] == "length"
    assert "tool_calls" not in cut["choices"][0]["message"]


def test_finish_reason_tool_calls_beats_length(client):
    """docs/HTTP.md §3.2: a complete call was emitted, then the cap cut the second one: tool_calls."""
    def capped(n: int) -> dict:  # no tools declared: the script's raw call stays unconstrained
        return client.post("/v1/chat/completions", json=user("weather", max_tokens=n)).json()

    full = capped(4096)["usage"]["completion_tokens"]
    low, high = 1, full  # the fewest tokens that complete the first call
    while low < high:
        mid = (low + high) // 2
        if capped(mid)["choices"][0]["message"].get("tool_calls"):
            high = mid
        else:
            low = mid + 1
    body = capped(low)
    assert body["usage"]["completion_tokens"] == low < full  # the cap was reached
    message = body["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert capped(low - 1)["choices"][0]["finish_reason"] == "length"


def test_the_user_text_is_found_whatever_the_header_attributes(client):
    """docs/HTTP.md §9.1: the default reply echoes the last user text; a name changes nothing."""
    named = {"messages": [{"role": "user", "content": "hello", "name": "bob"}],
             "thinking": False}
    body = client.post("/v1/chat/completions", json=named).json()
    assert body["choices"][0]["message"]["content"] == "Echo: hello"
    history = {"messages": [{"role": "user", "content": "first", "name": "ann"},
                            {"role": "assistant", "content": "ok"},
                            {"role": "user", "content": [{"type": "text", "text": "for "},
                                                         {"type": "text", "text": "bob"}],
                             "name": "carl"}]}
    body = client.post("/v1/chat/completions", json=history).json()
    assert body["choices"][0]["message"]["content"] == "Echo: for bob"  # the last one, parts joined


def test_max_completion_tokens_wins(client):
    body = client.post("/v1/chat/completions",
                       json=user("story", max_tokens=30, max_completion_tokens=12)).json()
    assert body["usage"]["completion_tokens"] == 12


def test_malformed_model_output_is_text(client):
    body = client.post("/v1/chat/completions", json=user("raw-markup", thinking=False,
                                                          max_tokens=50)).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hi"


def test_logprobs(client):
    body = client.post("/v1/chat/completions", json=user("story", logprobs=True, stop="END")).json()
    entries = body["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == body["choices"][0]["message"]["content"]
    assert all(e["logprob"] == -0.5 and e["top_logprobs"] == [] for e in entries)
    assert all(e["bytes"] == list(e["token"].encode()) for e in entries)
    _, events = stream(client, "/v1/chat/completions", user("story", logprobs=True, stream=True))
    for event in events[:-1]:
        choice = event["choices"][0]
        if choice["delta"].get("content"):
            assert "".join(e["token"] for e in choice["logprobs"]["content"]) == choice["delta"]["content"]
        else:
            assert choice["logprobs"] is None


def test_every_request_starts_from_a_reset_engine(client, record):
    resets = record.resets
    n = len(record.prompts)
    for text in ("one", "two", "three"):
        client.post("/v1/chat/completions", json=user(text))
    assert record.resets - resets == 3
    assert record.positions_at_generate[n:] == [0, 0, 0]


def test_thinking_switches_reach_the_prompt(client, record):
    def tail():
        return "".join(chr(t) if t < 0x110000 else "|" for t in record.prompts[-1][-12:])

    client.post("/v1/chat/completions", json=user("x"))
    assert tail().endswith("|think|")
    assert "thinking_effort=max" in "".join(chr(t) for t in record.prompts[-1] if t < 0x110000)
    client.post("/v1/chat/completions", json=user("x", reasoning_effort="none"))
    assert tail().endswith("|response|")
    client.post("/v1/chat/completions", json=user("x", reasoning_effort="low"))
    assert "thinking_effort=low" in "".join(chr(t) for t in record.prompts[-1] if t < 0x110000)
    body = client.post("/v1/chat/completions", json=user("x", thinking=False)).json()
    assert "reasoning_content" not in body["choices"][0]["message"]


def test_context_length_exceeded():
    with running(fake(ctx_tokens=64), Settings(fake_engine="builtin", ctx=64)) as (base, app):
        with httpx.Client(base_url=base) as c:
            r = c.post("/v1/chat/completions", json=user("y" * 100))
            err = r.json()["error"]
            assert r.status_code == 400 and err["code"] == "context_length_exceeded"
            assert err["param"] == "messages" and "64" in err["message"]
            r = c.post("/v1/completions", json={"prompt": "z" * 64})
            assert r.json()["error"]["param"] == "prompt"
            ok = c.post("/v1/completions", json={"prompt": "z" * 60}).json()
            assert ok["usage"]["completion_tokens"] <= 4  # clamped to the room left
            assert ok["choices"][0]["finish_reason"] == "length"


def test_engine_error_is_500_and_the_next_request_works(client, record):
    r = client.post("/v1/chat/completions", json=user("boom"))
    assert r.status_code == 500
    err = r.json()["error"]
    assert (err["code"], err["type"]) == ("engine_error", "engine_error")
    assert "E_NOMEM" in err["message"]
    ok = client.post("/v1/chat/completions", json=user("fine"))
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "Echo: fine"


def test_late_engine_error_is_one_sse_event(client):
    _, events = stream(client, "/v1/chat/completions", user("boom-late", stream=True))
    assert events[-1] != "[DONE]"
    assert events[-1]["error"]["code"] == "engine_error"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])


def test_completions(client):
    body = client.post("/v1/completions", json={"prompt": "abc<|open|>"}).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["text"] == "Echo: abc<|open|>" and choice["finish_reason"] == "stop"
    _, events = stream(client, "/v1/completions", {"prompt": "abc", "stream": True,
                                                    "logprobs": 0})
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == "Echo: abc"
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and "waste" in events[-2]
    offsets = [e["choices"][0]["logprobs"]["text_offset"] for e in events[:-2]]
    assert [o[0] for o in offsets if o] == sorted(o[0] for o in offsets if o)
