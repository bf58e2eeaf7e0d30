"""From a validated chat request to a prompt plan: segments, stop ids and a reply reader.

This is the server mapping of xtml.md §5 and chatjson.md: the format chosen at startup
decides the renderer, the thinking default is applied here, and capability refusals are
raised before anything is tokenized.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs

from waste.domain.chatfmt import ChatFormatSelection
from waste.domain.completion import Reader
from waste.domain.errors import DomainError
from waste.domain.regions import RegionParser, XtmlMarkerIds
from waste.domain.requests import ChatRequest, resolve_thinking
from waste.domain.segments import Segment
from waste.domain.xtml import image_prompt, render_segments


class NoChatFormat(DomainError):
    """The container has no usable chat format; only /v1/completions can serve it."""


@attrs.frozen(kw_only=True)
class ChatPlan:
    """Everything a chat request needs from the domain before the engine runs."""

    segments: tuple[Segment, ...]
    stop_ids: tuple[int, ...]
    thinking: bool
    new_reader: Callable[[], Reader]


def named_tool_message(name: str) -> dict:
    """The system message a named-function tool_choice appends (xtml.md §5)."""
    return {"role": "system",
            "content": f"The next message must call the tool `{name}`; call no other tool."}


def require_chat_format(selection: ChatFormatSelection) -> None:
    """http.md §2.1 step 6: raise the held error when the container has no chat format."""
    if selection.kind is None:
        raise NoChatFormat(
            f"This model has no usable chat format ({selection.error}). "
            "Use /v1/completions for raw continuation.")


def check_chat_capabilities(request: ChatRequest, selection: ChatFormatSelection) -> None:
    """Refuse what the format cannot express (http.md §2.1 step 8), before images decode.

    Raises:
        NoChatFormat: the container has no chat format (the held error).
        ChatFormatError: ``unsupported_by_format``, naming the field that asked.
    """
    require_chat_format(selection)
    if selection.kind != "chat.json":
        return
    choice = request.thinking
    effort = choice.effort or ("off" if choice.off else None)
    image_param = request.image_parts[0].part_param if request.image_parts else "messages"
    selection.chat_format.check_request(
        thinking_explicit=choice.switch, effort=effort,
        tools_nonempty=bool(request.tools), tool_choice=request.tool_choice,
        response_format_type=(request.response_format or {}).get("type"),
        has_images=bool(request.image_parts), thinking_param=choice.param or "thinking",
        effort_param=choice.param or "reasoning_effort", image_param=image_param)


def plan_chat(request: ChatRequest, selection: ChatFormatSelection, *, default_thinking: bool,
              image_sizes: Sequence[tuple[int, int]] = ()) -> ChatPlan:
    """Render the prompt for ``request`` in the container's chat format.

    Args:
        request: a validated chat request.
        selection: the format chosen at startup.
        default_thinking: the server default (False with ``--no-thinking``).
        image_sizes: (width, height) of each decoded image, in message order.

    Raises:
        NoChatFormat, ChatFormatError, XTMLError, KimiToolError.
    """
    check_chat_capabilities(request, selection)
    if selection.kind == "xtml":
        return _plan_xtml(request, selection, default_thinking, image_sizes)
    fmt = selection.chat_format
    if fmt.always_open:
        thinking, effort = True, request.thinking.effort
    elif not fmt.reasoning:
        thinking, effort = False, None
    else:
        thinking, _ = resolve_thinking(request.thinking, default_on=default_thinking)
        effort = request.thinking.effort  # a bare switch renders no effort on chat.json
    tools = request.tools if request.tool_choice != "none" else None
    segments = fmt.render(request.messages, tools=tools, thinking=thinking, effort=effort)
    return ChatPlan(segments=tuple(segments), stop_ids=tuple(fmt.stop_ids), thinking=thinking,
                    new_reader=lambda: fmt.reply_reader(thinking=thinking))


def _plan_xtml(request: ChatRequest, selection: ChatFormatSelection, default_thinking: bool,
               image_sizes: Sequence[tuple[int, int]]) -> ChatPlan:
    thinking, effort = resolve_thinking(request.thinking, default_on=default_thinking)
    messages = list(request.messages)
    if request.tool_choice_function is not None:
        messages.append(named_tool_message(request.tool_choice_function))
    prompts = [image_prompt(w, h) for w, h in image_sizes] if request.image_parts else None
    segments = render_segments(
        messages, list(request.tools) if request.tools else None, thinking=thinking,
        thinking_effort=effort, tool_choice=request.tool_choice,
        response_format=request.response_format, image_prompts=prompts)
    ids = XtmlMarkerIds(*selection.xtml_marker_ids)
    return ChatPlan(segments=tuple(segments), stop_ids=(ids.end_of_msg,), thinking=thinking,
                    new_reader=lambda: RegionParser(thinking=thinking, marker_ids=ids))
