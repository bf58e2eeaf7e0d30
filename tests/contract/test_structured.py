"""Constrained answers through HTTP on a random-weight container: every ``json_schema`` in the
table below comes back as JSON that ``jsonschema`` (the independent oracle) validates, blocking
and streaming, with thinking off (the answer starts at once) on the XTML format and on a chat.json one; unsupported
schema features are 400s naming their path (docs/DECISIONS.md, constrained answers)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.contract.serving import running
from tests.contract.sse import join_deltas, stream
from waste.app import Settings, engine_opener

pytestmark = pytest.mark.native

S = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": S}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -5, "maximum": 5}}, "required": ["x"],
     "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
     "required": ["code"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}}, "required": ["tags"],
     "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"a": S, "b": {"type": "integer", "minimum": 1, "maximum": 3}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"const": {"const": "fixed"}}, "required": ["const"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                     {"type": "null"}]}}, "required": ["v"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 50}, "label": S},
        "required": ["id", "label"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"level": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4}},
     "required": ["level"], "additionalProperties": False},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
     "required": ["email"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["ok", "error", 3, None]}}, "required": ["status"],
     "additionalProperties": False},
    {"type": "object", "properties": {"meta": {"type": "object", "properties": {"k": S, "deep": {
        "type": "object", "properties": {"z": {"type": "boolean"}}, "required": ["z"], "additionalProperties": False}},
        "required": ["deep"], "additionalProperties": False}}, "required": ["meta"], "additionalProperties": False},
    {"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [S, {"type": "integer", "minimum": 0,
                                                                                   "maximum": 9}],
                                               "items": False}}, "required": ["pair"], "additionalProperties": False},
    {"type": "object", "properties": {"short": {"type": "string", "minLength": 2, "maxLength": 4}},
     "required": ["short"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 20}, "opt": S,
                                      "flag": {"type": "boolean"}}, "required": ["n", "flag"], "additionalProperties": False},
    {"$defs": {"leaf": {"type": "object", "properties": {"w": {"type": "integer", "minimum": 0, "maximum": 5}},
                        "required": ["w"], "additionalProperties": False}},
     "type": "object", "properties": {"left": {"$ref": "#/$defs/leaf"}, "right": {"$ref": "#/$defs/leaf"}},
     "required": ["left", "right"], "additionalProperties": False},
    {"type": "object", "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["ratio"], "additionalProperties": False},
]


@pytest.fixture(scope="module", params=["xtml", "chat.json"])
def base(request, native):
    container = request.getfixturevalue("native_container" if request.param == "xtml" else "kimi_linear_container")
    settings = Settings(model=str(container), ctx=2048, usage="", max_tokens=400)
    with running(engine_opener(settings), settings) as (url, app):
        assert httpx.get(url + "/health", timeout=30).json()["chat_format"] == request.param
        yield url


def _body(schema, seed, **extra):
    return {"messages": [{"role": "user", "content": "Answer in JSON."}], "temperature": 1.0, "seed": seed,
            "max_tokens": 400, "thinking": False,
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}},
            **extra}


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_every_schema_is_answered_with_valid_json(base, index):
    schema = SCHEMAS[index]
    with httpx.Client(base_url=base, timeout=300) as client:
        reply = client.post("/v1/chat/completions", json=_body(schema, index))
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        # streaming: the deltas concatenate to a valid answer too
        _, events = stream(client, "/v1/chat/completions", _body(schema, index + 100, stream=True))
        jsonschema.validate(json.loads(join_deltas(events)["content"]), schema)


def test_json_object_is_an_object(base):
    with httpx.Client(base_url=base, timeout=300) as client:
        body = _body(None, 5)
        body["response_format"] = {"type": "json_object"}
        reply = client.post("/v1/chat/completions", json=body).json()
        choice = reply["choices"][0]
        # an unbounded object may run to max_tokens: then it is cut (length), else it parses
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["message"]["content"]), dict)
        else:
            assert choice["message"]["content"].startswith("{")


@pytest.mark.parametrize("schema,param", [
    ({"type": "array", "uniqueItems": True}, "response_format.json_schema.schema.uniqueItems"),
    ({"type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)b"}}},
     "response_format.json_schema.schema.properties.x.pattern"),
    ({"type": "object", "properties": {"x": {"not": {"type": "string"}}}},
     "response_format.json_schema.schema.properties.x.not"),
])
def test_unsupported_schema_features_are_400s_naming_the_path(base, schema, param):
    reply = httpx.post(base + "/v1/chat/completions", json=_body(schema, 1), timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
