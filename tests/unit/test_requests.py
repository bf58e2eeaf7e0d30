"""Request validation (docs/HTTP.md §2, §5, §7 sources; docs/XTML.md §5): one table row per rule.

Each refusal row is body → (code, param, a substring of the message). Acceptance rows use bodies
captured from the real openai client (through an httpx mock transport) and Open-WebUI-shaped
bodies; hypothesis checks that nothing but `InvalidRequest` ever escapes.
"""

from __future__ import annotations

import copy
import json

import httpx
import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waste.domain.errors import InvalidRequest
from waste.domain.requests import (
    ChatRequest,
    CompletionRequest,
    ImagePart,
    ThinkingChoice,
    image_kind,
    local_image_path,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
    resolve_thinking,
)
from waste.domain.requests.json_body import MAX_NESTING, nesting_depth

USER = {"role": "user", "content": "hi"}
TOOL_F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def chat(**fields):
    """A valid minimal chat body with `fields` merged in (None values are sent as null)."""
    body = {"messages": [USER]}
    body.update(fields)
    return body


def msg(**fields):
    return chat(messages=[fields])


def assistant_call(**call):
    return chat(messages=[USER, {"role": "assistant", "content": None, "tool_calls": [call]}])


def prompt(**fields):
    body = {"prompt": "Once upon"}
    body.update(fields)
    return body


class _Contains(str):
    """Compares equal to any string containing it: lets a row's message column be a substring."""

    def __eq__(self, other):
        return isinstance(other, str) and str.__contains__(other, self)

    __hash__ = str.__hash__


def refusal(parse, body):
    with pytest.raises(InvalidRequest) as info:
        parse(body)
    err = info.value
    return err.code, err.param, str(err)


# --------------------------------------------------------------------------- chat refusals
MISSING, TYPE, VALUE, UNSUP = "missing_required_parameter", "invalid_type", "invalid_value", "unsupported_value"
LONG_ARRAY_ARGS = "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)

CHAT_REFUSALS = [
    # messages (§2.2 row 1, §2.3)
    ("messages absent", {}, MISSING, "messages", "required"),
    ("messages null", {"messages": None}, MISSING, "messages", "required"),
    ("messages not list", {"messages": "hi"}, TYPE, "messages", "array"),
    ("messages object", {"messages": {"role": "user"}}, TYPE, "messages", "not an object"),
    ("messages empty", {"messages": []}, VALUE, "messages", "empty"),
    ("message not object", chat(messages=[USER, "hi"]), TYPE, "messages[1]", "object"),
    ("role missing", msg(content="x"), MISSING, "messages[0].role", "required"),
    ("role not string", msg(role=1, content="x"), TYPE, "messages[0].role", "string"),
    ("role unknown", msg(role="function", content="x"), VALUE, "messages[0].role", "developer"),
    ("role wrong case", msg(role="User", content="x"), VALUE, "messages[0].role", "'User'"),
    ("role long is cut short", msg(role="x" * 5000, content="x"), VALUE, "messages[0].role", "xxx…"),
    ("user content missing", msg(role="user"), MISSING, "messages[0].content", "user message"),
    ("user content null", msg(role="user", content=None), MISSING, "messages[0].content", "required"),
    ("system content missing", msg(role="system"), MISSING, "messages[0].content", "system"),
    ("developer content missing", msg(role="developer"), MISSING, "messages[0].content", "developer"),
    ("tool content missing", msg(role="tool", tool_call_id="c"), MISSING, "messages[0].content", "tool"),
    ("content number", msg(role="user", content=5), TYPE, "messages[0].content", "an integer"),
    ("content object", msg(role="user", content={"type": "text"}), TYPE, "messages[0].content", "array of content parts"),
    ("assistant content number", chat(messages=[USER, {"role": "assistant", "content": 1.5}]), TYPE, "messages[1].content", "fraction"),
    ("part not object", msg(role="user", content=["x"]), TYPE, "messages[0].content[0]", "content part"),
    ("part type missing", msg(role="user", content=[{"text": "x"}]), MISSING, "messages[0].content[0].type", "type"),
    ("part type not string", msg(role="user", content=[{"type": 3}]), TYPE, "messages[0].content[0].type", "string"),
    ("part type unknown", msg(role="user", content=[{"type": "video"}]), VALUE, "messages[0].content[0].type", "text or image_url"),
    ("part type audio", msg(role="user", content=[{"type": "input_audio", "input_audio": {}}]), UNSUP, "messages[0].content[0].type", "not supported"),
    ("part type file", msg(role="user", content=[{"type": "file", "file": {}}]), UNSUP, "messages[0].content[0].type", "'file'"),
    ("text part no text", msg(role="user", content=[{"type": "text"}]), MISSING, "messages[0].content[0].text", "text"),
    ("text part text number", msg(role="user", content=[{"type": "text", "text": 1}]), TYPE, "messages[0].content[0].text", "string"),
    ("second part bad", msg(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": None}]), MISSING, "messages[0].content[1].text", "text"),
    ("image in system", msg(role="system", content=[{"type": "image_url", "image_url": {"url": "data:,"}}]), VALUE, "messages[0].content[0]", "user messages only"),
    ("image in assistant", chat(messages=[USER, {"role": "assistant", "content": [{"type": "image", "image": "data:,"}]}]), VALUE, "messages[1].content[0]", "user messages only"),
    ("image in tool", msg(role="tool", content=[{"type": "image_url", "image_url": "data:,"}]), VALUE, "messages[0].content[0]", "user messages only"),
    ("image_url missing", msg(role="user", content=[{"type": "image_url"}]), MISSING, "messages[0].content[0].image_url", "URL"),
    ("image_url number", msg(role="user", content=[{"type": "image_url", "image_url": 5}]), TYPE, "messages[0].content[0].image_url", "url"),
    ("image_url.url missing", msg(role="user", content=[{"type": "image_url", "image_url": {"detail": "low"}}]), MISSING, "messages[0].content[0].image_url.url", "url"),
    ("image_url.url number", msg(role="user", content=[{"type": "image_url", "image_url": {"url": 1}}]), TYPE, "messages[0].content[0].image_url.url", "string"),
    ("image missing", msg(role="user", content=[{"type": "image"}]), MISSING, "messages[0].content[0].image", "URL"),
    ("image object", msg(role="user", content=[{"type": "image", "image": {"url": "data:,"}}]), TYPE, "messages[0].content[0].image", "URL string"),
    ("name number", msg(role="user", content="x", name=1), TYPE, "messages[0].name", "string"),
    ("reasoning_content number", chat(messages=[USER, {"role": "assistant", "content": "", "reasoning_content": 1}]), TYPE, "messages[1].reasoning_content", "string"),
    ("reasoning list", chat(messages=[USER, {"role": "assistant", "content": "", "reasoning": ["x"]}]), TYPE, "messages[1].reasoning", "string"),
    ("tool_calls object", chat(messages=[USER, {"role": "assistant", "tool_calls": {}}]), TYPE, "messages[1].tool_calls", "array"),
    ("tool call not object", chat(messages=[USER, {"role": "assistant", "tool_calls": ["f"]}]), TYPE, "messages[1].tool_calls[0]", "tool call"),
    ("tool call id number", assistant_call(id=1, function={"name": "f"}), TYPE, "messages[1].tool_calls[0].id", "string"),
    ("tool call type other", assistant_call(type="custom", function={"name": "f"}), VALUE, "messages[1].tool_calls[0].type", "function"),
    ("tool call function missing", assistant_call(id="c"), MISSING, "messages[1].tool_calls[0].function.name", "name"),
    ("tool call function string", assistant_call(function="f"), TYPE, "messages[1].tool_calls[0].function", "object"),
    ("tool call name missing", assistant_call(function={"arguments": "{}"}), MISSING, "messages[1].tool_calls[0].function.name", "name"),
    ("tool call name number", assistant_call(function={"name": 1}), TYPE, "messages[1].tool_calls[0].function.name", "string"),
    ("tool call name empty", assistant_call(function={"name": ""}), VALUE, "messages[1].tool_calls[0].function.name", "empty"),
    ("arguments number", assistant_call(function={"name": "f", "arguments": 5}), TYPE, "messages[1].tool_calls[0].function.arguments", "object"),
    ("arguments list", assistant_call(function={"name": "f", "arguments": [1]}), TYPE, "messages[1].tool_calls[0].function.arguments", "an array"),
    ("arguments string array", assistant_call(function={"name": "f", "arguments": "[1]"}), VALUE, "messages[1].tool_calls[0].function.arguments", "JSON object, not an array"),
    ("arguments string number", assistant_call(function={"name": "f", "arguments": "5"}), VALUE, "messages[1].tool_calls[0].function.arguments", "not a number"),
    ("arguments string null", assistant_call(function={"name": "f", "arguments": "null"}), VALUE, "messages[1].tool_calls[0].function.arguments", "not null"),
    ("arguments string string", assistant_call(function={"name": "f", "arguments": '"x"'}), VALUE, "messages[1].tool_calls[0].function.arguments", "not a string"),
    ("arguments string true", assistant_call(function={"name": "f", "arguments": "true"}), VALUE, "messages[1].tool_calls[0].function.arguments", "not a boolean"),
    ("arguments string NaN", assistant_call(function={"name": "f", "arguments": "NaN"}), VALUE, "messages[1].tool_calls[0].function.arguments", "number"),
    ("arguments too deep", assistant_call(function={"name": "f", "arguments": '{"a":' + LONG_ARRAY_ARGS + "}"}), VALUE, "messages[1].tool_calls[0].function.arguments", "nested"),
    ("arguments lone surrogate", assistant_call(function={"name": "f", "arguments": '{"a": "\\udfff"}'}), VALUE, "messages[1].tool_calls[0].function.arguments", "surrogate"),
    ("arguments recursion", assistant_call(function={"name": "f", "arguments": '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"}), VALUE, "messages[1].tool_calls[0].function.arguments", "nested"),
    ("arguments huge int", assistant_call(function={"name": "f", "arguments": '{"a":' + "9" * 5000 + "}"}), VALUE, "messages[1].tool_calls[0].function.arguments", "digits"),
    ("tool_call_id number", msg(role="tool", content="r", tool_call_id=7), TYPE, "messages[0].tool_call_id", "string"),
    ("tool name number", msg(role="tool", content="r", name=7), TYPE, "messages[0].name", "string"),
    ("first bad message answers", chat(messages=[USER, {"role": "bogus"}, {"role": 1}]), VALUE, "messages[1].role", "bogus"),
    ("messages before tools", {"messages": [], "tools": 5}, VALUE, "messages", "empty"),
    # tools
    ("tools object", chat(tools={}), TYPE, "tools", "array"),
    ("tool not object", chat(tools=["f"]), TYPE, "tools[0]", "tool"),
    ("tool type missing", chat(tools=[{"function": {"name": "f"}}]), MISSING, "tools[0].type", "function"),
    ("tool type other", chat(tools=[TOOL_F, {"type": "code_interpreter"}]), VALUE, "tools[1].type", "code_interpreter"),
    ("tool type number", chat(tools=[{"type": 1}]), TYPE, "tools[0].type", "string"),
    ("tool function missing", chat(tools=[{"type": "function"}]), MISSING, "tools[0].function", "function object"),
    ("tool function string", chat(tools=[{"type": "function", "function": "f"}]), TYPE, "tools[0].function", "object"),
    ("tool name missing", chat(tools=[{"type": "function", "function": {}}]), MISSING, "tools[0].function.name", "name"),
    ("tool name number", chat(tools=[{"type": "function", "function": {"name": 1}}]), TYPE, "tools[0].function.name", "string"),
    ("tool name empty", chat(tools=[{"type": "function", "function": {"name": ""}}]), VALUE, "tools[0].function.name", "empty"),
    ("tool description number", chat(tools=[{"type": "function", "function": {"name": "f", "description": 1}}]), TYPE, "tools[0].function.description", "string"),
    ("tool parameters list", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]), TYPE, "tools[0].function.parameters", "object"),
    ("tools before tool_choice", chat(tools=5, tool_choice=5), TYPE, "tools", "array"),
    # tool_choice
    ("tool_choice unknown string", chat(tool_choice="any"), VALUE, "tool_choice", "auto, none, required"),
    ("tool_choice number", chat(tool_choice=1), TYPE, "tool_choice", "string or an object"),
    ("tool_choice wrong type", chat(tools=[TOOL_F], tool_choice={"type": "tool", "function": {"name": "f"}}), VALUE, "tool_choice", "function"),
    ("tool_choice no function", chat(tools=[TOOL_F], tool_choice={"type": "function"}), VALUE, "tool_choice", "name"),
    ("tool_choice name number", chat(tools=[TOOL_F], tool_choice={"type": "function", "function": {"name": 1}}), VALUE, "tool_choice", "name"),
    ("tool_choice undeclared", chat(tools=[TOOL_F], tool_choice={"type": "function", "function": {"name": "g"}}), VALUE, "tool_choice", "'g'"),
    ("tool_choice without tools", chat(tool_choice={"type": "function", "function": {"name": "f"}}), VALUE, "tool_choice", "does not declare"),
    ("tool_choice with tools []", chat(tools=[], tool_choice={"type": "function", "function": {"name": "f"}}), VALUE, "tool_choice", "does not declare"),
    # response_format
    ("response_format string", chat(response_format="json_object"), TYPE, "response_format", "object"),
    ("response_format no type", chat(response_format={}), MISSING, "response_format.type", "json_object"),
    ("response_format type number", chat(response_format={"type": 1}), TYPE, "response_format.type", "string"),
    ("response_format type other", chat(response_format={"type": "json"}), VALUE, "response_format.type", "json_schema"),
    ("response_format schema string", chat(response_format={"type": "json_schema", "json_schema": "s"}), TYPE, "response_format.json_schema", "object"),
    # A boolean schema reached llguidance, which raised (a 500 schemathesis found).
    ("response_format schema boolean", chat(response_format={"type": "json_schema", "json_schema": {"schema": False}}), TYPE, "response_format.json_schema.schema", "object"),
    # sampling
    ("temperature string", chat(temperature="0.5"), TYPE, "temperature", "number"),
    ("temperature bool", chat(temperature=True), TYPE, "temperature", "boolean"),
    ("temperature negative", chat(temperature=-0.1), VALUE, "temperature", "between 0 and 2"),
    ("temperature huge", chat(temperature=10**5000), VALUE, "temperature", "a very large integer"),
    ("temperature above 2", chat(temperature=2.0001), VALUE, "temperature", "between 0 and 2"),
    ("top_p zero", chat(top_p=0), VALUE, "top_p", "greater than 0"),
    ("top_p above 1", chat(top_p=1.5), VALUE, "top_p", "at most 1"),
    ("top_p bool", chat(top_p=False), TYPE, "top_p", "boolean"),
    ("top_k float", chat(top_k=40.0), TYPE, "top_k", "integer"),
    ("top_k exponent", parse_json_body(b'{"messages":[{"role":"user","content":"x"}],"top_k":1e1}'), TYPE, "top_k", "integer"),
    ("top_k negative", chat(top_k=-1), VALUE, "top_k", "between 0"),
    ("top_k too big", chat(top_k=2**31), VALUE, "top_k", "2147483647"),
    ("seed float", chat(seed=1.0), TYPE, "seed", "integer"),
    ("seed bool", chat(seed=True), TYPE, "seed", "boolean"),
    ("seed too big", chat(seed=2**64), VALUE, "seed", "2**64"),
    ("seed too small", chat(seed=-(2**63) - 1), VALUE, "seed", "-2**63"),
    ("max_completion_tokens zero", chat(max_completion_tokens=0), VALUE, "max_completion_tokens", "at least 1"),
    ("max_completion_tokens string", chat(max_completion_tokens="5"), TYPE, "max_completion_tokens", "integer"),
    ("max_tokens checked too", chat(max_completion_tokens=5, max_tokens=0), VALUE, "max_tokens", "at least 1"),
    ("max_tokens float", chat(max_tokens=5.0), TYPE, "max_tokens", "integer"),
    ("stop empty string", chat(stop=""), VALUE, "stop", "empty"),
    ("stop number", chat(stop=5), TYPE, "stop", "string or an array"),
    ("stop five strings", chat(stop=["a", "b", "c", "d", "e"]), VALUE, "stop", "at most 4"),
    ("stop item number", chat(stop=["a", 1]), TYPE, "stop[1]", "string"),
    ("stop item empty", chat(stop=["a", ""]), VALUE, "stop[1]", "empty"),
    ("stop item null", chat(stop=[None]), TYPE, "stop[0]", "null"),
    ("n nine", chat(n=9), VALUE, "n", "from 1 to 8"),
    ("n zero", chat(n=0), VALUE, "n", "from 1 to 8"),
    ("n string", chat(n="1"), TYPE, "n", "integer"),
    ("n float", chat(n=1.0), TYPE, "n", "integer"),
    ("stream string", chat(stream="true"), TYPE, "stream", "boolean"),
    ("stream number", chat(stream=1), TYPE, "stream", "boolean"),
    ("logprobs number", chat(logprobs=1), TYPE, "logprobs", "boolean"),
    ("stream_options list", chat(stream=True, stream_options=[]), TYPE, "stream_options", "object"),
    ("include_usage string", chat(stream=True, stream_options={"include_usage": "yes"}), TYPE, "stream_options.include_usage", "boolean"),
    ("include_usage number", chat(stream=True, stream_options={"include_usage": 1}), TYPE, "stream_options.include_usage", "boolean"),
    ("top_logprobs without logprobs", chat(top_logprobs=20), VALUE, "top_logprobs", "needs logprobs"),
    ("top_logprobs 21", chat(top_logprobs=21), VALUE, "top_logprobs", "between 0 and 20"),
    ("top_logprobs negative", chat(top_logprobs=-1), VALUE, "top_logprobs", "between 0 and 20"),
    ("top_logprobs float", chat(top_logprobs=0.0), TYPE, "top_logprobs", "integer"),
    # thinking (§2.4)
    ("effort medium", chat(reasoning_effort="medium"), UNSUP, "reasoning_effort", "K3's encoder accepts only low, high and max"),
    ("effort medium names it", chat(thinking_effort="medium"), UNSUP, "thinking_effort", "medium"),
    ("reasoning.effort medium", chat(reasoning={"effort": "medium"}), UNSUP, "reasoning.effort", "low, high and max"),
    ("effort unknown", chat(reasoning_effort="extreme"), VALUE, "reasoning_effort", "low, high, max"),
    ("effort wrong case", chat(reasoning_effort="High"), VALUE, "reasoning_effort", "exact lowercase"),
    ("effort number", chat(reasoning_effort=1), TYPE, "reasoning_effort", "string"),
    ("reasoning not object", chat(reasoning="high"), TYPE, "reasoning", "object"),
    ("efforts disagree", chat(reasoning_effort="low", thinking_effort="high"), VALUE, "thinking_effort", "contradicts reasoning_effort"),
    ("efforts on vs off", chat(reasoning={"effort": "max"}, thinking_effort="none"), VALUE, "thinking_effort", "reasoning.effort"),
    ("efforts off vs on", chat(reasoning_effort="off", reasoning={"effort": "low"}), VALUE, "reasoning.effort", "contradicts"),
    ("medium before disagreement", chat(reasoning_effort="medium", thinking_effort="low"), UNSUP, "reasoning_effort", "medium"),
    ("switch string", chat(thinking="true"), TYPE, "thinking", "boolean"),
    ("switch anthropic object", chat(thinking={"type": "enabled"}), TYPE, "thinking", "boolean"),
    ("chat_template_kwargs not object", chat(chat_template_kwargs=True), TYPE, "chat_template_kwargs", "object"),
    ("kwargs switch number", chat(chat_template_kwargs={"enable_thinking": 0}), TYPE, "chat_template_kwargs.enable_thinking", "boolean"),
    ("switches disagree", chat(thinking=True, chat_template_kwargs={"enable_thinking": False}), VALUE, "chat_template_kwargs.enable_thinking", "contradicts thinking"),
    ("kwargs switches disagree", chat(chat_template_kwargs={"thinking": False, "enable_thinking": True}), VALUE, "chat_template_kwargs.enable_thinking", "chat_template_kwargs.thinking"),
    ("false with on effort", chat(reasoning_effort="low", thinking=False), VALUE, "reasoning_effort", "contradict"),
    ("true with off effort", chat(thinking_effort="none", chat_template_kwargs={"enable_thinking": True}), VALUE, "thinking_effort", "contradict"),
    ("false with on effort (reasoning.effort)", chat(reasoning={"effort": "max"}, thinking=False), VALUE, "reasoning.effort", "contradict"),
    # deprecated function calling
    ("functions", chat(functions=[{"name": "f"}]), UNSUP, "functions", "use tools"),
    ("function_call", chat(function_call="auto"), UNSUP, "function_call", "use tools"),
    ("thinking before functions", chat(functions=[], reasoning_effort="medium"), UNSUP, "reasoning_effort", "medium"),
]


@pytest.mark.parametrize(
    ("body", "code", "param", "text"), [row[1:] for row in CHAT_REFUSALS], ids=[row[0] for row in CHAT_REFUSALS]
)
def test_chat_refusals(body, code, param, text):
    assert refusal(parse_chat_request, body) == (code, param, _Contains(text))


# --------------------------------------------------------------------------- completions refusals
COMPLETION_REFUSALS = [
    ("prompt absent", {}, MISSING, "prompt", "required"),
    ("prompt null", {"prompt": None}, MISSING, "prompt", "required"),
    ("prompt number", {"prompt": 5}, TYPE, "prompt", "string"),
    ("prompt tokens", {"prompt": [1, 2, 3]}, TYPE, "prompt", "token arrays"),
    ("prompt token batches", {"prompt": [[1, 2]]}, TYPE, "prompt", "token arrays"),
    ("prompt mixed", {"prompt": ["a", 1]}, TYPE, "prompt", "token arrays"),
    ("prompt two strings", {"prompt": ["a", "b"]}, UNSUP, "prompt", "one prompt"),
    ("prompt empty list", {"prompt": []}, VALUE, "prompt", "empty"),
    ("prompt empty string", {"prompt": ""}, VALUE, "prompt", "empty"),
    ("prompt [\"\"]", {"prompt": [""]}, VALUE, "prompt", "empty"),
    ("temperature", prompt(temperature=3), VALUE, "temperature", "between 0 and 2"),
    ("top_p", prompt(top_p="x"), TYPE, "top_p", "number"),
    ("top_k", prompt(top_k=True), TYPE, "top_k", "integer"),
    ("seed", prompt(seed=0.5), TYPE, "seed", "integer"),
    ("max_tokens", prompt(max_tokens=0), VALUE, "max_tokens", "at least 1"),
    ("stop", prompt(stop=["", "a"]), VALUE, "stop[0]", "empty"),
    ("n", prompt(n=9), VALUE, "n", "from 1 to 8"),
    ("stream", prompt(stream="yes"), TYPE, "stream", "boolean"),
    ("stream_options", prompt(stream=True, stream_options={"include_usage": None, "x": 1}, logprobs=True), TYPE, "logprobs", "integer"),
    ("stream_options when streaming", prompt(stream=True, stream_options={"include_usage": "yes"}), TYPE, "stream_options.include_usage", "boolean"),
    ("logprobs bool", prompt(logprobs=False), TYPE, "logprobs", "boolean"),
    ("logprobs float", prompt(logprobs=0.0), TYPE, "logprobs", "integer"),
    ("logprobs 21", prompt(logprobs=21), VALUE, "logprobs", "between 0 and 20"),
    ("logprobs negative", prompt(logprobs=-1), VALUE, "logprobs", "between 0 and 20"),
    ("echo true", prompt(echo=True), UNSUP, "echo", "echo=false"),
    ("echo string", prompt(echo="false"), TYPE, "echo", "boolean"),
    ("suffix string", prompt(suffix="end"), UNSUP, "suffix", "suffix"),
    ("suffix empty string", prompt(suffix=""), UNSUP, "suffix", "null"),
    ("suffix number", prompt(suffix=1), TYPE, "suffix", "string or null"),
    ("best_of two", prompt(best_of=2), UNSUP, "best_of", "best_of=1"),
    ("best_of string", prompt(best_of="1"), TYPE, "best_of", "integer"),
    ("prompt checked first", {"prompt": 1, "temperature": "x"}, TYPE, "prompt", "string"),
]


@pytest.mark.parametrize(
    ("body", "code", "param", "text"),
    [row[1:] for row in COMPLETION_REFUSALS],
    ids=[row[0] for row in COMPLETION_REFUSALS],
)
def test_completion_refusals(body, code, param, text):
    assert refusal(parse_completion_request, body) == (code, param, _Contains(text))


def test_row_matcher_can_fail():
    """The substring column really constrains: a wrong substring or param fails the comparison."""
    got = refusal(parse_chat_request, chat(n=9))
    assert got != (VALUE, "n", _Contains("no such phrase"))
    assert got != (UNSUP, "top_k", _Contains(""))


# --------------------------------------------------------------------------- JSON bodies
def nested(depth: int) -> bytes:
    """A body whose top-level object is level 1 and whose innermost list is level `depth`."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return ('{"messages":' + inner + "}").encode() if depth > 1 else b"{}"


JSON_REFUSALS = [
    ("empty", b"", "empty"),
    ("whitespace", b"  \n", "not valid JSON"),
    ("not utf-8", b'{"a":"\xff"}', "UTF-8"),
    ("latin-1 body", '{"a":"é"}'.encode("latin-1"), "UTF-8"),
    ("utf-8 BOM", b'\xef\xbb\xbf{"a":1}', "JSON"),
    ("syntax", b'{"a":', "not valid JSON"),
    ("trailing comma", b'{"a":1,}', "not valid JSON"),
    ("two values", b"{} {}", "not valid JSON"),
    ("NaN", b'{"temperature":NaN}', "NaN"),
    ("Infinity", b'{"temperature":Infinity}', "Infinity"),
    ("-Infinity", b'{"a":[-Infinity]}', "-Infinity"),
    ("array", b"[]", "JSON object, not an array"),
    ("string", b'"hi"', "JSON object, not a string"),
    ("null", b"null", "JSON object, not null"),
    ("number", b"1", "JSON object"),
    ("too many digits", b'{"seed":' + b"1" * 5000 + b"}", "too many digits"),
    ("nesting 513", nested(MAX_NESTING + 1), "nested more than 512"),
    ("nesting 100000", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
    ("lone surrogate value", b'{"messages":[{"role":"user","content":"\\ud800"}]}', "surrogate"),
    ("lone surrogate key", b'{"\\uDC00":1}', "surrogate"),
    ("low surrogate first", b'{"a":"\\udc00\\ud800"}', "surrogate"),
]


@pytest.mark.parametrize(("raw", "text"), [row[1:] for row in JSON_REFUSALS], ids=[row[0] for row in JSON_REFUSALS])
def test_json_refusals(raw, text):
    assert refusal(parse_json_body, raw) == ("invalid_json", None, _Contains(text))
    assert "JSON" in refusal(parse_json_body, raw)[2]


def test_json_accepts_exactly_512_levels_and_pairs():
    assert parse_json_body(nested(MAX_NESTING))["messages"] == json.loads(nested(MAX_NESTING))["messages"]
    # A surrogate *pair* is one valid character (clients that escape non-ASCII send these).
    assert parse_json_body(b'{"a":"\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    assert parse_json_body(bytearray(b'{"a":1.0,"b":1e3,"c":1}')) == {"a": 1.0, "b": 1000.0, "c": 1}
    assert type(parse_json_body(b'{"b":1e3}')["b"]) is float  # 1e3 is not an integer (§0)
    # Brackets inside strings are not nesting.
    assert parse_json_body(b'{"a":"' + b"[" * 2000 + b'"}') == {"a": "[" * 2000}


# --------------------------------------------------------------------------- acceptance
def capture_openai_bodies(call) -> list[dict]:
    """Run `call(client)` against a mock transport and return the JSON bodies the SDK sent."""
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(parse_json_body(request.content))
        return httpx.Response(400, json={"error": {"message": "captured", "type": "t", "param": None, "code": "c"}})

    client = openai.OpenAI(
        api_key="k", base_url="http://test/v1", max_retries=0,
        # The installed openai types http_client as httpx2.Client yet still takes an httpx.Client
        # (is_legacy_httpx_sync_client); openai before httpx2 types it as httpx.Client.
        http_client=httpx.Client(  # type: ignore[arg-type, unused-ignore]
            transport=httpx.MockTransport(handler)),
    )
    with pytest.raises(openai.BadRequestError):
        call(client)
    return bodies


def test_openai_sdk_chat_body():
    (body,) = capture_openai_bodies(lambda c: c.chat.completions.create(
        model="k3", messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        reasoning_effort="low", tools=[TOOL_F], tool_choice={"type": "function", "function": {"name": "f"}},
        stream=True, stream_options={"include_usage": True}, seed=-1, max_completion_tokens=5, max_tokens=9,
        stop=["x"], temperature=0, top_p=0.5, n=1, logprobs=True, top_logprobs=0, user="u",
        frequency_penalty=0.5, presence_penalty=0.1, extra_body={"top_k": 40},
    ))
    req = parse_chat_request(body)
    assert req.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"})
    assert req.tools == (TOOL_F,)
    assert (req.tool_choice, req.tool_choice_function) == ("required", "f")
    assert (req.temperature, req.top_p, req.top_k, req.seed) == (0.0, 0.5, 40, 2**64 - 1)
    assert (req.max_tokens, req.stop, req.stream, req.include_usage, req.logprobs) == (5, ("x",), True, True, True)
    assert req.thinking == ThinkingChoice(effort="low", param="reasoning_effort")
    assert resolve_thinking(req.thinking, default_on=False) == (True, "low")


def test_openai_sdk_checklist_bodies():
    """docs/HTTP.md §10.2: `reasoning_effort="low"` and `extra_body={"thinking": False}` work (apart)."""
    low, off = capture_openai_bodies(lambda c: (
        _swallow(lambda: c.chat.completions.create(model="k3", messages=[USER], reasoning_effort="low")),
        c.chat.completions.create(model="k3", messages=[USER], extra_body={"thinking": False}),
    ))
    assert resolve_thinking(parse_chat_request(low).thinking, default_on=True) == (True, "low")
    choice = parse_chat_request(off).thinking
    assert choice == ThinkingChoice(switch=False, param="thinking")
    assert choice.explicit and not ThinkingChoice().explicit
    assert resolve_thinking(choice, default_on=True) == (False, None)
    # Together they contradict, and the error names the effort field.
    (both,) = capture_openai_bodies(lambda c: c.chat.completions.create(
        model="k3", messages=[USER], reasoning_effort="low", extra_body={"thinking": False}))
    assert refusal(parse_chat_request, both)[:2] == ("invalid_value", "reasoning_effort")


def _swallow(fn):
    try:
        fn()
    except openai.BadRequestError:
        pass


class Weather(pydantic.BaseModel):
    city: str
    celsius: float


def test_openai_sdk_structured_output_body():
    (body,) = capture_openai_bodies(lambda c: c.chat.completions.parse(
        model="k3", messages=[USER], response_format=Weather))
    req = parse_chat_request(body)
    assert req.response_format["type"] == "json_schema"
    assert req.response_format["json_schema"] == body["response_format"]["json_schema"]
    assert req.response_format["json_schema"]["schema"]["properties"]["city"] == {"title": "City", "type": "string"}


def test_openai_sdk_completion_body():
    (body,) = capture_openai_bodies(lambda c: c.completions.create(
        model="k3", prompt="Once upon", max_tokens=3, logprobs=0, echo=False, best_of=1, n=1, stream=True,
        stream_options={"include_usage": True}, stop="\n", seed=7, suffix=None))
    assert parse_completion_request(body) == CompletionRequest(
        prompt="Once upon", max_tokens=3, logprobs=True, stream=True, include_usage=True, stop=("\n",), seed=7)


DATA_URL = "data:image/png;base64,iVBORw0KGgo="

OPEN_WEBUI_BODY = {
    "stream": True,
    "model": "k3",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": DATA_URL, "detail": "auto"}},
        ]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "And the weather?"},
    ],
    "stream_options": {"include_usage": True},
    "frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1.1, "min_p": 0.05,
    "logit_bias": {"50256": -100}, "user": {"name": "A", "id": "u1", "email": "a@b", "role": "admin"},
    "metadata": {"chat_id": "c1", "message_id": "m1", "session_id": "s", "tool_ids": None, "files": None},
    "store": False, "service_tier": "auto", "parallel_tool_calls": True, "prediction": None,
    "modalities": ["text"], "keep_alive": "5m", "num_ctx": 8192, "options": [1, {"x": None}],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }}],
    "reasoning_effort": "high",
    "temperature": 0.8,
    "max_tokens": 1024,
}


def test_open_webui_body_with_unknown_fields():
    req = parse_chat_request(json.loads(json.dumps(OPEN_WEBUI_BODY)))
    assert req.messages[1] == {"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": DATA_URL}},  # detail dropped
    ]}
    assert req.image_parts == (ImagePart(url=DATA_URL, param="messages[1].content[1].image_url.url",
                                         message_index=1, part_index=1),)
    assert req.image_parts[0].part_param == "messages[1].content[1]"
    assert req.tools == tuple(OPEN_WEBUI_BODY["tools"]) and req.tool_choice is None
    assert (req.stream, req.include_usage, req.temperature, req.max_tokens) == (True, True, 0.8, 1024)
    assert resolve_thinking(req.thinking, default_on=False) == (True, "high")


def test_unknown_fields_of_any_type_are_ignored():
    base = parse_chat_request(chat())
    for value in (None, 1, 1.5, True, "x", [], [1, [2]], {"a": {"b": []}}):
        body = chat(model=value, user=value, metadata=value, zzz=value)
        assert parse_chat_request(body) == base


TOOL_HISTORY = chat(
    messages=[
        {"role": "system", "content": "Use tools.", "name": "sys"},
        {"role": "user", "content": "Weather in Paris and Rome?", "name": "ann"},
        {"role": "assistant", "content": None, "reasoning_content": "Two calls.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            {"function": {"name": "noop"}},
            {"function": {"name": "raw", "arguments": "{not json"}},
            {"function": {"name": "blank", "arguments": "  "}},
        ]},
        {"role": "tool", "tool_call_id": "call_2", "content": "18C", "name": "get_weather", "tool": "ignored"},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21C"}]},
        {"role": "assistant", "content": "Paris 21C, Rome 18C.", "reasoning": "done", "tool_call_id": "x"},
        {"role": "user", "content": "Thanks", "reasoning_content": 5, "tool_calls": "ignored on users"},
    ],
    tools=[TOOL_F],
    tool_choice="auto",
)


def test_tool_history_is_normalised():
    req = parse_chat_request(TOOL_HISTORY)
    assert req.messages == (
        {"role": "system", "content": "Use tools.", "name": "sys"},
        {"role": "user", "content": "Weather in Paris and Rome?", "name": "ann"},
        {"role": "assistant", "content": None, "reasoning_content": "Two calls.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            {"type": "function", "function": {"name": "noop"}},
            {"type": "function", "function": {"name": "raw", "arguments": "{not json"}},
            {"type": "function", "function": {"name": "blank", "arguments": "  "}},
        ]},
        {"role": "tool", "content": "18C", "name": "get_weather", "tool_call_id": "call_2"},
        {"role": "tool", "content": [{"type": "text", "text": "21C"}], "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Paris 21C, Rome 18C.", "reasoning": "done"},
        {"role": "user", "content": "Thanks"},
    )
    assert (req.tool_choice, req.tool_choice_function, req.image_parts) == ("auto", None, ())


ACCEPTED = [
    ("minimal", chat(), {}),
    ("nulls are absent", chat(tools=None, tool_choice=None, response_format=None, temperature=None, top_p=None,
                              top_k=None, seed=None, max_tokens=None, stop=None, n=None, stream=None, logprobs=None,
                              stream_options=None, top_logprobs=None, reasoning_effort=None, reasoning=None,
                              thinking=None, chat_template_kwargs=None, functions=None, function_call=None),
     {"thinking": ThinkingChoice()}),
    ("tools [] is none", chat(tools=[], tool_choice="none"), {"tools": None, "tool_choice": "none"}),
    ("tool_choice required", chat(tool_choice="required"), {"tool_choice": "required"}),
    ("response_format text", chat(response_format={"type": "text"}), {"response_format": None}),
    ("response_format json_object", chat(response_format={"type": "json_object", "json_schema": None}),
     {"response_format": {"type": "json_object"}}),
    ("response_format json_schema bare", chat(response_format={"type": "json_schema"}),
     {"response_format": {"type": "json_schema"}}),
    ("temperature bounds", chat(temperature=2, top_p=1, top_k=2**31 - 1), {"temperature": 2.0, "top_k": 2**31 - 1}),
    ("temperature 0 int", chat(temperature=0, top_p=1e-9), {"temperature": 0.0, "top_p": 1e-9}),
    ("seed bounds low", chat(seed=-(2**63)), {"seed": 2**63}),
    ("seed bounds high", chat(seed=2**64 - 1), {"seed": 2**64 - 1}),
    ("seed zero", chat(seed=0), {"seed": 0}),
    ("max_completion_tokens wins", chat(max_completion_tokens=7, max_tokens=100), {"max_tokens": 7}),
    ("max_tokens alone", chat(max_tokens=10**30), {"max_tokens": 10**30}),
    ("stop string", chat(stop="###"), {"stop": ("###",)}),
    ("stop empty list", chat(stop=[]), {"stop": ()}),
    ("stop four", chat(stop=["a", "b", "c", "d"]), {"stop": ("a", "b", "c", "d")}),
    ("n one", chat(n=1), {}),
    ("include_usage needs stream", chat(stream=False, stream_options={"include_usage": True}), {"include_usage": False}),
    ("stream_options ignored when not streaming", chat(stream_options={"include_usage": "yes"}), {"include_usage": False}),
    ("stream_options any shape when not streaming", chat(stream=False, stream_options=[1]), {"include_usage": False}),
    ("stream_options other keys", chat(stream=True, stream_options={"continuous_usage_stats": 1}),
     {"stream": True, "include_usage": False}),
    ("top_logprobs zero", chat(logprobs=True, top_logprobs=0), {"logprobs": True}),
    ("effort agree", chat(reasoning_effort="max", reasoning={"effort": "max", "summary": "auto"}, thinking_effort="max",
                          thinking=True), {"thinking": ThinkingChoice(switch=True, effort="max", param="reasoning_effort")}),
    ("off efforts agree", chat(reasoning_effort="none", thinking_effort="minimal", reasoning={"effort": "off"},
                               chat_template_kwargs={"enable_thinking": False}),
     {"thinking": ThinkingChoice(switch=False, off=True, param="reasoning_effort")}),
    ("kwargs switch", chat(chat_template_kwargs={"enable_thinking": True, "other": [1]}),
     {"thinking": ThinkingChoice(switch=True, param="chat_template_kwargs.enable_thinking")}),
    ("reasoning without effort", chat(reasoning={"summary": "auto"}), {"thinking": ThinkingChoice()}),
    ("image shapes", chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": "http://x/a.png"},
        {"type": "image", "image": "/tmp/a.png"},
        {"type": "text", "text": ""}]}]),
     {"messages": ({"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
         {"type": "image_url", "image_url": {"url": "/tmp/a.png"}},
         {"type": "text", "text": ""}]},),
      "image_parts": (ImagePart(url="http://x/a.png", param="messages[0].content[0].image_url", message_index=0, part_index=0),
                      ImagePart(url="/tmp/a.png", param="messages[0].content[1].image", message_index=0, part_index=1))}),
    ("empty parts list", msg(role="user", content=[]), {"messages": ({"role": "user", "content": []},)}),
    ("assistant without content", chat(messages=[USER, {"role": "assistant"}]),
     {"messages": (USER, {"role": "assistant", "content": None})}),
    ("developer with parts", msg(role="developer", content=[{"type": "text", "text": "x"}], name="d"),
     {"messages": ({"role": "system", "content": [{"type": "text", "text": "x"}], "name": "d"},)}),
    ("arguments at the nesting limit", assistant_call(function={"name": "f", "arguments": '{"a":' + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1) + "}"}), {}),
    ("arguments surrogate pair", assistant_call(function={"name": "f", "arguments": '{"a": "\\ud83d\\ude00"}'}), {}),
    ("arguments NaN object renders", assistant_call(function={"name": "f", "arguments": '{"a": NaN}'}), {}),
    ("empty tool_calls list", chat(messages=[USER, {"role": "assistant", "content": "", "tool_calls": []}]),
     {"messages": (USER, {"role": "assistant", "content": "", "tool_calls": []})}),
]


@pytest.mark.parametrize(("body", "expected"), [row[1:] for row in ACCEPTED], ids=[row[0] for row in ACCEPTED])
def test_chat_accepted(body, expected):
    req = parse_chat_request(body)
    defaults = ChatRequest(messages=req.messages)
    for name, value in expected.items():
        assert getattr(req, name) == value, name
    for name in attrs_fields_except(ChatRequest, {"messages", *expected}):
        assert getattr(req, name) == getattr(defaults, name), name


def attrs_fields_except(cls, skip):
    import attrs

    return [f.name for f in attrs.fields(cls) if f.name not in skip]


def test_completion_accepted():
    assert parse_completion_request({"prompt": ["Once"], "logprobs": None, "echo": False, "suffix": None,
                                     "best_of": 1, "max_completion_tokens": "ignored here"}) == CompletionRequest(prompt="Once")
    assert parse_completion_request(prompt(seed=-1, top_k=5, temperature=0)).seed == 2**64 - 1
    # stream_options is ignored unless streaming (docs/HTTP.md §2.2), whatever it holds.
    assert parse_completion_request(prompt(stream_options={"include_usage": "yes"})) == CompletionRequest(prompt="Once upon")


# --------------------------------------------------------------------------- thinking resolution
RESOLVE = [
    (ThinkingChoice(), True, (True, "max")),
    (ThinkingChoice(), False, (False, None)),
    (ThinkingChoice(switch=True, param="thinking"), False, (True, "max")),
    (ThinkingChoice(switch=False, param="thinking"), True, (False, None)),
    (ThinkingChoice(effort="low", param="reasoning_effort"), False, (True, "low")),
    (ThinkingChoice(effort="high", switch=True, param="reasoning_effort"), True, (True, "high")),
    (ThinkingChoice(off=True, param="reasoning_effort"), True, (False, None)),
    (ThinkingChoice(off=True, switch=False, param="thinking_effort"), True, (False, None)),
]


@pytest.mark.parametrize(("choice", "default_on", "expected"), RESOLVE)
def test_resolve_thinking(choice, default_on, expected):
    assert resolve_thinking(choice, default_on=default_on) == expected


# --------------------------------------------------------------------------- image sources
IMAGE_KINDS = [
    ("data:image/png;base64,AAAA", "data"),
    ("DATA:image/png;base64,AAAA", "data"),
    ("data:;base64,AAAA", "data"),
    ("http://example.com/a.png", "remote"),
    ("HTTPS://example.com/a.png", "remote"),
    ("hTtP://10.0.0.1/", "remote"),
    ("file:///etc/hosts", "local"),
    ("file://localhost/tmp/a.png", "local"),
    ("FILE://LocalHost/tmp/a.png", "local"),
    ("/tmp/a.png", "local"),
    ("file://server/share/a.png", "invalid"),
    ("file://[::1/a.png", "invalid"),
    ("file:/tmp/a.png", "invalid"),
    ("tmp/a.png", "invalid"),
    ("./a.png", "invalid"),
    ("", "invalid"),
    ("ftp://x/a.png", "invalid"),
    ("http:/x", "invalid"),
    ("iVBORw0KGgo=", "invalid"),
]


@pytest.mark.parametrize(("url", "kind"), IMAGE_KINDS)
def test_image_kind(url, kind):
    assert image_kind(url) == kind


def test_local_image_path():
    assert local_image_path("file:///tmp/a%20b.png") == "/tmp/a b.png"
    assert local_image_path("file://localhost/x.png") == "/x.png"
    assert local_image_path("/srv/%20.png") == "/srv/%20.png"
    with pytest.raises(ValueError):
        local_image_path("http://x/a.png")


# --------------------------------------------------------------------------- properties
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
    | st.sampled_from(["low", "high", "max", "medium", "none", "auto", "required", "function", "text", "json_schema",
                       "user", "assistant", "tool", "image_url", "image", "data:,", "{}", "[1]"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "function", "name", "url", "image_url", "image", "text", "effort", "include_usage",
                         "enable_thinking", "thinking", "arguments", "role", "content", "tool_calls", "json_schema",
                         "parameters", "description", "id"]) | st.text(max_size=4),
        children, max_size=4),
    max_leaves=12,
)
CHAT_FIELDS = ["messages", "tools", "tool_choice", "response_format", "temperature", "top_p", "top_k", "seed",
               "max_completion_tokens", "max_tokens", "stop", "n", "stream", "logprobs", "stream_options",
               "top_logprobs", "reasoning_effort", "reasoning", "thinking_effort", "thinking", "chat_template_kwargs",
               "functions", "function_call"]
COMPLETION_FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
                     "stream_options", "logprobs", "echo", "suffix", "best_of"]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


MESSAGE_KEYS = {
    "system": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "reasoning_content", "reasoning", "tool_calls"},
    "tool": {"role", "content", "name", "tool_call_id"},
}


def only_invalid_request(parse, body):
    """Parse must either refuse with a generic code and a param, or return a well-formed value."""
    before = copy.deepcopy(body)
    try:
        result = parse(body)
    except InvalidRequest as err:
        assert err.code in (MISSING, TYPE, VALUE, UNSUP) and err.param and str(err)
        return
    finally:
        assert body == before  # parsing never mutates the client's body
    if isinstance(result, ChatRequest):
        images = 0
        for message in result.messages:
            assert set(message) <= MESSAGE_KEYS[message["role"]]
            if isinstance(message["content"], list):
                for part in message["content"]:
                    assert part["type"] in ("text", "image_url")
                    images += part["type"] == "image_url"
        assert images == len(result.image_parts)
        assert result.stop == tuple(s for s in result.stop if isinstance(s, str) and s)


@FAST
@given(st.dictionaries(st.sampled_from(CHAT_FIELDS), json_values, max_size=5))
def test_chat_fields_never_raise_other_errors(fields):
    only_invalid_request(parse_chat_request, chat(**fields))


@FAST
@given(st.lists(json_values, min_size=1, max_size=3))
def test_messages_never_raise_other_errors(messages):
    only_invalid_request(parse_chat_request, {"messages": messages})


ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool"])


@FAST
@given(ROLES, st.dictionaries(st.sampled_from(["content", "name", "reasoning_content", "reasoning", "tool_calls",
                                               "tool_call_id"]), json_values, max_size=4))
def test_message_fields_never_raise_other_errors(role, fields):
    only_invalid_request(parse_chat_request, {"messages": [{"role": role, **fields}]})


@FAST
@given(st.dictionaries(st.sampled_from(COMPLETION_FIELDS), json_values, max_size=5))
def test_completion_fields_never_raise_other_errors(fields):
    only_invalid_request(parse_completion_request, prompt(**fields))


@FAST
@given(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_json_body_never_raises_other_errors(raw):
    try:
        value = parse_json_body(raw)
    except InvalidRequest as err:
        assert (err.code, err.param) == ("invalid_json", None) and "JSON" in str(err)
    else:
        assert type(value) is dict and value == json.loads(raw)


def true_depth(value) -> int:
    """The nesting depth by plain recursion: the oracle for the byte scanner."""
    if isinstance(value, dict):
        return 1 + max(map(true_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(true_depth, value), default=0)
    return 0


tricky_text = st.text(alphabet='[]{}"\\\\/ab\n\u00e9\U0001f600', max_size=10)
nestable = st.recursive(
    st.none() | st.integers() | tricky_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(tricky_text, children, max_size=3),
    max_leaves=20,
)


@FAST
@given(nestable, st.booleans(), st.sampled_from([None, 1]))
def test_byte_depth_scan_matches_recursion(value, ascii_only, indent):
    raw = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    assert nesting_depth(raw) == true_depth(value)


@pytest.mark.parametrize("text", ['\\', '\\"', '"[', '\\\\"]', '\\\\'])
def test_byte_depth_scan_escapes(text):
    for value in ([text], {text: [[text]]}, [[{"k": text}], text]):
        assert nesting_depth(json.dumps(value).encode()) == true_depth(value)


# -- sampling controls (docs/HTTP.md §2.2; the engine applies them, docs/ENGINE.md §2) -------


def test_sampling_controls_are_parsed():
    req = parse_chat_request(chat(presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.2,
                                  min_p=0.1, logit_bias={"7": 100, "3": -2.5}))
    assert (req.presence_penalty, req.frequency_penalty, req.repetition_penalty, req.min_p) == (0.5, -1.0, 1.2, 0.1)
    assert req.logit_bias == ((3, -2.5), (7, 100.0))
    assert parse_chat_request(chat()).logit_bias == ()


@pytest.mark.parametrize("field,value,param", [
    ("presence_penalty", 2.5, "presence_penalty"), ("frequency_penalty", "1", "frequency_penalty"),
    ("repetition_penalty", 0, "repetition_penalty"), ("min_p", 1.01, "min_p"),
    ("logit_bias", [1], "logit_bias"), ("logit_bias", {"x": 1}, "logit_bias.x"),
    ("logit_bias", {"-1": 1}, "logit_bias.-1"), ("logit_bias", {"5": 101}, "logit_bias.5"),
    ("logit_bias", {"5": "1"}, "logit_bias.5"),
])
def test_bad_sampling_controls_name_the_field(field, value, param):
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(chat(**{field: value}))
    assert info.value.param == param


def test_logit_bias_ids_are_checked_against_the_vocabulary():
    from waste.domain.requests.fields import check_logit_bias_ids
    check_logit_bias_ids(((0, 1.0), (99, 1.0)), 100)
    with pytest.raises(InvalidRequest) as info:
        check_logit_bias_ids(((0, 1.0), (100, 1.0)), 100)
    assert info.value.param == "logit_bias.100"


def test_top_logprobs_are_parsed():
    assert parse_chat_request(chat(logprobs=True, top_logprobs=20)).top_logprobs == 20
    assert parse_completion_request({"prompt": "x", "logprobs": 5}).top_logprobs == 5
    assert parse_completion_request({"prompt": "x", "logprobs": 0}).logprobs is True


def test_n_is_the_choice_count():
    """`n` from 1 to 8 is kept on both requests; absent is 1."""
    assert parse_chat_request(chat(n=8)).n == 8
    assert parse_chat_request(chat()).n == 1
    assert parse_completion_request(prompt(n=3)).n == 3
