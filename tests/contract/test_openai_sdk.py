"""The official ``openai`` Python client against the served fake: docs/HTTP.md §10.2, item by item.

Every assertion goes through the SDK's own parsing (pydantic models, the SSE decoder, the
exception mapping), so a wire shape the SDK cannot read fails here even when raw JSON looks right.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.contract.serving import fake, running, state_of
from waste.app import Settings

KEY = "sdk-key"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "clock", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
SCRIPT = {"replies": [
    {"when": "weather", "reasoning": "Need the weather.", "content": "",
     "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
                    {"name": "clock", "arguments": {"tz": "Europe/Paris"}}]},
    {"when": "explode-midway", "error": "io", "after_tokens": 3},
    {"when": "explode-now", "error": "nomem"},
]}
EFFORT_MESSAGE = "Now the system is invoked with `thinking_effort="


@pytest.fixture(scope="module")
def served():
    with running(fake(SCRIPT), Settings(fake_engine="builtin", api_key=KEY)) as (base, app):
        yield base, app


@pytest.fixture
def client(served):
    with openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0, timeout=10) as c:
        yield c


@pytest.fixture
def record(served):
    return state_of(served[1]).service.engine.record


@pytest.fixture
def engine(served):
    return state_of(served[1]).service.engine


def say(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def prompt_text(engine, ids: list[int]) -> str:
    """The fake's prompt read back: code points as text, specials as their marker text."""
    return "".join(engine.vocab.token_text(i) for i in ids)


def ends_with_markup(engine, ids: list[int], channel: str) -> bool:
    """Whether the prompt ends in the generation prompt ⟦o⟧channel⟦s⟧ with real special ids."""
    tail = [engine.special_id("<|open|>"), *map(ord, channel), engine.special_id("<|sep|>")]
    return ids[-len(tail):] == tail


# -- models --------------------------------------------------------------------------------

def test_models_list_and_retrieve(client):
    page = client.models.list()
    models = list(page)
    assert [m.id for m in models] == ["fake"]
    model = models[0]
    assert model.object == "model" and model.owned_by == "waste" and isinstance(model.created, int)
    assert model.model_extra["waste"]["arch"] == "fake"
    one = client.models.retrieve("fake")
    assert one.id == "fake" and one.created == model.created


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    err = caught.value
    assert err.status_code == 404
    assert (err.code, err.param, err.type) == ("model_not_found", "model", "not_found_error")


# -- blocking chat --------------------------------------------------------------------------

def test_chat_create_parses_with_extras(client):
    completion = client.chat.completions.create(model="anything", messages=say("hello"))
    assert completion.object == "chat.completion" and completion.model == "fake"
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == "Echo: hello"
    # unknown keys are kept by the SDK: readable as attributes and through model_extra
    assert choice.message.reasoning_content == "Thinking."
    assert choice.message.model_extra["reasoning_content"] == "Thinking."
    assert completion.waste["tokens_generated"] == completion.usage.completion_tokens
    assert completion.model_extra["waste"]["seed"] == completion.waste["seed"]
    assert completion.usage.completion_tokens_details.reasoning_tokens == len("Thinking.")
    assert completion.usage.prompt_tokens_details.cached_tokens == 0


def test_request_id_is_the_completion_id(client):
    completion = client.chat.completions.create(model="fake", messages=say("id please"))
    assert completion._request_id == completion.id
    assert completion.id.startswith("chatcmpl-")
    raw = client.chat.completions.with_raw_response.create(model="fake", messages=say("x"))
    assert raw.headers["x-request-id"] == raw.parse().id


def test_reasoning_effort_low(client, engine, record):
    completion = client.chat.completions.create(model="fake", messages=say("effort"),
                                                reasoning_effort="low")
    text = prompt_text(engine, record.prompts[-1])
    assert EFFORT_MESSAGE + "low`." in text
    assert ends_with_markup(engine, record.prompts[-1], "think")
    assert completion.choices[0].message.reasoning_content == "Thinking."


def test_default_effort_is_max(client, engine, record):
    client.chat.completions.create(model="fake", messages=say("default effort"))
    assert EFFORT_MESSAGE + "max`." in prompt_text(engine, record.prompts[-1])


def test_thinking_false_via_extra_body(client, engine, record):
    completion = client.chat.completions.create(model="fake", messages=say("no thoughts"),
                                                extra_body={"thinking": False})
    ids = record.prompts[-1]
    assert EFFORT_MESSAGE not in prompt_text(engine, ids)
    assert ends_with_markup(engine, ids, "response")
    message = completion.choices[0].message
    assert message.content == "Echo: no thoughts"
    assert getattr(message, "reasoning_content", None) is None
    assert "reasoning_content" not in (message.model_extra or {})


def test_medium_effort_is_bad_request(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="fake", messages=say("x"), reasoning_effort="medium")
    err = caught.value
    assert (err.code, err.param, err.type) == ("unsupported_value", "reasoning_effort",
                                               "invalid_request_error")
    assert "medium" in err.message


# -- streaming ------------------------------------------------------------------------------

def test_naive_stream_loop(client):
    content, reasoning, finishes, chunks = [], [], [], 0
    stream = client.chat.completions.create(model="fake", messages=say("stream me"), stream=True)
    for chunk in stream:
        chunks += 1
        choice = chunk.choices[0]  # the naive loop: every chunk has a choice
        assert chunk.object == "chat.completion.chunk"
        content.append(choice.delta.content or "")
        reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
        finishes.append(choice.finish_reason)
        assert chunk.usage is None
    assert "".join(content) == "Echo: stream me"
    assert "".join(reasoning) == "Thinking."
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunk.waste["tokens_generated"] > 0  # the final chunk carries waste
    assert stream.response.headers["x-request-id"] == chunk.id
    assert chunks > 3


def test_include_usage_is_one_last_chunk_without_choices(client):
    chunks = list(client.chat.completions.create(
        model="fake", messages=say("usage"), stream=True,
        stream_options={"include_usage": True}))
    empty = [i for i, c in enumerate(chunks) if not c.choices]
    assert empty == [len(chunks) - 1]
    last = chunks[-1]
    assert last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_stream_helper_accumulates_tool_calls(client):
    blocking = client.chat.completions.create(model="fake", messages=say("weather in Paris"),
                                              tools=TOOLS)
    with client.chat.completions.stream(model="fake", messages=say("weather in Paris"),
                                        tools=TOOLS) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    expected, got = blocking.choices[0], final.choices[0]
    assert got.finish_reason == expected.finish_reason == "tool_calls"
    assert got.message.reasoning_content == expected.message.reasoning_content
    want = [(c.type, c.function.name, c.function.arguments) for c in expected.message.tool_calls]
    have = [(c.type, c.function.name, c.function.arguments) for c in got.message.tool_calls]
    assert have == want and len(want) == 2
    assert json.loads(want[0][2]) == {"city": "Paris", "days": 3}
    assert all(c.id.startswith("call_") for c in got.message.tool_calls)
    assert final.model == blocking.model and final.object == "chat.completion"


def test_stream_helper_final_content_equals_blocking_for_tool_calls(client):
    # §10.2: get_final_completion() equals the blocking result apart from ids. One exception
    # is forced by the spec itself: §4.1 sends {"role":"assistant","content":""} at admission,
    # before anyone knows whether calls follow, and the SDK's accumulator keeps that "", while
    # the blocking content of a calls-only reply is null (§3.1). docs/DECISIONS.md records it.
    blocking = client.chat.completions.create(model="fake", messages=say("weather in Paris"),
                                              tools=TOOLS)
    with client.chat.completions.stream(model="fake", messages=say("weather in Paris"),
                                        tools=TOOLS) as stream:
        final = stream.get_final_completion()
    assert blocking.choices[0].message.content is None
    assert final.choices[0].message.content == ""
    got, want = final.choices[0], blocking.choices[0]
    assert got.finish_reason == want.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in want.message.tool_calls]


def test_stream_helper_final_equals_blocking_for_text(client):
    blocking = client.chat.completions.create(model="fake", messages=say("plain text"))
    with client.chat.completions.stream(model="fake", messages=say("plain text")) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == blocking.choices[0].message.content == "Echo: plain text"
    got, want = final.choices[0], blocking.choices[0]
    assert (got.message.content, got.finish_reason) == (want.message.content, want.finish_reason)
    assert got.message.reasoning_content == want.message.reasoning_content == "Thinking."
    assert final.usage is None  # include_usage was not asked for


def test_stream_helper_with_include_usage(client):
    blocking = client.chat.completions.create(model="fake", messages=say("count me"))
    with client.chat.completions.stream(model="fake", messages=say("count me"),
                                        stream_options={"include_usage": True}) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "Echo: count me"
    assert final.usage.completion_tokens == blocking.usage.completion_tokens
    assert final.usage.prompt_tokens == blocking.usage.prompt_tokens


def test_logprobs_parse(client):
    completion = client.chat.completions.create(model="fake", messages=say("lp"), logprobs=True)
    entries = completion.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == completion.choices[0].message.content
    assert all(e.logprob == -0.5 and e.bytes == list(e.token.encode()) and e.top_logprobs == []
               for e in entries)
    streamed = []
    for chunk in client.chat.completions.create(model="fake", messages=say("lp"), logprobs=True,
                                                stream=True):
        if chunk.choices[0].logprobs is not None:
            streamed += [e.token for e in chunk.choices[0].logprobs.content]
    assert "".join(streamed) == completion.choices[0].message.content


def test_mid_stream_error_raises_api_error(client, record):
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client.chat.completions.create(model="fake", messages=say("explode-midway"),
                                                    stream=True):
            received.append(chunk)
    err = caught.value
    assert not isinstance(err, openai.APIStatusError)  # headers were 200; the event failed
    assert err.code == "engine_error" and err.type == "engine_error"
    assert received and received[0].choices[0].delta.role == "assistant"
    assert record.stop_reasons[-1] == "error"
    # the engine was reset: the next request works
    after = client.chat.completions.create(model="fake", messages=say("after the error"))
    assert after.choices[0].message.content == "Echo: after the error"


# -- errors -------------------------------------------------------------------------------

def test_bad_request_error_carries_the_envelope(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="fake", messages=say("x"), temperature=5)
    err = caught.value
    assert err.status_code == 400
    assert (err.code, err.param, err.type) == ("invalid_value", "temperature",
                                               "invalid_request_error")
    assert err.request_id.startswith("req-")
    with pytest.raises(openai.BadRequestError) as streamed:  # refused before any SSE byte
        client.chat.completions.create(model="fake", messages=say("x"), temperature=5,
                                       stream=True)
    assert streamed.value.param == "temperature"


def test_bad_message_param_path(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="fake", messages=[
            {"role": "user", "content": "x"}, {"role": "wizard", "content": "y"}])
    assert caught.value.param == "messages[1].role"


def test_wrong_key_is_authentication_error(served):
    with openai.OpenAI(base_url=served[0] + "/v1", api_key="zz-bogus-42", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as caught:
            c.models.list()
    err = caught.value
    assert err.status_code == 401
    assert (err.code, err.type) == ("invalid_api_key", "authentication_error")
    assert KEY not in err.message and "zz-bogus-42" not in err.message


def test_unknown_route_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.get("/no/such/route", cast_to=object)
    assert caught.value.code == "unknown_route"


def test_wrong_method_is_api_status_error(client):
    with pytest.raises(openai.APIStatusError) as caught:
        client.get("/chat/completions", cast_to=object)
    err = caught.value
    assert err.status_code == 405 and err.code == "method_not_allowed"


def test_engine_failure_is_internal_server_error(client, record):
    before = len(record.prompts)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="fake", messages=say("explode-now"))
    err = caught.value
    assert err.status_code == 500
    assert (err.code, err.type, err.param) == ("engine_error", "engine_error", None)
    assert len(record.prompts) == before + 1  # max_retries=0: exactly one attempt
    after = client.chat.completions.create(model="fake", messages=say("recovered"))
    assert after.choices[0].message.content == "Echo: recovered"


def test_default_retries_on_5xx_are_harmless(served, record):
    before = len(record.prompts)
    with openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=1, timeout=10) as c:
        with pytest.raises(openai.InternalServerError):
            c.chat.completions.create(model="fake", messages=say("explode-now"))
        assert len(record.prompts) == before + 2  # the retry queued again and failed again
        ok = c.chat.completions.create(model="fake", messages=say("fine again"))
    assert ok.choices[0].message.content == "Echo: fine again"


# -- completions -----------------------------------------------------------------------------

def test_completions_blocking(client):
    completion = client.completions.create(model="fake", prompt="abc")
    assert completion.object == "text_completion" and completion.model == "fake"
    choice = completion.choices[0]
    assert choice.text == "Echo: abc" and choice.finish_reason == "stop"
    assert completion.usage.prompt_tokens == 3
    assert completion.usage.completion_tokens == len("Echo: abc") + 1  # plus the EOS
    assert completion._request_id == completion.id and completion.id.startswith("cmpl-")
    assert completion.waste["tokens_generated"] == completion.usage.completion_tokens


def test_completions_streaming(client):
    chunks = list(client.completions.create(model="fake", prompt="abc", stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 3
    texts = [c.choices[0].text for c in chunks[:-1]]
    assert "".join(texts) == "Echo: abc"
    finishes = [c.choices[0].finish_reason for c in chunks[:-1]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("cmpl-")


def test_completions_max_tokens(client):
    completion = client.completions.create(model="fake", prompt="abcdef", max_tokens=4)
    assert completion.choices[0].text == "Echo" and completion.choices[0].finish_reason == "length"
