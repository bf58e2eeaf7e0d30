"""The K3 reply parser (the seed's ``regions``): the model's XTML back into an OpenAI message.

Incremental, so deltas stream while the model talks and each tool call goes out once complete.
Structure comes from marker ids (``feed_token``) or marker strings (``feed``); docs/XTML.md §6.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import secrets
from typing import Any, Callable

import attrs

from waste.domain.reply.events import Delta, ToolCall, assistant_message
from waste.domain.xtml.markers import CLOSE, END_OF_MSG, OPEN, SEP, STRUCTURE, XtmlMarkerIds

_LONGEST_MARKER = max(len(m) for m in STRUCTURE)

# A header attribute: a run of word characters, '="', the value up to the next '"'.
_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')

# Parser states (docs/XTML.md §6 "States").
TOP, THINK, RESPONSE, TOOLS, CALL, ARG, JSON, DONE = (
    "TOP", "THINK", "RESPONSE", "TOOLS", "CALL", "ARG", "JSON", "DONE")


@attrs.define
class _Element:
    """An ``argument`` or ``json`` element being read inside a call."""

    name: str
    attributes: dict[str, str]
    parts: list[str] = attrs.Factory(list)


@attrs.define
class _CallDraft:
    """A call whose ``⟦c⟧call⟦s⟧`` has not arrived yet; dropped if the output ends first."""

    attributes: dict[str, str]
    elements: list[_Element] = attrs.Factory(list)


def _new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@attrs.define
class RegionParser:
    """Reads one K3 assistant turn, starting right after the generation prompt.

    Never raises on model output: malformed structure ends as text or a dropped element.
    Feed it in one mode only (``feed_token`` or ``feed``), then call ``finish`` once.
    """

    thinking: bool = attrs.field(kw_only=True)
    marker_ids: XtmlMarkerIds | None = attrs.field(default=None, kw_only=True)
    call_id_factory: Callable[[], str] | None = attrs.field(default=None, kw_only=True)
    # Non-marker tokens fed by id in the THINK region, tag headers excluded (docs/HTTP.md §3.3).
    reasoning_tokens: int = attrs.field(default=0, init=False)
    tool_calls: list[ToolCall] = attrs.field(factory=list, init=False)
    ended_by_marker: bool = attrs.field(default=False, init=False)
    _state: str = attrs.field(default=TOP, init=False)
    # (kind "open"/"close", header parts) between a ⟦o⟧/⟦c⟧ and its ⟦s⟧.
    _pending: tuple[str, list[str]] | None = attrs.field(default=None, init=False)
    _top_whitespace: str = attrs.field(default="", init=False)
    _top_has_text: bool = attrs.field(default=False, init=False)
    _call: _CallDraft | None = attrs.field(default=None, init=False)
    _element: _Element | None = attrs.field(default=None, init=False)
    _reasoning: list[str] = attrs.field(factory=list, init=False)
    _content: list[str] = attrs.field(factory=list, init=False)
    _held: str = attrs.field(default="", init=False)  # text mode: a possible partial marker
    _decoder: codecs.IncrementalDecoder = attrs.field(init=False)
    _marker_by_id: dict[int, str] = attrs.field(factory=dict, init=False)
    _finished: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self._state = THINK if self.thinking else RESPONSE
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if self.marker_ids is not None:
            ids = self.marker_ids
            self._marker_by_id = {ids.open: OPEN, ids.sep: SEP, ids.close: CLOSE,
                                  ids.end_of_msg: END_OF_MSG}

    # ---- results -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once ``⟦c⟧message⟦s⟧`` or ``⟦e⟧`` arrived; the server may stop generating."""
        return self._state == DONE

    @property
    def reasoning(self) -> str:
        """The reasoning read so far (never stripped)."""
        return "".join(self._reasoning)

    @property
    def content(self) -> str:
        """The content read so far (never stripped)."""
        return "".join(self._content)

    def message(self) -> dict[str, Any]:
        """The OpenAI assistant message (docs/HTTP.md §3.1); call after ``finish``."""
        return assistant_message(self.content, self.reasoning, self.tool_calls)

    # ---- feeding -------------------------------------------------------------------------

    def feed_token(self, token_id: int, piece: bytes | str) -> list[Delta]:
        """Feed one generated token. Structure comes only from the four marker ids.

        Args:
            token_id: The sampled id; a marker id is structure, anything else is text.
            piece: The token's bytes (decoded incrementally, split UTF-8 held back, invalid
                bytes become U+FFFD) or its text. Ignored for marker ids.

        Returns:
            The deltas this token released, in order.

        Raises:
            ValueError: the parser was built without ``marker_ids`` (a setup error).
        """
        if self.marker_ids is None:
            raise ValueError("RegionParser.feed_token needs marker_ids; use feed() for text")
        out: list[Delta] = []
        if self._finished:
            return out
        self._release_held(out)
        marker = self._marker_by_id.get(token_id)
        if marker is not None:
            # Bytes cut off by a marker can never be completed: they become U+FFFD first.
            self._flush_decoder(out)
            self._on_marker(marker, out)
            return out
        if self._state == THINK and self._pending is None:
            self.reasoning_tokens += 1
        if isinstance(piece, str):
            self._flush_decoder(out)
            self._on_text(piece, out)
        else:
            self._on_text(self._decoder.decode(bytes(piece)), out)
        return out

    def feed(self, text: str) -> list[Delta]:
        """Feed model text, finding markers by their strings (a spelled-out one counts too).

        A tail that is a proper prefix of a marker is held until more text decides, so the
        result does not depend on how the text is chunked.
        """
        out: list[Delta] = []
        if self._finished:
            return out
        self._flush_decoder(out)
        buffer, self._held = self._held + text, ""
        start = search = 0
        while (at := buffer.find("<|", search)) >= 0:
            marker = next((m for m in STRUCTURE if buffer.startswith(m, at)), None)
            if marker is not None:
                self._on_text(buffer[start:at], out)
                self._on_marker(marker, out)
                start = search = at + len(marker)
            elif len(buffer) - at < _LONGEST_MARKER and _is_partial_marker(buffer[at:]):
                self._on_text(buffer[start:at], out)
                self._held = buffer[at:]
                return out
            else:
                search = at + 1
        rest = buffer[start:]
        if rest.endswith("<"):
            rest, self._held = rest[:-1], "<"
        self._on_text(rest, out)
        return out

    def finish(self) -> list[Delta]:
        """End of output (end marker, cap, stop string, disconnect): flush what is sound.

        A held partial marker becomes text, trailing split UTF-8 becomes U+FFFD, a pending tag
        and any unfinished call are dropped; reasoning and content keep what they have.
        Later feeds are ignored.
        """
        out: list[Delta] = []
        if self._finished:
            return out
        self._flush_decoder(out)
        self._release_held(out)
        self._finished = True
        self._pending = None
        self._call = None
        self._element = None
        self._top_whitespace = ""
        return out

    # ---- the state machine ---------------------------------------------------------------

    def _release_held(self, out: list[Delta]) -> None:
        held, self._held = self._held, ""
        self._on_text(held, out)

    def _flush_decoder(self, out: list[Delta]) -> None:
        self._on_text(self._decoder.decode(b"", final=True), out)
        self._decoder.reset()

    def _on_text(self, text: str, out: list[Delta]) -> None:
        if not text or self._state == DONE:
            return
        if self._pending is not None:
            self._pending[1].append(text)
            return
        state = self._state
        if state == THINK:
            self._reasoning.append(text)
            out.append(Delta(kind="reasoning", text=text))
        elif state == RESPONSE:
            self._add_content(text, out)
        elif state == TOP:
            # A TOP stretch made only of whitespace is dropped, so hold it until it is not.
            if self._top_has_text:
                self._add_content(text, out)
            elif text.isspace():
                self._top_whitespace += text
            else:
                self._top_has_text = True
                held, self._top_whitespace = self._top_whitespace, ""
                self._add_content(held + text, out)
        elif state in (ARG, JSON):
            assert self._element is not None
            self._element.parts.append(text)
        # TOOLS and CALL: text between elements is dropped.

    def _add_content(self, text: str, out: list[Delta]) -> None:
        self._content.append(text)
        out.append(Delta(kind="content", text=text))

    def _on_marker(self, marker: str, out: list[Delta]) -> None:
        if self._state == DONE:
            return
        # Any marker ends a TOP text stretch.
        self._top_whitespace, self._top_has_text = "", False
        if marker == SEP:
            if self._pending is not None:
                kind, parts = self._pending
                self._pending = None
                self._on_tag(kind, "".join(parts), out)
            return  # a ⟦s⟧ with no pending tag is dropped
        self._pending = None  # ⟦o⟧, ⟦c⟧ and ⟦e⟧ drop a pending tag
        if marker == END_OF_MSG:
            self._end()
        else:
            self._pending = ("open" if marker == OPEN else "close", [])

    def _on_tag(self, kind: str, header: str, out: list[Delta]) -> None:
        words = header.split()
        name = words[0] if words else ""
        state = self._state
        if kind == "close" and name == "message":
            self._end()
        elif kind == "open":
            if name == "response" and state in (TOP, THINK):
                self._state = RESPONSE
            elif name == "tools" and state in (TOP, THINK, RESPONSE):
                self._state = TOOLS
            elif name == "call" and state in (TOOLS, TOP, THINK, RESPONSE):
                self._call = _CallDraft(_attributes(header))
                self._state = CALL
            elif name in ("argument", "json") and state == CALL:
                self._element = _Element(name, _attributes(header))
                self._state = ARG if name == "argument" else JSON
        elif name == "think" and state == THINK or name == "response" and state == RESPONSE:
            self._state = TOP
        elif name == "argument" and state == ARG or name == "json" and state == JSON:
            self._keep_element()
            self._state = CALL
        elif name == "call" and state in (CALL, ARG, JSON):
            self._keep_element()
            self._emit_call(out)
            self._state = TOOLS
        elif name == "tools" and state == TOOLS:
            self._state = TOP
        # Anything else (unknown, or a close for what is not open) is dropped unchanged.

    def _keep_element(self) -> None:
        if self._element is not None and self._call is not None:
            self._call.elements.append(self._element)
        self._element = None

    def _end(self) -> None:
        self._pending = None
        self._call = None  # an unfinished call is never emitted with truncated arguments
        self._element = None
        self._state = DONE
        self.ended_by_marker = True

    def _emit_call(self, out: list[Delta]) -> None:
        draft, self._call = self._call, None
        if draft is None:
            return
        name = draft.attributes.get("tool")
        if name is None:
            return
        new_id = self.call_id_factory or _new_call_id
        call = ToolCall(id=new_id(), name=name, arguments=_arguments(draft.elements))
        out.append(Delta(kind="tool_call", call=call, index=len(self.tool_calls)))
        self.tool_calls.append(call)


# ---- headers and arguments --------------------------------------------------------------

def _is_partial_marker(text: str) -> bool:
    return any(len(text) < len(m) and m.startswith(text) for m in STRUCTURE)


def _attributes(header: str) -> dict[str, str]:
    """``name="value"`` pairs, left to right; the first of a repeated name wins."""
    found: dict[str, str] = {}
    for name, value in _ATTRIBUTE.findall(header):
        # &quot; first, then &amp;: the inverse of the renderer's escape order.
        found.setdefault(name, value.replace("&quot;", '"').replace("&amp;", "&"))
    return found


def _arguments(elements: list[_Element]) -> str:
    """The ``arguments`` string of a complete call (docs/XTML.md §6 "Emitting a call")."""
    raw_json = next((e for e in elements if e.name == "json"), None)
    if raw_json is not None:
        raw = "".join(raw_json.parts)
        decoded, value = _strict_json(raw)
        return _dumps(value) if decoded and isinstance(value, dict) else raw
    obj: dict[str, Any] = {}
    for element in elements:
        key = element.attributes.get("key")
        if key is None:
            continue
        text = "".join(element.parts)
        if element.attributes.get("type") == "string":
            obj[key] = text
        else:
            decoded, value = _strict_json(text)
            obj[key] = value if decoded else text
    return _dumps(obj)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf, which JSON cannot carry back out
        raise ValueError(f"{text} overflows a double")
    return value


def _strict_json(text: str) -> tuple[bool, object]:
    """Decode RFC 8259 JSON: no NaN/Infinity, finite numbers, re-serialisable as UTF-8."""
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        # Wrapped once more, as it will be in the arguments object: a depth that only just
        # decodes, or a lone surrogate from a \\ud800 escape, would fail later otherwise.
        json.dumps([value], ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):
        return False, None
    return True, value


def _dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)
