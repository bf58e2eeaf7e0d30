"""The chat.json ``ChatFormat``: its capabilities, the request checks, and rendering a prompt.

Build one with ``chatjson.load.load_chat_format``, which validates the file against the
vocabulary first (docs/CHATJSON.md). Template strings become markup segments, caller content
plain ones; the K2 tool protocol lives in ``k2tools``, the reply side in ``chatjson.reply``.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from waste.domain.chat_format import Capabilities, ChatPlan
from waste.domain.chatjson import glmtools, k2tools
from waste.domain.chatjson.reply import ChatReplyReader
from waste.domain.errors import ChatFormatError
from waste.domain.reply.tool_grammar import (ToolGrammar, call_mode, reasoning_prefix,
                                             response_schema, tool_specs)
from waste.domain.requests.parse import ChatRequest
from waste.domain.requests.thinking import OFF_EFFORTS, ON_EFFORTS, resolve_thinking
from waste.domain.segments import Segment, markup, plain


@attrs.frozen(kw_only=True)
class ChatJsonFormat:
    """A validated chat.json, with the ids its markers resolved to. Build with ``load_chat_format``.

    Capabilities: ``reasoning`` (a think channel), ``always_open`` (``open`` ends with the
    channel's open marker, as GLM's does), ``effort``, ``images``, ``tools`` (K2's: all five K2
    tool markers and the three K2 turn markers resolve; GLM's: ``"tools": "glm"`` and its nine
    markers resolve). ``stop_ids`` are the control tokens that end a generated turn: those of
    ``stop`` when given, else of the assistant suffix (GLM tools add ``<|observation|>``).
    """

    system: tuple[str, str]
    user: tuple[str, str]
    assistant: tuple[str, str]
    open: str
    prelude: str = ""
    stop: str | None = None
    think: tuple[str, str] | None = None
    effort_template: str | None = None
    image_block: str | None = None
    stop_ids: tuple[int, ...]
    think_ids: tuple[int, int] | None = None
    tool_marker_ids: k2tools.ToolMarkerIds | None = None
    glm_marker_ids: glmtools.GlmMarkerIds | None = None
    n_base_vocab: int

    @property
    def reasoning(self) -> bool:
        return self.think is not None

    @property
    def always_open(self) -> bool:
        return self.think is not None and self.open.endswith(self.think[0])

    @property
    def effort(self) -> bool:
        return self.effort_template is not None

    @property
    def images(self) -> bool:
        return self.image_block is not None

    @property
    def tools(self) -> bool:
        return self.tool_marker_ids is not None or self.glm_marker_ids is not None

    # -- the ChatFormat surface ------------------------------------------------------------

    name = "chat.json"
    error = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(reasoning=self.reasoning, tools=self.tools, images=self.images)

    @property
    def end_ids(self) -> tuple[int, ...]:
        return self.stop_ids

    def require_usable(self) -> None:
        pass

    def check_request(self, request: ChatRequest) -> None:
        """``check_fields`` on what ``request`` asks for (see ``ChatFormat.check_request``)."""
        choice = request.thinking
        effort = choice.effort or ("off" if choice.off else None)
        image_param = request.image_parts[0].part_param if request.image_parts else "messages"
        self.check_fields(
            thinking_explicit=choice.switch, effort=effort,
            tools_nonempty=bool(request.tools), tool_choice=request.tool_choice,
            response_format_type=(request.response_format or {}).get("type"),
            has_images=bool(request.image_parts), thinking_param=choice.param or "thinking",
            effort_param=choice.param or "reasoning_effort", image_param=image_param)

    def plan(self, request: ChatRequest, *, default_thinking: bool,
             image_sizes: Sequence[tuple[int, int]] = ()) -> ChatPlan:
        """The prompt in this format; image sizes do not matter (the block is fixed markup)."""
        del image_sizes
        if self.always_open:
            thinking, effort = True, request.thinking.effort
        elif not self.reasoning:
            thinking, effort = False, None
        else:
            thinking, _ = resolve_thinking(request.thinking, default_on=default_thinking)
            effort = request.thinking.effort  # a bare switch renders no effort on chat.json
        tools = request.tools if request.tool_choice != "none" else None
        segments = self.render(request.messages, tools=tools, thinking=thinking, effort=effort)
        grammar = self.reply_grammar(request, thinking=thinking) if tools else None
        return ChatPlan(segments=tuple(segments), stop_ids=tuple(self.stop_ids),
                        thinking=thinking, reply_grammar=grammar,
                        new_reader=lambda: self.reply_reader(thinking=thinking, tools=tools))

    def reply_grammar(self, request: ChatRequest, *, thinking: bool) -> ToolGrammar:
        """The grammar of a reply that may (or must) call the request's tools (docs/DECISIONS.md,
        tool-call constraints). The reasoning stays free: an always-open channel up to its
        close marker, or one the model opens first when thinking is on."""
        assert request.tools
        specs = tool_specs(request.tools, request.tool_choice_function)
        mode = call_mode(request.tool_choice, request.tool_choice_function)
        think = self.think_ids if thinking else None
        prefix = reasoning_prefix(think, self.always_open)
        answer = response_schema(request.response_format)
        if self.glm_marker_ids is not None:
            return glmtools.glm_reply_grammar(self.glm_marker_ids, specs, mode=mode, answer=answer,
                                              prefix=prefix, stop_ids=self.stop_ids)
        assert self.tool_marker_ids is not None
        return k2tools.k2_reply_grammar(self.tool_marker_ids, specs, mode=mode, answer=answer,
                                        prefix=prefix, stop_ids=self.stop_ids)

    def startup_warnings(self, *, default_thinking: bool) -> tuple[str, ...]:
        if self.always_open and not default_thinking:
            return ("this chat format always opens its reasoning channel; --no-thinking "
                    "does not apply",)
        return ()

    # -- request-time capability checks (docs/HTTP.md §2.5) ---------------------------------------

    def check_fields(
        self, *, thinking_explicit: bool | None, effort: str | None, tools_nonempty: bool,
        tool_choice: str | dict[str, Any] | None, response_format_type: str | None, has_images: bool,
        thinking_param: str = "thinking", effort_param: str = "reasoning_effort",
        image_param: str = "messages",
    ) -> None:
        """Refuse what this format cannot express; each refusal names the field that asked.

        Args:
            thinking_explicit: the request's thinking switch (None when it gave none).
            effort: the request's effort value, lowercase (``low``/``high``/``max`` or
                ``none``/``minimal``/``off``), already checked for agreement with the switch.
            tools_nonempty: the request carries a non-empty ``tools`` list.
            tool_choice: ``auto``/``none``/``required``, a named-function object, or None.
            response_format_type: ``response_format.type``, or None.
            has_images: some message carries an image part.
            thinking_param: the switch field that was used (e.g. ``chat_template_kwargs.thinking``).
            effort_param: the effort field that was used (e.g. ``reasoning_effort``).
            image_param: the path of the first image part.

        Raises:
            ChatFormatError: with ``param`` the field that asked (HTTP ``unsupported_by_format``).
        """
        effort_on, effort_off = effort in ON_EFFORTS, effort in OFF_EFFORTS
        if not self.reasoning and (effort_on or thinking_explicit is True):
            raise ChatFormatError(
                "This model's chat format has no reasoning channel; thinking cannot be turned on.",
                effort_param if effort_on else thinking_param)
        if effort_on and not self.effort:
            raise ChatFormatError(
                f"This model's chat format cannot ask for a reasoning effort ({effort!r}); "
                "omit it or send only the thinking switch.", effort_param)
        if self.always_open and (effort_off or thinking_explicit is False):
            raise ChatFormatError(
                "This model's chat format always opens its reasoning channel; thinking cannot "
                "be turned off.", effort_param if effort_off else thinking_param)
        if tools_nonempty and tool_choice != "none" and not self.tools:
            raise ChatFormatError(
                "This model's chat format has no tool protocol; tool definitions cannot be "
                "sent to it.", "tools")
        if (tool_choice == "required" or isinstance(tool_choice, dict)) and not self.tools:
            raise ChatFormatError(
                "This model's chat format has no tool protocol; a tool call cannot be forced.",
                "tool_choice")
        # json_object / json_schema: no instruction to render, the answer is constrained by
        # its grammar (docs/DECISIONS.md, constrained answers).
        if has_images and not self.images:
            raise ChatFormatError(
                "This model's chat format has no image block; image parts cannot be sent to it.",
                image_param)

    # -- rendering (docs/CHATJSON.md, "Rendering") ------------------------------------------------

    def render(self, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict[str, Any]] | None = None,
               thinking: bool, effort: str | None = None, image_prompt: str | None = None
               ) -> list[Segment]:
        """The prompt for ``messages``, ending with ``open`` (the model has the floor).

        Template strings become markup segments; the caller's content plain ones. No system
        prompt is ever inserted.

        Args:
            messages: validated OpenAI messages (system/user/assistant/tool; developer folded
                into system by the caller).
            tools: the tools to declare (K2), or None/empty for none (``tool_choice`` none).
            thinking: whether thinking is on; the effort line is rendered only then.
            effort: ``low``/``high``/``max`` or None.
            image_prompt: the markup one image part becomes; None means the format's block.

        Raises:
            ChatFormatError: something ``check_fields`` refuses (a caller bug), or an image
                part without an image block.
            KimiToolError: a call's arguments are not a JSON object.
        """
        segments = markup(self.prelude)
        if thinking and effort is not None:
            if self.effort_template is None:
                raise ChatFormatError("This model's chat format cannot ask for a reasoning "
                                      "effort.", "reasoning_effort")
            segments += markup(self.effort_template.replace("{}", effort.capitalize()))
        if tools:
            if not self.tools:
                raise ChatFormatError("This model's chat format has no tool protocol; tool "
                                      "definitions cannot be sent to it.", "tools")
            if self.glm_marker_ids is not None:
                segments += glmtools.render_declaration(self.system, tools)
            else:
                segments += k2tools.render_declaration(tools)
        call_ids = k2tools.CallIds()
        previous = None
        for index, message in enumerate(messages):
            if self.glm_marker_ids is not None and message.get("role") == "tool":
                self._require_tools(f"messages[{index}].role")
                text = _text_only(message.get("content"), f"messages[{index}]")
                segments += glmtools.render_result(text, first=previous != "tool")
            else:
                segments += self._render_message(message, f"messages[{index}]", call_ids,
                                                 image_prompt)
            previous = message.get("role")
        return segments + markup(self.open)

    def _render_message(self, message: dict[str, Any], path: str, call_ids: k2tools.CallIds,
                        image_prompt: str | None) -> list[Segment]:
        role = message.get("role")
        if role == "tool":
            self._require_tools(f"{path}.role")
            text = _text_only(message.get("content"), path)
            return k2tools.render_result(text, call_ids.answer(message.get("tool_call_id")),
                                           message.get("name"))
        if role == "assistant":
            return self._render_assistant(message, path, call_ids)
        if role not in ("system", "user"):
            raise ChatFormatError(f"{path}.role {role!r} has no turn in this chat format.",
                                  f"{path}.role")
        prefix, suffix = self.system if role == "system" else self.user
        return [*markup(prefix), *self._content(message.get("content"), path, image_prompt),
                *markup(suffix)]

    def _render_assistant(self, message: dict[str, Any], path: str, call_ids: k2tools.CallIds
                          ) -> list[Segment]:
        prefix, suffix = self.assistant
        segments = markup(prefix)
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning and self.think is not None:
            segments += [*markup(self.think[0]), *plain(reasoning), *markup(self.think[1])]
        segments += _text_only_segments(message.get("content"), path)
        calls = message.get("tool_calls")
        if calls:
            self._require_tools(f"{path}.tool_calls")
            if self.glm_marker_ids is not None:
                segments += glmtools.render_calls(calls, param=path)
            else:
                segments += k2tools.render_calls(calls, call_ids.assign(calls), param=path)
        return segments + markup(suffix)

    def _content(self, content: Any, path: str, image_prompt: str | None) -> list[Segment]:
        if content is None or isinstance(content, str):
            return plain(content or "")
        # Adjacent text parts form one plain segment, as a template concatenating them would.
        segments: list[Segment] = []
        text: list[str] = []
        for j, part in enumerate(content):
            if part.get("type") == "text":
                text.append(part.get("text", ""))
                continue
            block = image_prompt if image_prompt is not None else self.image_block
            if block is None:
                raise ChatFormatError("This model's chat format has no image block; image "
                                      "parts cannot be sent to it.", f"{path}.content[{j}]")
            segments += [*plain("".join(text)), *markup(block)]
            text = []
        return segments + plain("".join(text))

    def _require_tools(self, param: str) -> None:
        if not self.tools:
            raise ChatFormatError("This model's chat format has no tool protocol; tool calls "
                                  "and results cannot be rendered.", param)

    # -- the reply ---------------------------------------------------------------------------

    def reply_reader(self, *, thinking: bool, tools: Sequence[dict[str, Any]] | None = None
                     ) -> ChatReplyReader:
        """A fresh reader for one generated turn.

        Reasoning starts at once when the prompt opened the channel (``always_open``; thinking
        is then necessarily on, ``check_fields`` refuses it off), or when the model opens it
        itself before anything else. ``thinking`` is accepted for the XTML parser's signature;
        the prompt, not the flag, decides where the model's output starts. ``tools`` (the
        request's) tell a GLM reader which values are strings.
        """
        del thinking
        calls: k2tools.CallSectionReader | glmtools.GlmCallReader | None = None
        if self.glm_marker_ids is not None:
            schemas = {str((t.get("function") or {}).get("name")): (t.get("function") or {}).get("parameters")
                       for t in tools or ()}
            calls = glmtools.GlmCallReader(self.glm_marker_ids, schemas)
        elif self.tool_marker_ids is not None:
            calls = k2tools.CallSectionReader(self.tool_marker_ids)
        return ChatReplyReader(
            stop_ids=frozenset(self.stop_ids), n_base_vocab=self.n_base_vocab,
            think_ids=self.think_ids, starts_in_reasoning=self.always_open, calls=calls)


def _text_only(content: Any, path: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.get("type") != "text":
            raise ChatFormatError("Only user messages may carry image parts.",
                                  f"{path}.content[{j}]")
        texts.append(part.get("text", ""))
    return "".join(texts)


def _text_only_segments(content: Any, path: str) -> list[Segment]:
    return plain(_text_only(content, path))
