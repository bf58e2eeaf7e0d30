"""The server serves a Kimi K3 container through the real engine: a tiny synthetic container
with every K3 delta on (``make_container --k3``: SiTU, latent MoE, attention residuals, MLA
q-LoRA + output gate, full-rank KDA gate, lower-bound decay; arch ``kimi_k3``) and K3's XTML
tokenizer, answering chat with thinking, tools and effort (docs/HTTP.md, docs/XTML.md §5).
Random weights say nothing sensible; what is checked is the wire: the format resolved, the
request options reaching the prompt, well-formed replies, and the K3-only refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.contract.serving import running
from waste.app import Settings, engine_loader
from waste.tools.make_container import Geometry, build_container

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.fixture(scope="module")
def k3_container(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("k3") / "k3.waste"
    return build_container(out, seed=4, geometry=Geometry(k3=True, layers=4, layout="KMKM"))


@pytest.fixture(scope="module")
def client(native, k3_container):
    settings = Settings(model=str(k3_container), ctx=1024, usage="", max_tokens=12)
    with running(engine_loader(settings), settings) as (base, _):
        with httpx.Client(base_url=base, timeout=120) as c:
            yield c


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def test_a_k3_container_is_served_as_k3_with_xtml(client, k3_container):
    manifest = json.loads((k3_container / "manifest.json").read_text())
    assert manifest["arch"] == "kimi_k3" and manifest["config"]["hidden_act"] == "situ"
    assert manifest["config"]["attn_res_block_size"] == 2 and manifest["config"]["routed_expert_hidden_size"] == 32
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["chat_format"] == "xtml" and health["fake_engine"] is False
    waste = client.get("/v1/models").json()["data"][0]["waste"]
    assert waste["arch"] == "kimi_k3" and waste["n_layers"] == 4
    assert 0 < waste["params_active"] < waste["params_total"]


def _reply(client, body: dict) -> dict:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    assert 0 < out["usage"]["completion_tokens"] <= body.get("max_tokens", 12)
    return out


def test_chat_with_thinking_tools_and_effort(client):
    plain = _reply(client, chat("What is the weather in Paris?", thinking=False))
    assert "reasoning_content" not in plain["choices"][0]["message"]
    thinking = _reply(client, chat("What is the weather in Paris?"))
    # The thinking channel and the effort line are in the prompt: it is longer than without.
    assert thinking["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
    tools = _reply(client, chat("What is the weather in Paris?", tools=TOOLS, tool_choice="auto"))
    # The tool declaration is rendered into the prompt.
    assert tools["usage"]["prompt_tokens"] > thinking["usage"]["prompt_tokens"] + 10
    for effort in ("low", "high", "max"):
        _reply(client, chat("Think about it.", reasoning_effort=effort))
    # Greedy decode on the same prompt repeats through the real engine.
    again = _reply(client, chat("What is the weather in Paris?", thinking=False))
    assert again["choices"][0]["message"] == plain["choices"][0]["message"]


def test_k3_refuses_medium_effort_by_name(client):
    r = client.post("/v1/chat/completions", json=chat("x", reasoning_effort="medium"))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_value" and err["param"] == "reasoning_effort"


def test_streamed_k3_chat_carries_the_same_text(client):
    body = chat("Say something.", thinking=False, max_tokens=8)
    whole = _reply(client, body)["choices"][0]["message"].get("content") or ""
    text = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
                text.append(delta.get("content") or "")
    assert "".join(text) == whole
