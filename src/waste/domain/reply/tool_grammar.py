"""Tool-call grammars: what a reply may be when tools are declared (docs/DECISIONS.md, tool-call
constraints).

Each tool protocol (XTML's call elements, Kimi K2's JSON arguments, GLM's key/value pairs)
turns the request's tools and ``tool_choice`` into one grammar over the whole reply, in
llguidance's Lark dialect: special tokens by id (``<[163586]>``), JSON values as ``%json``
sub-grammars of the function's ``parameters``. Reasoning and free text are an unconstrained
text lexeme that only a marker ends, so the reasoning stays free. Pure: the grammar is text;
``GrammarCompiler.lark`` compiles it and checks each schema, naming its path.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import attrs

from waste.domain.errors import InvalidRequest

# %json sub-grammars are written compact: flexible whitespace would let a sampler pad forever.
_COMPACT = {"whitespace_flexible": False}
# Keywords that let a string property be written raw (no quotes) and still be enforced.
_RAW_STRING_KEYS = frozenset({"type", "maxLength", "minLength", "enum", "const", "title",
                              "description", "default", "examples"})
# Root keywords an argument-element (key/value) rendering can honour property by property.
_ELEMENT_ROOT_KEYS = frozenset({"type", "properties", "required", "additionalProperties",
                                "title", "description", "$schema", "$id"})


@attrs.frozen(kw_only=True)
class ToolSpec:
    """One callable function: its name, its ``parameters`` schema and that schema's request path."""

    name: str
    parameters: dict[str, Any]
    param: str


@attrs.frozen(kw_only=True)
class ToolGrammar:
    """A reply grammar and the JSON schemas inside it (each with the request path that named it,
    for the compiler's 400s)."""

    lark: str
    schemas: tuple[tuple[Any, str], ...]


def response_schema(response_format: dict[str, Any] | None) -> tuple[Any, str] | None:
    """A response_format's (schema, param): ``json_object`` is any object; None for text.

    Raises:
        InvalidRequest: a ``json_schema`` without its ``schema``.
    """
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return {"type": "object"}, "response_format"
    if kind != "json_schema":
        return None
    assert response_format is not None
    param = "response_format.json_schema.schema"
    schema = (response_format.get("json_schema") or {}).get("schema")
    if schema is None:
        raise InvalidRequest("response_format.json_schema.schema is required for a json_schema "
                             "response.", param, "missing_required_parameter")
    return schema, param


def tool_specs(tools: Sequence[dict[str, Any]], function: str | None) -> tuple[ToolSpec, ...]:
    """The functions a reply may call: all declared ones, or only the named ``function``."""
    specs = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") or {}
        name = fn.get("name")
        if function is not None and name != function:
            continue
        parameters = fn.get("parameters")
        specs.append(ToolSpec(name=str(name), parameters=parameters if parameters is not None else {},
                              param=f"tools[{i}].function.parameters"))
    return tuple(specs)


def call_mode(choice: str | None, function: str | None) -> str:
    """``named`` (exactly one call of one function), ``required`` (one or more calls, no
    text), or ``auto`` (text, calls, or both)."""
    if function is not None:
        return "named"
    return "required" if choice == "required" else "auto"


def special(token: int) -> str:
    return f"<[{token}]>"


def literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def json_value(schema: Any) -> str:
    """A ``%json`` sub-grammar for ``schema`` (written compact)."""
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": _COMPACT}
    elif schema is True:
        schema = {"x-guidance": _COMPACT}
    return "%json" + json.dumps(schema, ensure_ascii=False)


def object_schema(spec: ToolSpec) -> dict[str, Any]:
    """The arguments object a call carries: ``parameters``, an object; none declared means no
    arguments (OpenAI: a function without parameters takes none)."""
    schema = dict(spec.parameters)
    if not schema:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    schema.setdefault("type", "object")
    return schema


def schema_list(specs: Sequence[ToolSpec], answer: tuple[Any, str] | None) -> tuple[tuple[Any, str], ...]:
    """What the compiler must check: every parameters schema, and the answer's schema."""
    found = [(spec.parameters, spec.param) for spec in specs]
    if answer is not None:
        found.append(answer)
    return tuple(found)


# ---- key/value argument elements (XTML and GLM) -------------------------------------------------

@attrs.frozen(kw_only=True)
class Argument:
    """One property written as its own element: raw text (a string) or a JSON value."""

    key: str
    required: bool
    type_name: str | None  # XTML's ``type``: string (raw), number, boolean, null, object, array
    value: str  # the Lark expression of the value


def raw_string(schema: dict[str, Any]) -> str | None:
    """A Lark expression for a string written raw (no quotes, no escapes), or None when the
    schema constrains it in a way raw text cannot carry (a pattern, a format, a union)."""
    if set(schema) - _RAW_STRING_KEYS:
        return None
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None:
        if not values or not all(isinstance(v, str) for v in values):
            return None
        if schema.get("type", "string") != "string":
            return None
        return "(" + " | ".join(literal(v) for v in values) + ")"
    if schema.get("type") != "string":
        return None
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if not isinstance(low, int) or isinstance(low, bool) or low < 0 or (
            high is not None and (not isinstance(high, int) or isinstance(high, bool) or high < low)):
        return None
    if high is None:
        return f"/(?s:.){{{low},}}/" if low else "/(?s:.*)/"
    return f"/(?s:.){{{low},{high}}}/"


_TYPE_NAMES = {"integer": "number", "number": "number", "boolean": "boolean", "null": "null",
               "object": "object", "array": "array", "string": "string"}


def _json_type_name(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, str) and kind in _TYPE_NAMES:
        return _TYPE_NAMES[kind]
    values = schema.get("enum", [schema["const"]] if "const" in schema else None) \
        if isinstance(schema, dict) else None
    if values:
        first = values[0]
        if isinstance(first, bool):
            return "boolean"
        if first is None:
            return "null"
        if isinstance(first, (int, float)):
            return "number"
        if isinstance(first, str):
            return "string"
    return "object"


def element_arguments(schema: dict[str, Any]) -> list[Argument] | None:
    """The properties of an object schema as elements, in declaration order (required ones
    always, optional ones maybe), or None when elements cannot honour the schema (root keywords
    beyond properties/required, ``$ref``s). A string a raw text can carry is raw (type
    ``string``); any other value is JSON, with ``type_name`` None when the value may be a
    string (a pattern, a format, a union): the element then claims no type."""
    if set(schema) - _ELEMENT_ROOT_KEYS or schema.get("type", "object") != "object":
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    if any(key not in properties for key in required) or '"$ref"' in json.dumps(properties):
        return None
    out = []
    for key, sub in properties.items():
        if not isinstance(key, str) or not (isinstance(sub, dict) or sub is True):
            return None
        sub = sub if isinstance(sub, dict) else {}
        raw = raw_string(sub)
        if raw is not None:
            out.append(Argument(key=key, required=key in required, type_name="string", value=raw))
        else:
            name = None if _may_be_string(sub) else _json_type_name(sub)
            out.append(Argument(key=key, required=key in required, type_name=name,
                                value=json_value(sub)))
    return out


def _may_be_string(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    values = schema.get("enum", [schema["const"]] if "const" in schema else [])
    if any(isinstance(v, str) for v in values):
        return True
    if kind is None and not values and not any(k in schema for k in ("anyOf", "oneOf", "allOf")):
        return True  # untyped: any JSON, strings included
    return any(_may_be_string(s) for key in ("anyOf", "oneOf", "allOf") for s in schema.get(key, [])
               if isinstance(s, dict))


def element_sequence(arguments: Sequence[Argument], element: Callable[[Argument], str]) -> str:
    """The elements in order, optional ones marked ``?`` (empty for no arguments)."""
    parts = [element(a) if a.required else f"({element(a)})?" for a in arguments]
    return " ".join(parts) if parts else '""'



def reasoning_prefix(think_ids: tuple[int, int] | None, starts_in_reasoning: bool) -> str:
    """A chat.json reply's free reasoning: the open channel up to its close marker, or a channel
    the model may open itself first; nothing without a channel."""
    if think_ids is None:
        return ""
    opener, closer = (special(i) for i in think_ids)
    if starts_in_reasoning:
        return f"REASONING? {closer}"
    return f"({opener} REASONING? {closer})?"


def reply_rule(mode: str, answer: tuple[Any, str] | None, calls: str, end: str, *,
               gap: str = "") -> str:
    """The Lark ``reply`` rule every tool protocol shares: forced calls, or (``auto``) free
    text or the answer's JSON, then optional calls; ``gap`` is markup that precedes the calls
    whether or not content came first (XTML's response close)."""
    g = f"{gap} " if gap else ""
    if mode != "auto":
        return f"reply: {g}{calls} {end}"
    if answer is None:
        return f"reply: TEXT? {g}({calls})? {end}"
    return f"reply: {json_value(answer[0])} {g}({calls})? {end} | {g}{calls} {end}"


def chat_reply_grammar(*, specs: Sequence[ToolSpec], mode: str, answer: tuple[Any, str] | None,
                       prefix: str, section: tuple[str, str], call: Callable[[ToolSpec, str], str],
                       stop_ids: Sequence[int], first_index: int) -> ToolGrammar:
    """A chat.json reply: free reasoning (``prefix``), content (free text, the answer's JSON, or
    nothing when a call is forced), then the calls between ``section``'s markers, then a stop
    id. ``call(spec, index)`` is one call's Lark expression; ``index`` is the Lark of the
    call's number (from ``first_index``; a literal when only one call is allowed)."""
    stop = "(" + " | ".join(special(i) for i in stop_ids) + ")"
    opener, closer = section
    lines = [f"start: {prefix} reply" if prefix else "start: reply"]
    lines.append(reply_rule(mode, answer, f"{opener} calls {closer}", stop))
    rules = [f"call_{i}" for i in range(len(specs))]
    lines.append("calls: call_0" if mode == "named" else f"calls: ({' | '.join(rules)})+")
    index = literal(str(first_index)) if mode == "named" else "INDEX"
    for i, spec in enumerate(specs):
        lines.append(f"call_{i}: {call(spec, index)}")
    lines += ["TEXT: /(?s:.+)/", "REASONING: /(?s:.+)/", "INDEX: /[0-9]{1,2}/"]
    return ToolGrammar(lark="\n".join(lines) + "\n", schemas=schema_list(specs, answer))
