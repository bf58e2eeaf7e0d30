"""The Kimi K2 tool protocol: declaring tools, replaying calls and results, reading calls back.

Used by a chat.json format whose tokenizer carries all five K2 tool markers (docs/CHATJSON.md,
"The Kimi K2 tool protocol"). It imports nothing from the chat.json module; that module
imports this one. Template text goes out as markup segments, caller data as plain ones.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

import attrs

from waste.domain.errors import KimiToolError
from waste.domain.reply.events import ToolCall
from waste.domain.reply.tool_grammar import (ToolGrammar, ToolSpec, chat_reply_grammar, json_value,
                                             literal, object_schema, special)
from waste.domain.segments import Segment, markup, plain

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
TOOL_MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END)

# K2's turn markers: the declaration and the results are system-like turns of their own.
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
IM_END = "<|im_end|>"
TURN_MARKERS = (IM_SYSTEM, IM_MIDDLE, IM_END)

# functions.NAME:IDX — the name is everything between the first "." and the last ":".
_CALL_ID = re.compile(r"([^.]*)\.(.+):(\d+)", re.DOTALL)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict_loads(text: str) -> Any:
    """RFC 8259 JSON: NaN and Infinity are not JSON, whatever Python's json module thinks."""
    return json.loads(text, parse_constant=_reject_constant)


def call_id(name: str, index: int) -> str:
    """The K2 spelling of a call id: ``functions.NAME:IDX``."""
    return f"functions.{name}:{index}"


def name_from_call_id(call_id_text: str) -> str | None:
    """The function name inside a K2 call id, or None when the id is not of that form."""
    match = _CALL_ID.fullmatch(call_id_text)
    return match.group(2) if match else None


def parse_call_arguments(arguments: object, *, param: str | None = None) -> str:
    """Validate a request's tool-call arguments and return the text the prompt carries.

    A string is carried verbatim; an unparseable string renders raw (docs/HTTP.md §2.3). An object
    is written as compact JSON, absent arguments as ``{}``.

    Args:
        arguments: ``function.arguments`` of an assistant message's tool call.
        param: the request path named by the error, e.g.
            ``messages[2].tool_calls[0].function.arguments``.

    Raises:
        KimiToolError: a string holding JSON that is not an object, or a value that is
            neither a string, an object nor None.
    """
    if arguments is None:
        return "{}"
    if isinstance(arguments, dict):
        return _compact(arguments)
    if isinstance(arguments, str):
        try:
            decoded = _strict_loads(arguments)
        except ValueError:
            return arguments
        if not isinstance(decoded, dict):
            raise KimiToolError("Kimi K2 tool call arguments must be a JSON object.", param)
        return arguments
    raise KimiToolError(
        "Kimi K2 tool call arguments must be a JSON object or a JSON object string.", param)


def render_declaration(tools: Sequence[dict[str, Any]]) -> list[Segment]:
    """The ``tool_declare`` turn: the OpenAI ``tools`` array as compact JSON, key order kept."""
    return [*markup(IM_SYSTEM + "tool_declare" + IM_MIDDLE), *plain(_compact(list(tools))),
            *markup(IM_END)]


@attrs.define
class CallIds:
    """The K2 ids of the latest assistant turn's calls, so each result answers consistently.

    Every call is given ``functions.NAME:IDX`` by its position in the turn (docs/CHATJSON.md: IDX
    counts that turn's calls from 0), whatever id the client sent, even one already of that
    form. Ids are then unique within the turn by construction: keeping a client's K2-form id
    (``functions.f:1`` first) beside a rewritten one (``x`` second, also ``functions.f:1``)
    would make two results indistinguishable. A result is mapped through the client id it
    names, so it carries the id its call was given.
    """

    _client_ids: list[str | None] = attrs.field(factory=list, init=False)
    _k2_ids: list[str] = attrs.field(factory=list, init=False)
    _answered: list[bool] = attrs.field(factory=list, init=False)
    _results_seen: int = attrs.field(default=0, init=False)

    def assign(self, calls: Sequence[dict[str, Any]]) -> list[str]:
        """Start a new assistant turn; return the K2 id of each call, in order."""
        self._client_ids, self._k2_ids, self._results_seen = [], [], 0
        for index, call in enumerate(calls):
            client_id = call.get("id")
            name = (call.get("function") or {}).get("name", "")
            self._client_ids.append(client_id if isinstance(client_id, str) else None)
            self._k2_ids.append(call_id(name, index))
        self._answered = [False] * len(calls)
        return list(self._k2_ids)

    def answer(self, tool_call_id: str | None) -> str:
        """The id a tool result carries in the prompt.

        A known client id maps to its call's K2 id (when two calls shared a client id, to the
        first not yet answered); a missing one answers the call at the same position since the
        assistant turn; an unknown one is kept verbatim (there is no call to stay consistent
        with).
        """
        position = self._results_seen
        self._results_seen += 1
        if tool_call_id is None:
            index = position if position < len(self._k2_ids) else None
        else:
            named = [i for i, client_id in enumerate(self._client_ids)
                     if client_id == tool_call_id]
            if not named:
                return tool_call_id
            index = next((i for i in named if not self._answered[i]), named[0])
        if index is None:
            return ""
        self._answered[index] = True
        return self._k2_ids[index]


def render_calls(calls: Sequence[dict[str, Any]], ids: Sequence[str], *, param: str = "messages"
                 ) -> list[Segment]:
    """An assistant turn's call section (after its content, before the assistant suffix).

    Args:
        calls: the message's OpenAI ``tool_calls``.
        ids: their K2 ids, from ``CallIds.assign``.
        param: the message's request path (``messages[i]``), for errors.

    Raises:
        KimiToolError: arguments that are not a JSON object (see ``parse_call_arguments``).
    """
    segments = markup(SECTION_BEGIN)
    for index, (call, k2_id) in enumerate(zip(calls, ids, strict=True)):
        function = call.get("function") or {}
        arguments = parse_call_arguments(
            function.get("arguments"), param=f"{param}.tool_calls[{index}].function.arguments")
        segments += [*markup(CALL_BEGIN), *plain(k2_id), *markup(ARGUMENT_BEGIN),
                     *plain(arguments), *markup(CALL_END)]
    return segments + markup(SECTION_END)


def render_result(content: str, answered_id: str, name: str | None) -> list[Segment]:
    """A tool message: ``<|im_system|>NAME<|im_middle|>## Return of ID\\nCONTENT<|im_end|>``.

    ``name`` is the tool message's own ``name``; without one the turn is called ``tool``.
    The header and the content share one plain segment: the header holds no marker, and
    tokenizing them together matches how K2's template tokenizes the turn.
    """
    return [*markup(IM_SYSTEM), *plain(name or "tool"), *markup(IM_MIDDLE),
            *plain(f"## Return of {answered_id}\n{content}"), *markup(IM_END)]


@attrs.frozen
class ToolMarkerIds:
    """The five tool markers' token ids, resolved from a vocabulary."""

    section_begin: int
    section_end: int
    call_begin: int
    argument_begin: int
    call_end: int

    def all(self) -> frozenset[int]:
        return frozenset(attrs.astuple(self))


def _parse_call(id_text: str, arguments_text: str) -> ToolCall | None:
    """A complete call, or None when its id or arguments are malformed."""
    k2_id = id_text.strip()
    name = name_from_call_id(k2_id)
    if not name:
        return None
    try:
        arguments = _strict_loads(arguments_text)
    except ValueError:
        return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id=k2_id, name=name, arguments=json.dumps(arguments, ensure_ascii=False))


@attrs.define
class CallSectionReader:
    """Reads the model's call sections incrementally, from marker ids and decoded text.

    The host feeds markers with ``feed_marker`` and routes text here while ``active``. Each
    complete call comes back as a ``ToolCall``; a complete but malformed one (an id not of
    the form ``functions.NAME:IDX``, arguments that are not a JSON object) comes back as the
    text the model wrote (id then arguments), for the host to keep as content. An unfinished
    call is dropped, so a call is never emitted with truncated arguments. Never raises.
    """

    markers: ToolMarkerIds
    _in_section: bool = attrs.field(default=False, init=False)
    _field: str | None = attrs.field(default=None, init=False)  # "id"/"arguments" in a call
    _id: list[str] = attrs.field(factory=list, init=False)
    _arguments: list[str] = attrs.field(factory=list, init=False)

    @property
    def active(self) -> bool:
        """True while text belongs to the call section rather than to content."""
        return self._in_section or self._field is not None

    def is_marker(self, token_id: int) -> bool:
        return token_id in self.markers.all()

    def feed_text(self, text: str) -> None:
        """Text inside a call is its id or arguments; text between calls is dropped."""
        if self._field == "id":
            self._id.append(text)
        elif self._field == "arguments":
            self._arguments.append(text)

    def feed_marker(self, token_id: int) -> list[ToolCall | str]:
        """Apply one marker; return the calls it completed (or the text of a malformed one)."""
        m = self.markers
        if token_id == m.section_begin:
            self._drop_call()
            self._in_section = True
        elif token_id == m.section_end:
            self._drop_call()
            self._in_section = False
        elif token_id == m.call_begin:
            self._drop_call()
            self._in_section = True  # a call outside a section implies one
            self._field = "id"
        elif token_id == m.argument_begin:
            if self._field == "id":
                self._field = "arguments"
        elif token_id == m.call_end and self._field is not None:
            id_text, arguments_text = "".join(self._id), "".join(self._arguments)
            has_arguments = self._field == "arguments"
            self._drop_call()
            call = _parse_call(id_text, arguments_text) if has_arguments else None
            if call is not None:
                return [call]
            text = id_text + arguments_text
            return [text] if text else []
        return []

    def finish(self) -> None:
        """End of output: an unfinished call is dropped."""
        self._drop_call()
        self._in_section = False

    def _drop_call(self) -> None:
        self._field = None
        self._id.clear()
        self._arguments.clear()


def k2_reply_grammar(markers: ToolMarkerIds, specs: Sequence[ToolSpec], *, mode: str,
                     answer: tuple[Any, str] | None, prefix: str, stop_ids: Sequence[int]
                     ) -> ToolGrammar:
    """The grammar of a reply under the K2 protocol: each call's id names a declared function
    (``functions.NAME:IDX``) and its arguments are JSON of that function's ``parameters``
    (docs/DECISIONS.md, tool-call constraints)."""
    ids = [special(i) for i in attrs.astuple(markers)]
    section_begin, section_end, call_begin, argument_begin, call_end = ids

    def call(spec: ToolSpec, index: str) -> str:
        return (f"{call_begin} {literal(f'functions.{spec.name}:')} {index} {argument_begin} "
                f"{json_value(object_schema(spec))} {call_end}")

    return chat_reply_grammar(specs=specs, mode=mode, answer=answer, prefix=prefix,
                              section=(section_begin, section_end), call=call,
                              stop_ids=stop_ids, first_index=0)
