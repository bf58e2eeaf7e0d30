"""The Kimi K3 XTML prompt renderer: OpenAI-shaped messages in, tokenizer segments out.

Mirrors the K3 release's ``encoding_k3.py`` (docs/XTML.md §1–§4): structure markers and image
prompts are markup segments, everything a user, tool or model wrote is plain, and no segment
is ever empty or merged with its neighbour.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import attrs

from waste.domain.errors import XTMLError
from waste.domain.requests.thinking import ON_EFFORTS
from waste.domain.segments import Segment, markup, plain
from waste.domain.xtml.arguments import (
    RawArguments,
    argument_text,
    argument_type,
    canonical_json,
    normalise_arguments,
)
from waste.domain.xtml.markers import (CLOSE, END_OF_MSG, MEDIA_BEGIN, MEDIA_CONTENT, MEDIA_END,
                                      MEDIA_PAD, MEDIA_PLACEHOLDER, OPEN, SEP)
from waste.domain.xtml.tool_results import call_function, order_tool_results, resolve_tool_name


# A set, not a tuple: upstream's membership test raises TypeError for an unhashable effort,
# and sorted() of it gives the ['high', 'low', 'max'] its message prints.
SUPPORTED_EFFORTS = frozenset(ON_EFFORTS)
IMAGE_PART_TYPES = ("image", "image_url")

TOOLS_DECLARE = (
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{tools}\n```"
)
LAZY_TOOLS_DECLARE = (
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n```json\n{tools}\n```"
)
THINKING_EFFORT = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including the"
    " response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort={effort}`."
)
TOOL_CHOICE = {
    "required": "The system is invoked with `tool_choice=required`.\n"
    "You MUST call tools in the next message.",
    "none": "The system is invoked with `tool_choice=none`.\n"
    "You MUST NOT call any tools in the next message.",
}
_RAW_JSON_ONLY = (
    "Your response must be raw JSON data without markdown code blocks (```json) or any"
    " additional formatting."
)
JSON_OBJECT_FORMAT = "The system is invoked with `response_format=json_object`.\n" + _RAW_JSON_ONLY
JSON_SCHEMA_FORMAT = (
    "The system is invoked with `response_format=json_schema`.\n" + _RAW_JSON_ONLY + "\n"
    "The JSON data must match the following schema:\n```json\n{schema}\n```"
)
TOO_FEW_PROMPTS = "More image placeholders than image prompts."


def image_prompt(width: int, height: int) -> str:
    """The markup K3's vision processor puts where an image goes (docs/XTML.md §3.8).

    Args:
        width: the decoded image's original width in pixels, before any resize.
        height: its original height in pixels.

    Returns:
        ``<|media_begin|>image {W}x{H}<|media_content|><|media_pad|><|media_end|>``.

    Raises:
        ValueError: a size that is not a positive int.
    """
    for field, size in (("width", width), ("height", height)):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"image {field} must be a positive int, got {size!r}")
    return f"{MEDIA_BEGIN}image {width}x{height}{MEDIA_CONTENT}{MEDIA_PAD}{MEDIA_END}"


def render_segments(
    messages: Sequence[Any],
    tools: Any = None,
    *,
    thinking: bool = True,
    thinking_effort: Any = None,
    tool_choice: Any = None,
    response_format: Any = None,
    image_prompts: Sequence[str] | None = None,
    add_generation_prompt: bool = True,
) -> list[Segment]:
    """Render a chat as K3 prompt segments, exactly as upstream's ``encoding_k3.py`` does.

    Pure: the inputs are deep-copied before the tool-result re-sort renames anything.

    Args:
        messages: OpenAI-shaped message dicts; non-dicts and unknown roles are skipped.
        tools: the tool declarations, rendered only when truthy.
        thinking: whether the think channel is on (history and generation prompt).
        thinking_effort: None, ``"low"``, ``"high"`` or ``"max"``; checked only when thinking.
        tool_choice: only ``"required"`` and ``"none"`` render anything.
        response_format: None, a type string, or a dict with ``type`` (and ``json_schema``).
        image_prompts: None, or one markup string per image part / placeholder, in render order.
        add_generation_prompt: whether to open the assistant turn at the end.

    Returns:
        The segments, in order; encode each on its own and concatenate the ids.

    Raises:
        XTMLError: wherever upstream raises, with its exception class name as ``kind`` and
            its message text. When several apply: arguments, then effort, then the messages
            in render order, then leftover image prompts.
    """
    try:
        return _render(
            messages, tools, thinking=thinking, thinking_effort=thinking_effort,
            tool_choice=tool_choice, response_format=response_format,
            image_prompts=image_prompts, add_generation_prompt=add_generation_prompt,
        )
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        # Upstream lets Python's own exception escape on a malformed shape (a missing 'role',
        # a part that is not a dict, unserialisable tools). We perform the same operations on
        # the same data, so relabelling the exception reproduces upstream's refusal.
        raise XTMLError(type(exc).__name__, str(exc)) from exc


def _render(
    messages: Any,
    tools: Any,
    *,
    thinking: Any,
    thinking_effort: Any,
    tool_choice: Any,
    response_format: Any,
    image_prompts: Sequence[str] | None,
    add_generation_prompt: Any,
) -> list[Segment]:
    ordered = order_tool_results(copy.deepcopy(list(messages)))
    for message in ordered:  # arguments are checked before anything else (docs/XTML.md §2)
        if isinstance(message, dict) and message.get("tool_calls"):
            for entry in message["tool_calls"]:
                normalise_arguments(call_function(entry).get("arguments"))
    if thinking and thinking_effort is not None and thinking_effort not in SUPPORTED_EFFORTS:
        raise XTMLError(
            "AssertionError",
            f"Unsupported thinking_effort={thinking_effort!r}; "
            f"supported values are {sorted(SUPPORTED_EFFORTS)}.",
        )
    renderer = _Renderer(thinking=bool(thinking), prompts=image_prompts)
    if tools:
        renderer.synthetic("tool-declare", TOOLS_DECLARE.format(tools=canonical_json(tools)))
    if thinking and thinking_effort is not None:
        renderer.synthetic("thinking-effort", THINKING_EFFORT.format(effort=thinking_effort))
    renderer.history(ordered)
    if isinstance(tool_choice, str) and tool_choice in TOOL_CHOICE:
        renderer.synthetic("tool-choice", TOOL_CHOICE[tool_choice])
    _render_response_format(renderer, response_format)
    if add_generation_prompt:
        renderer.open("message", ("role", "assistant"))
        renderer.open("think" if thinking else "response")
    if image_prompts is not None and renderer.consumed != len(image_prompts):
        raise XTMLError(
            "ValueError",
            f"image prompt count {len(image_prompts)} != consumed placeholder count {renderer.consumed}",
        )
    return renderer.out


def _render_response_format(renderer: _Renderer, response_format: Any) -> None:
    format_type = response_format.get("type") if isinstance(response_format, dict) else response_format
    if not isinstance(format_type, str):
        return
    if format_type == "json_object":
        renderer.synthetic("response-format", JSON_OBJECT_FORMAT)
    elif format_type == "json_schema":
        schema = _schema_of(response_format)
        renderer.synthetic("response-format", JSON_SCHEMA_FORMAT.format(schema=canonical_json(schema)))


def _schema_of(response_format: Any) -> Any:
    if not isinstance(response_format, dict):
        return None
    json_schema = response_format.get("json_schema")
    if not isinstance(json_schema, dict):
        return json_schema  # None, or any other value, is used as it is
    if "schema" in json_schema:
        return json_schema["schema"]
    if "json_schema" in json_schema:
        return json_schema["json_schema"]
    return json_schema


def _escape(value: str) -> str:
    # & first, or the & of every &quot; would be escaped again.
    return value.replace("&", "&amp;").replace('"', "&quot;")


@attrs.define(kw_only=True)
class _Renderer:
    """Accumulates segments and the image-prompt cursor over one render."""

    thinking: bool
    prompts: Sequence[str] | None
    consumed: int = attrs.field(default=0, init=False)
    out: list[Segment] = attrs.field(factory=list, init=False)

    def open(self, tag: str, *attributes: tuple[str, Any]) -> None:
        self.out += markup(OPEN)
        self.out += plain(tag)
        for key, value in attributes:  # four plain segments, never merged (docs/XTML.md §1 rule 3)
            self.out += plain(f" {key}")
            self.out += plain('="')
            self.out += plain(_escape(str(value)))
            self.out += plain('"')
        self.out += markup(SEP)

    def close(self, tag: str) -> None:
        self.out += markup(CLOSE)
        self.out += plain(tag)
        self.out += markup(SEP)

    def end_message(self) -> None:
        self.close("message")
        self.out += markup(END_OF_MSG)

    def synthetic(self, kind: str, body: str) -> None:
        self.open("message", ("role", "system"), ("type", kind))
        self.out += plain(body)
        self.end_message()

    def image(self) -> None:
        if self.prompts is None:
            self.out += markup(MEDIA_PLACEHOLDER)
            return
        if self.consumed >= len(self.prompts):
            raise XTMLError("ValueError", TOO_FEW_PROMPTS)
        self.out += markup(self.prompts[self.consumed])
        self.consumed += 1

    def text(self, text: str) -> None:
        """Rendered text: each placeholder becomes the next image prompt when prompts are given."""
        if not isinstance(text, str):
            raise XTMLError("TypeError", f"text to render must be a str, not {type(text).__name__}")
        if self.prompts is None:
            self.out += plain(text)
            return
        for position, piece in enumerate(text.split(MEDIA_PLACEHOLDER)):
            if position:
                self.image()
            self.out += plain(piece)

    def content(self, content: Any) -> None:
        if content is None:
            return
        if isinstance(content, str):
            self.text(content)
            return
        for part in content:
            if part["type"] in IMAGE_PART_TYPES:
                self.image()
            else:
                self.text(part["text"])

    def history(self, messages: list[Any]) -> None:
        last_assistant: dict[str, Any] | None = None
        tool_index = 0  # tool results since the last assistant message; only it resets this
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message["role"]
            if role in ("user", "system"):
                if role == "system" and message.get("tools"):
                    tools = canonical_json(message["tools"])
                    self.synthetic("tool-declare", LAZY_TOOLS_DECLARE.format(tools=tools))
                    continue
                self.open("message", *_role_and_name(message))
                self.content(message.get("content"))
                self.end_message()
            elif role == "assistant":
                last_assistant, tool_index = message, 0
                self.assistant(message)
            elif role == "tool":
                tool_index += 1
                name = resolve_tool_name(message, tool_index, last_assistant)
                self.open("message", ("role", "tool"), ("tool", name), ("index", tool_index))
                self.content(message.get("content"))
                self.end_message()

    def assistant(self, message: dict[str, Any]) -> None:
        self.open("message", *_role_and_name(message))
        if self.thinking:
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            self.open("think")
            if reasoning is not None and str(reasoning).strip():
                self.text(str(reasoning))  # unstripped
            self.close("think")
        self.open("response")
        self.content(message.get("content"))
        self.close("response")
        calls = message.get("tool_calls")
        if calls:
            self.open("tools")
            for index, entry in enumerate(calls, start=1):
                self.call(call_function(entry), index)
            self.close("tools")
        self.end_message()

    def call(self, function: Any, index: int) -> None:
        self.open("call", ("tool", function["name"]), ("index", index))
        arguments = normalise_arguments(function.get("arguments"))
        if isinstance(arguments, RawArguments):
            self.open("json", ("type", "object"))
            self.text(arguments.text)
            self.close("json")
        else:
            for key, value in arguments.items():
                self.open("argument", ("key", key), ("type", argument_type(value)))
                self.text(argument_text(value))
                self.close("argument")
        self.close("call")


def _role_and_name(message: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    name = message.get("name")
    return (("role", message["role"]), ("name", name)) if name else (("role", message["role"]),)
