"""Open-WebUI's real traffic replayed against the served fake (docs/HTTP.md §10.1).

The fixtures under ``fixtures/openwebui/`` are the requests Open-WebUI 0.6–0.12 sends: the model
probe, a UI chat carrying its 28 builtin tool schemas (~20 KB), the native function-calling
follow-up, and the title / tags / follow-up task requests. Bodies go out as aiohttp writes them.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.contract.serving import fake, running, state_of
from tests.contract.sse import join_deltas, read_events
from waste.app import Settings

FIXTURES = Path(__file__).parent / "fixtures" / "openwebui"
# The GLM example without its "tools": "glm" key: a chat.json container with no tool protocol.
GLM = {key: value for key, value in json.loads(
    (Path(__file__).parents[2] / "examples" / "chat-glm.json").read_text("utf-8")).items() if key != "tools"}
KEY = "sk-owui-test"
CTX = 65536  # the builtin tools alone are ~20k fake tokens: --ctx well above 4096 (§10.1)
TITLE = '{ "title": "🌦️ Lisbon Weather Today" }'
TAGS = '{ "tags": ["Weather", "Travel", "Lisbon"] }'
FOLLOW_UPS = ('{ "follow_ups": ["What about tomorrow?", "Will it be windy?", '
              '"What should I wear?"] }')
ANSWER = "It's 19 °C with showers after 18:00: take an umbrella."
SCRIPT = {"replies": [
    {"when": "Generate a concise, 3-5 word title", "content": TITLE},
    {"when": "Generate 1-3 broad tags", "content": TAGS},
    {"when": "Suggest 3-5 relevant follow-up questions", "content": FOLLOW_UPS},
    {"when": "Lisbon forecast: 19", "reasoning": "The search says showers later.",
     "content": ANSWER},
    {"when": "weather like in Lisbon", "reasoning": "I should search.", "content": "",
     "tool_calls": [
         {"name": "search_web", "arguments": {"query": "Lisbon weather today", "count": 3}},
         {"name": "get_current_timestamp", "arguments": {}}]},
]}


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text("utf-8"))


def send(client: httpx.Client, fixture: dict, body: dict | None = None) -> httpx.Response:
    """Replay one fixture as aiohttp sends it (json.dumps defaults), reading the whole reply."""
    body = fixture.get("body") if body is None else body
    content = None if body is None else json.dumps(body).encode()
    request = client.build_request(fixture["method"], fixture["path"],
                                   headers=fixture["headers"], content=content)
    response = client.send(request, stream=True)
    response.read()
    return response


def events_of(response: httpx.Response) -> list:
    return read_events(httpx.Response(200, content=response.content))


def contains(haystack: list[int], needle: list[int]) -> int:
    """The index of ``needle`` in ``haystack``, or -1."""
    n = len(needle)
    return next((i for i in range(len(haystack) - n + 1) if haystack[i:i + n] == needle), -1)


@pytest.fixture(scope="module")
def served():
    engine = fake(SCRIPT, ctx_tokens=CTX)
    with running(engine, Settings(fake_engine="builtin", api_key=KEY, ctx=CTX)) as (base, app):
        yield base, app


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[0], timeout=30) as c:
        yield c


@pytest.fixture
def engine(served):
    return state_of(served[1]).service.engine


# -- model list ------------------------------------------------------------------------------

def test_model_probe(client):
    r = send(client, load("models_probe.json"))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["fake"]
    assert body["data"][0]["object"] == "model"


def test_model_probe_with_a_wrong_key_fails_at_setup(client):
    probe = load("models_probe.json")
    probe["headers"]["Authorization"] = "Bearer sk-stale"
    r = send(client, probe)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


# -- the UI chat -------------------------------------------------------------------------------

def test_fixture_is_what_open_webui_sends():
    body = load("chat_stream.json")["body"]
    assert len(body["tools"]) == 28
    assert 18_000 < len(json.dumps(body["tools"])) < 24_000
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert {"user", "metadata", "frequency_penalty"} <= set(body)


def test_ui_chat_stream_with_builtin_tools(client, engine):
    fixture = load("chat_stream.json")
    r = send(client, fixture)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = events_of(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [i for i, c in enumerate(chunks) if not c["choices"]] == [len(chunks) - 1]
    usage = chunks[-1]["usage"]
    prompt = engine.record.prompts[-1]
    assert usage["prompt_tokens"] == len(prompt) > 15_000  # the tool schemas are in the prompt
    joined = join_deltas(events)
    assert joined["reasoning"] == "I should search." and joined["content"] == ""
    assert joined["finish_reason"] == "tool_calls"
    calls = joined["calls"]
    assert [c["name"] for c in calls] == ["search_web", "get_current_timestamp"]
    assert json.loads(calls[0]["arguments"]) == {"query": "Lisbon weather today", "count": 3}
    assert json.loads(calls[1]["arguments"]) == {}
    assert all(c["id"].startswith("call_") for c in calls)
    # every tool is declared to the model, deep-sorted and compact (docs/XTML.md §3.4, §3.9)
    declared = json.dumps(fixture["body"]["tools"], sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False)
    opener = '<|open|>message role="system" type="tool-declare"<|sep|>'
    declaration = (engine.tokenize_markup(opener)
                   + engine.tokenize("# Tools\nHere are the available tools, described in "
                                     "JSONSchema.\n\n```json\n" + declared + "\n```")
                   + engine.tokenize_markup("<|close|>message<|sep|><|end_of_msg|>"))
    assert contains(prompt, declaration) >= 0


def test_ui_chat_at_the_default_context_is_a_clear_400():
    fixture = load("chat_stream.json")
    with running(fake(SCRIPT), Settings(fake_engine="builtin", api_key=KEY)) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as c:
        r = send(c, fixture)
    assert r.status_code == 400  # a JSON refusal, not an SSE stream
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", "messages")
    assert "4096" in err["message"]


def test_native_tool_call_follow_up(client, engine):
    fixture = load("chat_tool_results.json")
    r = send(client, fixture)
    assert r.status_code == 200, r.text
    joined = join_deltas(events_of(r))
    assert joined["content"] == ANSWER and joined["finish_reason"] == "stop"
    assert joined["reasoning"] == "The search says showers later."
    prompt = engine.record.prompts[-1]
    markup = engine.tokenize_markup
    # the assistant turn's calls, numbered from 1 in call order
    first_call = contains(prompt, markup('<|open|>call tool="search_web" index="1"<|sep|>'))
    second_call = contains(
        prompt, markup('<|open|>call tool="get_current_timestamp" index="2"<|sep|>'))
    assert 0 <= first_call < second_call
    # results carry only tool_call_id: names resolved and re-sorted into call order (docs/XTML.md §3.7)
    messages = fixture["body"]["messages"]

    def tool_message(name: str, index: int, content: str) -> list[int]:
        return (markup(f'<|open|>message role="tool" tool="{name}" index="{index}"<|sep|>')
                + engine.tokenize(content) + markup("<|close|>message<|sep|><|end_of_msg|>"))

    weather_result = contains(prompt, tool_message("search_web", 1, messages[4]["content"]))
    clock_result = contains(prompt,
                            tool_message("get_current_timestamp", 2, messages[3]["content"]))
    assert second_call < weather_result < clock_result


def test_blocking_replay_of_the_follow_up(client):
    fixture = load("chat_tool_results.json")
    body = {**fixture["body"], "stream": False}
    r = send(client, fixture, body)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] == ANSWER and "tool_calls" not in message


# -- task requests -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,key,expected", [
    ("task_title.json", "title", TITLE),
    ("task_tags.json", "tags", TAGS),
    ("task_follow_ups.json", "follow_ups", FOLLOW_UPS),
])
def test_task_requests(client, engine, name, key, expected):
    fixture = load(name)
    assert fixture["body"]["stream"] is False
    assert "<chat_history>" in fixture["body"]["messages"][0]["content"]
    r = send(client, fixture)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == expected
    assert key in json.loads(choice["message"]["content"])
    assert body["usage"]["prompt_tokens"] == len(engine.record.prompts[-1])


def test_title_sent_with_the_first_message_both_answer(client):
    # Open-WebUI 0.12 sends the title request at the same moment as a new chat's first message;
    # the one-at-a-time engine (which fails a concurrent call) must see them one after another.
    fixtures = [load("chat_stream.json"), load("task_title.json"), load("task_tags.json"),
                load("task_follow_ups.json")]
    with ThreadPoolExecutor(len(fixtures)) as pool:
        responses = list(pool.map(lambda f: send(client, f), fixtures))
    assert [r.status_code for r in responses] == [200] * 4
    assert events_of(responses[0])[-1] == "[DONE]"
    assert responses[1].json()["choices"][0]["message"]["content"] == TITLE


# -- a chat.json container without tools (GLM) -------------------------------------------------

@pytest.fixture(scope="module")
def glm():
    engine = fake({"format": "chat.json", "chat_json": GLM}, ctx_tokens=CTX)
    with running(engine, Settings(fake_engine="builtin", ctx=CTX)) as (base, app):
        yield base, app


def test_glm_refuses_the_ui_chat_naming_tools(glm):
    record = state_of(glm[1]).service.engine.record
    before = len(record.prompts)
    with httpx.Client(base_url=glm[0], timeout=30) as c:
        r = send(c, load("chat_stream.json"))
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_by_format", "tools")
    assert "tool definitions" in err["message"]
    assert len(record.prompts) == before  # refused before the engine


def test_glm_answers_with_tools_turned_off(glm):
    fixture = load("chat_stream.json")
    body = {k: v for k, v in fixture["body"].items() if k != "tools"}
    with httpx.Client(base_url=glm[0], timeout=30) as c:
        r = send(c, fixture, body)
        assert r.status_code == 200, r.text
        joined = join_deltas(events_of(r))
        assert joined["content"].startswith("Echo: What's the weather like in Lisbon today?")
        assert joined["finish_reason"] == "stop"
        # the model probe carries a bearer token although this server has no key: accepted
        assert send(c, load("models_probe.json")).status_code == 200


@pytest.mark.parametrize("name", ["task_title.json", "task_tags.json", "task_follow_ups.json"])
def test_glm_answers_the_task_requests(glm, name):
    with httpx.Client(base_url=glm[0], timeout=30) as c:
        r = send(c, load(name))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("Echo: ### Task:")
