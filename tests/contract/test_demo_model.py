"""The embedded demo model through the whole product: the committed weights (data/demo-model),
converted by the project's converter, served by libwaste over HTTP on a real socket.

More than a hundred held-out conversations (questions never trained on, every task family,
tool calls and tool results included) must all come back well formed, in the right fields,
and at least 95 % right; a few go through the official openai client, blocking and streamed.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest

from tests.contract.conftest import load_native
from tests.contract.serving import running
from waste.app import Settings, engine_opener
from waste.tools import demo_data
from waste.tools.convert import convert

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo-model"
PER_FAMILY = 12  # 9 families: 108 held-out conversations


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((DEMO / "manifest.json").read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    load_native()
    container = convert(DEMO, tmp_path_factory.mktemp("demo") / "demo.waste")
    # One engine thread: on a loaded machine, threads pinned to busy cores wait on each other.
    settings = Settings(model=str(container), usage="", max_tokens=160, threads=1)
    with running(engine_opener(settings), settings) as (base, _):
        yield base


@pytest.fixture(scope="module")
def held_out(served, manifest) -> list[tuple[demo_data.Example, dict]]:
    """Every held-out conversation sent once, greedy: (example, the response's choice)."""
    examples = demo_data.held_out_examples(manifest["seed"], PER_FAMILY)
    assert len(examples) >= 100 and {e.family for e in examples} == set(demo_data.FAMILIES)
    out = []
    with httpx.Client(base_url=served, timeout=120) as client:
        for ex in examples:
            r = client.post("/v1/chat/completions", json={**ex.body, "temperature": 0})
            assert r.status_code == 200, r.text
            out.append((ex, r.json()["choices"][0]))
    return out


def test_the_committed_files_are_the_manifest_s(manifest):
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((DEMO / name).read_bytes()).hexdigest() == digest, name
    assert {"config.json", "model.safetensors", "tiktoken.model", "tokenizer_config.json"} <= set(manifest["sha256"])


def test_every_held_out_reply_is_well_formed(held_out):
    malformed = []
    for ex, choice in held_out:
        well, _ = demo_data.grade(ex, choice["message"])
        if not well or choice["finish_reason"] != ("tool_calls" if ex.reply.calls else "stop"):
            malformed.append((ex.family, ex.body["messages"][-1], choice))
    assert not malformed, malformed


def test_held_out_answers_are_right(held_out):
    right, wrong = Counter(), []
    for ex, choice in held_out:
        correct = demo_data.grade(ex, choice["message"])[1]
        right[ex.family] += correct
        if not correct:
            wrong.append((ex.family, ex.reply.content or ex.reply.calls, choice["message"]))
    assert len(wrong) <= 0.05 * len(held_out), (dict(right), wrong)


def test_the_openai_client_gets_reasoning_and_an_answer(served):
    with openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        question = [{"role": "user", "content": "What is 47 plus 38?"}]
        r = client.chat.completions.create(model="demo", messages=question, temperature=0)
        message = r.choices[0].message
        assert "85" in message.content and "47 + 38" in message.model_extra["reasoning_content"]
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(model="demo", messages=question, temperature=0,
                                                    stream=True):
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                content += delta.content or ""
        assert (reasoning, content) == (message.model_extra["reasoning_content"], message.content)


def test_the_openai_client_gets_a_tool_call_and_an_answer_from_its_result(served):
    with openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        messages = [{"role": "user", "content": "What time is it in Tokyo?"}]
        r = client.chat.completions.create(model="demo", messages=messages,
                                           tools=[demo_data.GET_TIME_TOOL], temperature=0)
        assert r.choices[0].finish_reason == "tool_calls"
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_time"
        assert json.loads(call.function.arguments) == {"tz": "Asia/Tokyo"}
        streamed = {}
        for chunk in client.chat.completions.create(model="demo", messages=messages, stream=True,
                                                    tools=[demo_data.GET_TIME_TOOL], temperature=0):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = streamed.setdefault(tc.index, {"name": "", "arguments": ""})
                entry["name"] += (tc.function.name or "") if tc.function else ""
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
        assert [(e["name"], json.loads(e["arguments"])) for e in streamed.values()] == [
            ("get_time", {"tz": "Asia/Tokyo"})]
        messages += [r.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "08:42"}]
        r = client.chat.completions.create(model="demo", messages=messages,
                                           tools=[demo_data.GET_TIME_TOOL], temperature=0)
        assert r.choices[0].message.content == "It is 08:42 in Tokyo."
