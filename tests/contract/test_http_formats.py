"""The chat.json path and the no-chat-format container over real sockets (docs/CHATJSON.md, docs/HTTP.md §2.5)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.contract.serving import fake, running, state_of
from tests.contract.sse import join_deltas, stream
from waste.app import Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KIMI_LINEAR = json.loads((EXAMPLES / "chat-kimi-linear.json").read_text())
GLM = json.loads((EXAMPLES / "chat-glm.json").read_text())


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


@pytest.fixture(scope="module")
def kimi_linear():
    script = {"format": "chat.json", "chat_json": KIMI_LINEAR, "k2_tool_markers": True,
              "replies": [{"when": "weather", "content": "Checking.",
                           "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}]}
    with running(fake(script), Settings(fake_engine="builtin")) as served:
        yield served


@pytest.fixture(scope="module")
def glm():
    with running(fake({"format": "chat.json", "chat_json": GLM}),
                 Settings(fake_engine="builtin")) as served:
        yield served


def test_kimi_linear_plain_chat(kimi_linear):
    base, app = kimi_linear
    with httpx.Client(base_url=base) as c:
        assert c.get("/health").json()["chat_format"] == "chat.json"
        caps = c.get("/v1/models").json()["data"][0]["waste"]["chat_format"]
        assert caps == {"kind": "chat.json", "reasoning": False, "tools": True, "images": False,
                        "error": None}
        body = c.post("/v1/chat/completions", json=chat("hello")).json()
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "Echo: hello"}
        assert body["choices"][0]["finish_reason"] == "stop"
    prompt = state_of(app).service.engine.record.prompts[-1]
    engine = state_of(app).service.engine
    text = engine.detokenize(prompt).decode()
    assert text == "<|im_user|>user<|im_middle|>hello<|im_end|><|im_assistant|>assistant<|im_middle|>"
    assert not text.startswith("<|im_system|>")  # no system prompt is ever invented


def test_kimi_linear_tools_round_trip(kimi_linear):
    base, app = kimi_linear
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with httpx.Client(base_url=base) as c:
        body = c.post("/v1/chat/completions", json=chat("weather?", tools=tools)).json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["id"] == "functions.get_weather:0"
        assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
        _, events = stream(c, "/v1/chat/completions", chat("weather?", tools=tools, stream=True))
        joined = join_deltas(events)
        assert joined["calls"][0]["name"] == "get_weather" and joined["content"] == "Checking."
        followup = {"messages": [
            {"role": "user", "content": "weather?"}, choice["message"],
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}], "tools": tools}
        assert c.post("/v1/chat/completions", json=followup).status_code == 200
    text = state_of(app).service.engine.detokenize(state_of(app).service.engine.record.prompts[-1]).decode()
    assert "## Return of functions.get_weather:0\nsunny" in text


@pytest.mark.parametrize("body,param", [
    (chat("x", reasoning_effort="low"), "reasoning_effort"),
    (chat("x", thinking=True), "thinking"),
])
def test_kimi_linear_refuses_what_it_cannot_express(kimi_linear, body, param):
    with httpx.Client(base_url=kimi_linear[0]) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("unsupported_by_format", param)


def test_glm_reasoning_and_stop(glm):
    base, app = glm
    with httpx.Client(base_url=base) as c:
        body = c.post("/v1/chat/completions", json=chat("hi")).json()
        message = body["choices"][0]["message"]
        assert message["reasoning_content"] == "Thinking." and message["content"] == "Echo: hi"
        history = {"messages": [{"role": "user", "content": "a"},
                                {"role": "assistant", "content": "b", "reasoning_content": "r"},
                                {"role": "user", "content": "c"}]}
        c.post("/v1/chat/completions", json=history)
    engine = state_of(app).service.engine
    text = engine.detokenize(engine.record.prompts[-1]).decode()
    assert text == "[gMASK]<sop><|user|>a<|assistant|><think>r</think>b<|user|>c<|assistant|><think>"


def test_glm_effort_and_refusals(glm):
    base, app = glm
    with httpx.Client(base_url=base) as c:
        assert c.post("/v1/chat/completions", json=chat("x", reasoning_effort="high")).status_code == 200
        engine = state_of(app).service.engine
        text = engine.detokenize(engine.record.prompts[-1]).decode()
        assert text.startswith("[gMASK]<sop><|system|>Reasoning Effort: High<|user|>x")
        off = c.post("/v1/chat/completions", json=chat("x", thinking=False))
        assert off.status_code == 400 and off.json()["error"]["param"] == "thinking"
        # "tools": "glm" in its chat.json: tools are declared in GLM's markup, not refused
        tools = c.post("/v1/chat/completions", json=chat(
            "x", tools=[{"type": "function", "function": {"name": "f"}}]))
        assert tools.status_code == 200, tools.text
        text = engine.detokenize(engine.record.prompts[-1]).decode()
        assert text.startswith("[gMASK]<sop><|system|># Tools") and '{"name": "f"}' in text
        assert "<tool_call>{function-name}<arg_key>" in text


def test_container_without_a_chat_format_still_serves_the_rest():
    with running(fake({"format": "none"}), Settings(fake_engine="builtin")) as (base, app):
        with httpx.Client(base_url=base) as c:
            assert c.get("/health").json()["chat_format"] is None
            caps = c.get("/v1/models").json()["data"][0]["waste"]["chat_format"]
            assert caps["kind"] is None and "XTML" in caps["error"] and "chat.json" in caps["error"]
            r = c.post("/v1/chat/completions", json=chat("x"))
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["code"] == "unsupported_chat_format" and err["param"] is None
            assert "/v1/completions" in err["message"] and "chat.json" in err["message"]
            invalid = c.post("/v1/chat/completions", json={"messages": "not a list"})
            assert invalid.json()["error"]["code"] == "unsupported_chat_format"  # step 6 < step 7
            done = c.post("/v1/completions", json={"prompt": "raw"}).json()
            assert done["choices"][0]["text"] == "Echo: raw"
