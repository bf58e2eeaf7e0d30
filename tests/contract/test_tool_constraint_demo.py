"""Constrained tool calls on the default demo model (data/demo-model, converted once
for the session, tests.contract.conftest): forced and named calls, including one of a function the model never
saw, parse and validate against their schemas (``jsonschema``), blocking and streaming, with
the model's own reasoning left free (docs/DECISIONS.md, tool-call constraints)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.contract.conftest import serving_demo
from tests.contract.sse import join_deltas, stream
from waste.tools.demo_data import GET_TIME_TOOL

pytestmark = pytest.mark.native

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "days"], "additionalProperties": False}}}
TOOLS = [GET_TIME_TOOL, WEATHER]
QUESTIONS = ["What time is it in Tokyo?", "What is the capital of France?", "Hi!"]


@pytest.fixture(scope="module")
def served(demo_container):
    with serving_demo(demo_container, max_tokens=400) as base:
        yield base


def _check(calls, allowed):
    assert calls
    for call in calls:
        fn = call.get("function", call)
        assert fn["name"] in allowed
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == fn["name"])
        jsonschema.validate(json.loads(fn["arguments"]), schema)


@pytest.mark.parametrize("choice", ["required", "get_time", "get_weather"])
@pytest.mark.parametrize("question", QUESTIONS)
def test_forced_calls_on_the_demo_model(served, choice, question):
    named = choice != "required"
    tool_choice = {"type": "function", "function": {"name": choice}} if named else "required"
    allowed = {choice} if named else {"get_time", "get_weather"}
    body = {"messages": [{"role": "user", "content": question}], "tools": TOOLS, "tool_choice": tool_choice,
            "temperature": 0}
    with httpx.Client(base_url=served, timeout=600) as client:
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        choice_out = reply.json()["choices"][0]
        assert choice_out["finish_reason"] == "tool_calls", choice_out
        _check(choice_out["message"]["tool_calls"], allowed)
        _, events = stream(client, "/v1/chat/completions", {**body, "temperature": 1.0, "seed": 7, "stream": True})
        joined = join_deltas(events)
        assert joined["finish_reason"] == "tool_calls", joined
        _check(joined["calls"], allowed)


def test_auto_keeps_both_text_and_calls_possible(served):
    """Under ``auto`` the same grammar lets the model answer in text or call a tool."""
    with httpx.Client(base_url=served, timeout=600) as client:
        def ask(question):
            reply = client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": question}], "tools": TOOLS, "temperature": 0})
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]

        call = ask("What time is it in Tokyo?")
        assert call["finish_reason"] == "tool_calls", call
        _check(call["message"]["tool_calls"], {"get_time", "get_weather"})
        text = ask("What is 2 plus 3?")
        assert text["finish_reason"] == "stop" and text["message"]["content"], text
        assert "tool_calls" not in text["message"]
