"""The XTML ``ChatFormat``: K3's markers resolved to ids, rendering and the region parser.

XTML can express everything the API asks (reasoning, efforts, tools, forced tool calls,
response formats); images only when the model has a vision tower (docs/XTML.md §5).
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from waste.domain.chat_format import Capabilities, ChatPlan
from waste.domain.requests.parse import ChatRequest
from waste.domain.requests.thinking import resolve_thinking
from waste.domain.reply.tool_grammar import call_mode, response_schema, tool_specs
from waste.domain.xtml.grammar import xtml_reply_grammar
from waste.domain.xtml.markers import CLOSE, END_OF_MSG, SEP, XtmlMarkerIds
from waste.domain.xtml.render import image_prompt, render_segments
from waste.domain.xtml.reply import RegionParser


def named_tool_message(name: str) -> dict[str, Any]:
    """The system message a named-function tool_choice appends (docs/XTML.md §5)."""
    return {"role": "system",
            "content": f"The next message must call the tool `{name}`; call no other tool."}


@attrs.frozen(kw_only=True)
class XtmlFormat:
    """XTML on a vocabulary whose four structural markers are single special tokens."""

    marker_ids: XtmlMarkerIds
    vision: bool = False
    name: str = "xtml"
    error: None = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(reasoning=True, tools=True, images=self.vision)

    @property
    def end_ids(self) -> tuple[int, ...]:
        return (self.marker_ids.end_of_msg,)

    def require_usable(self) -> None:
        pass

    def check_request(self, request: ChatRequest) -> None:
        pass  # everything a request can ask is expressible; images are the decoder's call

    def plan(self, request: ChatRequest, *, default_thinking: bool,
             image_sizes: Sequence[tuple[int, int]] = ()) -> ChatPlan:
        thinking, effort = resolve_thinking(request.thinking, default_on=default_thinking)
        messages = list(request.messages)
        if request.tool_choice_function is not None:
            messages.append(named_tool_message(request.tool_choice_function))
        prompts = [image_prompt(w, h) for w, h in image_sizes] if request.image_parts else None
        segments = render_segments(
            messages, list(request.tools) if request.tools else None, thinking=thinking,
            thinking_effort=effort, tool_choice=request.tool_choice,
            response_format=request.response_format, image_prompts=prompts)
        ids = self.marker_ids
        grammar = None
        if request.tools and request.tool_choice != "none":
            grammar = xtml_reply_grammar(
                ids, tool_specs(request.tools, request.tool_choice_function),
                mode=call_mode(request.tool_choice, request.tool_choice_function),
                thinking=thinking, answer=response_schema(request.response_format))
        return ChatPlan(segments=tuple(segments), stop_ids=self.end_ids, thinking=thinking,
                        new_reader=lambda: RegionParser(thinking=thinking, marker_ids=ids),
                        answer_end=f"{CLOSE}response{SEP}{END_OF_MSG}", reply_grammar=grammar)

    def startup_warnings(self, *, default_thinking: bool) -> tuple[str, ...]:
        return ()
