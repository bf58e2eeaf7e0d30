"""GLM's tool protocol: declaring tools, replaying calls and results, reading calls back.

Chosen by a chat.json's ``"tools": "glm"`` (docs/CHATJSON.md, "GLM tool markup"). A call is
``<tool_call>NAME`` then ``<arg_key>K</arg_key><arg_value>V</arg_value>`` pairs then
``</tool_call>``; a string value is written raw, any other as JSON, and which one a value is
comes from the function's schema (docs/DECISIONS.md). Results follow ``<|observation|>``, each
in ``<tool_response>``. Template text goes out as markup segments, caller data as plain ones.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Mapping, Sequence

import attrs

from waste.domain.errors import ChatFormatError, InvalidRequest
from waste.domain.reply.events import ToolCall
from waste.domain.reply.tool_grammar import (Argument, ToolGrammar, ToolSpec, chat_reply_grammar,
                                             element_arguments, element_sequence, literal,
                                             object_schema, special)
from waste.domain.segments import Segment, markup, plain

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
OBSERVATION = "<|observation|>"
TOOL_MARKERS = (CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE,
                RESPONSE_OPEN, RESPONSE_CLOSE, OBSERVATION)

# Our wording of GLM's tool declaration (its layout: the tools one JSON object a line inside
# <tools></tools>, then the call syntax with the real markers).
_DECLARE_HEAD = ("# Tools\n\nYou may call the functions below to help with the user's request. "
                 "Their signatures, one JSON object per line, are inside <tools></tools>:\n<tools>\n")
_DECLARE_TAIL = ("\n</tools>\n\nTo call a function, write its name and arguments in this form:\n"
                 f"{CALL_OPEN}{{function-name}}{KEY_OPEN}{{argument-key}}{KEY_CLOSE}"
                 f"{VALUE_OPEN}{{argument-value}}{VALUE_CLOSE}...{CALL_CLOSE}")


@attrs.frozen
class GlmMarkerIds:
    """The nine GLM tool markers' token ids, in ``TOOL_MARKERS`` order."""

    call_open: int
    call_close: int
    key_open: int
    key_close: int
    value_open: int
    value_close: int
    response_open: int
    response_close: int
    observation: int

    def all(self) -> frozenset[int]:
        return frozenset(attrs.astuple(self))


def render_declaration(system: tuple[str, str], tools: Sequence[dict[str, Any]]) -> list[Segment]:
    """A system turn declaring ``tools``: each tool as JSON on its own line (caller data)."""
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return [*markup(system[0] + _DECLARE_HEAD), *plain(lines), *markup(_DECLARE_TAIL + system[1])]


def argument_text(value: Any) -> str:
    """A value as GLM writes it: a string raw, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render_calls(calls: Sequence[dict[str, Any]], *, param: str) -> list[Segment]:
    """An assistant turn's calls, after its content.

    Raises:
        ChatFormatError: arguments that are not a JSON object (GLM has no raw form), naming
            ``{param}.tool_calls[i].function.arguments``.
    """
    segments: list[Segment] = []
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        where = f"{param}.tool_calls[{index}].function.arguments"
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise ChatFormatError("GLM tool call arguments must be a JSON object; this "
                                      "string is not JSON.", where) from None
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ChatFormatError("GLM tool call arguments must be a JSON object.", where)
        segments += [*markup(CALL_OPEN), *plain(str(function.get("name", "")))]
        for key, value in arguments.items():
            segments += [*markup(KEY_OPEN), *plain(str(key)), *markup(KEY_CLOSE + VALUE_OPEN),
                         *plain(argument_text(value)), *markup(VALUE_CLOSE)]
        segments += markup(CALL_CLOSE)
    return segments


def render_result(content: str, *, first: bool) -> list[Segment]:
    """A tool message: ``<|observation|>`` once for a run of results, then the result."""
    head = OBSERVATION + RESPONSE_OPEN if first else RESPONSE_OPEN
    return [*markup(head), *plain(content), *markup(RESPONSE_CLOSE)]


# ---- the reply ------------------------------------------------------------------------------

def is_string_schema(schema: Any) -> bool:
    """Whether a property's value is written raw: its schema says it is a string (``type``
    string, or only string ``enum``/``const`` values)."""
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "string":
        return True
    values = schema.get("enum", [schema["const"]] if "const" in schema else [])
    return "type" not in schema and bool(values) and all(isinstance(v, str) for v in values)


def _decode(text: str, schema: Any) -> Any:
    if is_string_schema(schema):
        return text
    try:
        value = json.loads(text, parse_constant=_reject_constant)
        json.dumps([value], ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):
        return text  # not JSON: kept as the text the model wrote
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@attrs.define
class GlmCallReader:
    """Reads GLM calls from marker ids and decoded text (the host's ``calls`` reader, like
    ``k2tools.CallSectionReader``). ``schemas`` maps a function name to its ``parameters``,
    which decide whether a value is a raw string or JSON. An unfinished call is dropped; a
    call without a name too. Never raises."""

    markers: GlmMarkerIds
    schemas: Mapping[str, Any] = attrs.field(factory=dict)
    _field: str | None = attrs.field(default=None, init=False)  # name/between/key/value
    _name: list[str] = attrs.field(factory=list, init=False)
    _key: list[str] = attrs.field(factory=list, init=False)
    _value: list[str] = attrs.field(factory=list, init=False)
    _pairs: list[tuple[str, str]] = attrs.field(factory=list, init=False)

    @property
    def active(self) -> bool:
        return self._field is not None

    def is_marker(self, token_id: int) -> bool:
        m = self.markers
        return token_id in m.all() and token_id != m.observation  # observation ends the turn

    def feed_text(self, text: str) -> None:
        if self._field == "name":
            self._name.append(text)
        elif self._field == "key":
            self._key.append(text)
        elif self._field == "value":
            self._value.append(text)

    def feed_marker(self, token_id: int) -> list[ToolCall | str]:
        m = self.markers
        if token_id == m.call_open:
            self._drop_call()
            self._field = "name"
        elif self._field is None:
            return []
        elif token_id == m.key_open:
            self._key.clear()
            self._field = "key"
        elif token_id == m.key_close and self._field == "key":
            self._field = "between"
        elif token_id == m.value_open and self._field == "between":
            self._value.clear()
            self._field = "value"
        elif token_id == m.value_close and self._field == "value":
            self._pairs.append(("".join(self._key).strip(), "".join(self._value)))
            self._field = "between"
        elif token_id == m.call_close:
            call = self._complete()
            self._drop_call()
            return [call] if call is not None else []
        return []

    def finish(self) -> None:
        self._drop_call()

    def _complete(self) -> ToolCall | None:
        name = "".join(self._name).strip()
        if not name:
            return None
        properties = (self.schemas.get(name) or {}).get("properties") or {}
        arguments = {key: _decode(text, properties.get(key)) for key, text in self._pairs}
        return ToolCall(id="call_" + secrets.token_hex(12), name=name,
                        arguments=json.dumps(arguments, ensure_ascii=False))

    def _drop_call(self) -> None:
        self._field = None
        self._name.clear()
        self._key.clear()
        self._value.clear()
        self._pairs.clear()


def glm_reply_grammar(markers: GlmMarkerIds, specs: Sequence[ToolSpec], *, mode: str,
                      answer: tuple[Any, str] | None, prefix: str, stop_ids: Sequence[int]
                      ) -> ToolGrammar:
    """The grammar of a reply under GLM's markup: each call names a declared function and its
    pairs follow the function's ``parameters`` property by property.

    Raises:
        InvalidRequest: a schema pairs cannot honour (root keywords beyond properties and
            required, ``$ref``s, a string with a pattern or format: GLM writes strings raw),
            naming its path.
    """
    k = [special(i) for i in attrs.astuple(markers)]
    call_open, call_close, key_open, key_close, value_open, value_close = k[:6]

    def call(spec: ToolSpec, index: str) -> str:
        del index  # GLM calls carry no number
        arguments = _pairs(spec)

        def pair(argument: Argument) -> str:
            return (f'"\\n"? {key_open} {literal(argument.key)} {key_close} "\\n"? {value_open} '
                    f"{argument.value} {value_close}")

        return (f'{call_open} {literal(spec.name)} {element_sequence(arguments, pair)} "\\n"? '
                f"{call_close}")

    return chat_reply_grammar(specs=specs, mode=mode, answer=answer, prefix=prefix,
                              section=('"\\n"?', ""), call=call, stop_ids=stop_ids, first_index=0)


def _pairs(spec: ToolSpec) -> list[Argument]:
    schema = object_schema(spec)
    arguments = element_arguments(schema)
    if arguments is None:
        raise InvalidRequest(
            f"{spec.param}: GLM tool markup writes arguments key by key, so only an object "
            "schema of properties (and required) can be enforced.", spec.param, "unsupported_value")
    for argument in arguments:
        sub = (schema.get("properties") or {}).get(argument.key) or {}
        if argument.type_name is None and is_string_schema(sub):
            bad = next((k for k in ("pattern", "format") if k in sub), "type")
            where = f"{spec.param}.properties.{argument.key}.{bad}"
            raise InvalidRequest(f"{where}: GLM tool markup writes strings raw, so a string "
                                 "pattern or format cannot be enforced.", where, "unsupported_value")
    return arguments

