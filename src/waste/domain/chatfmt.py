"""chat.json formats: loading and validating one, rendering a prompt with it, choosing XTML or it.

A container whose tokenizer lacks the XTML markers is addressed through its chat.json
(chatjson.md). Capabilities are read from the file and the vocabulary, never assumed; every
marker is resolved against the real vocabulary at load, because an unknown one would be
encoded as prose. The reply side lives in ``chatfmt_reply``; the K2 tool protocol in
``kimitools``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

import attrs

from waste.domain import kimitools
from waste.domain.chatfmt_reply import ChatReplyReader
from waste.domain.engine import Vocabulary
from waste.domain.errors import ChatFormatError
from waste.domain.segments import Segment, markup, plain

XTML_MARKERS = ("<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>")
PAIR_KEYS = ("system", "user", "assistant", "think")
STRING_KEYS = ("open", "prelude", "stop", "effort", "image")
KNOWN_KEYS = frozenset(PAIR_KEYS + STRING_KEYS)

# Marker-looking substrings (chatjson.md, "Validation at load"), each of which must resolve to
# exactly one special token:
# - "<|" through the nearest following "|>", whatever lies between (spaces, "|", newlines), so
#   "<|im end|>" and "<|a|b|>" are candidates, not prose. A "<|" that no "|>" closes before
#   the next "<|" (or the string's end) is a candidate too, up to there: "<|im_end>" is a typo
#   the tokenizer would read as text, which is exactly what this check exists to catch.
# - the same with DeepSeek's full-width "<｜" … "｜>";
# - a tag: "<", a letter, then word characters, ":" or "-", an optional "/", ">" (<think>,
#   </think>, <sop>);
# - a bracketed word: "[", a letter, word characters, "]" ([gMASK]).
_MARKER = re.compile(
    r"<\|(?:(?!<\|).)*?(?:\|>|(?=<\|)|\Z)"
    r"|<｜(?:(?!<｜).)*?(?:｜>|(?=<｜)|\Z)"
    r"|</?[A-Za-z][\w:-]*/?>"
    r"|\[[A-Za-z]\w*\]",
    re.DOTALL)
EFFORTS_ON = ("low", "high", "max")
EFFORTS_OFF = ("none", "minimal", "off")


def marker_strings(text: str) -> list[str]:
    """The marker-looking substrings of one template string, in order."""
    return _MARKER.findall(text)


def chat_json_markers(chat_json: dict) -> list[str]:
    """Every distinct marker of a chat.json object, in order of appearance (keys in file order).

    The fake engine builds its specials from this (http.md §9.1).
    """
    seen: dict[str, None] = {}
    for value in chat_json.values():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                seen.update(dict.fromkeys(marker_strings(text)))
    return list(seen)


def _single_special(vocab: Vocabulary, text: str) -> int | None:
    ids = vocab.tokenize_markup(text)
    return ids[0] if len(ids) == 1 and ids[0] >= vocab.n_base_vocab else None


def _specials(vocab: Vocabulary, text: str) -> tuple[int, ...]:
    return tuple(i for i in vocab.tokenize_markup(text) if i >= vocab.n_base_vocab)


@attrs.frozen(kw_only=True)
class ChatFormat:
    """A validated chat.json, with the ids its markers resolved to. Build with ``load_chat_format``.

    Capabilities: ``reasoning`` (a think channel), ``always_open`` (``open`` ends with the
    channel's open marker, as GLM's does), ``effort``, ``images``, ``tools`` (all five K2
    tool markers and the three K2 turn markers resolve). ``stop_ids`` are the control tokens
    that end a generated turn: those of ``stop`` when given, else of the assistant suffix.
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
    tool_marker_ids: kimitools.ToolMarkerIds | None = None
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
        return self.tool_marker_ids is not None

    # -- request-time capability checks (http.md §2.5) ---------------------------------------

    def check_request(
        self, *, thinking_explicit: bool | None, effort: str | None, tools_nonempty: bool,
        tool_choice: str | dict | None, response_format_type: str | None, has_images: bool,
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
        effort_on, effort_off = effort in EFFORTS_ON, effort in EFFORTS_OFF
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
        if tool_choice == "required" or isinstance(tool_choice, dict):
            raise ChatFormatError(
                "A chat.json format cannot force a tool call; use tool_choice \"auto\" or "
                "\"none\".", "tool_choice")
        if response_format_type in ("json_object", "json_schema"):
            raise ChatFormatError(
                f"A chat.json format cannot instruct a {response_format_type} response; "
                "use response_format type \"text\".", "response_format")
        if has_images and not self.images:
            raise ChatFormatError(
                "This model's chat format has no image block; image parts cannot be sent to it.",
                image_param)

    # -- rendering (chatjson.md, "Rendering") ------------------------------------------------

    def render(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
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
            ChatFormatError: something ``check_request`` refuses (a caller bug), or an image
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
            segments += kimitools.render_declaration(tools)
        call_ids = kimitools.CallIds()
        for index, message in enumerate(messages):
            segments += self._render_message(message, f"messages[{index}]", call_ids,
                                             image_prompt)
        return segments + markup(self.open)

    def _render_message(self, message: dict, path: str, call_ids: kimitools.CallIds,
                        image_prompt: str | None) -> list[Segment]:
        role = message.get("role")
        if role == "tool":
            self._require_tools(f"{path}.role")
            text = _text_only(message.get("content"), path)
            return kimitools.render_result(text, call_ids.answer(message.get("tool_call_id")),
                                           message.get("name"))
        if role == "assistant":
            return self._render_assistant(message, path, call_ids)
        if role not in ("system", "user"):
            raise ChatFormatError(f"{path}.role {role!r} has no turn in this chat format.",
                                  f"{path}.role")
        prefix, suffix = self.system if role == "system" else self.user
        return [*markup(prefix), *self._content(message.get("content"), path, image_prompt),
                *markup(suffix)]

    def _render_assistant(self, message: dict, path: str, call_ids: kimitools.CallIds
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
            segments += kimitools.render_calls(calls, call_ids.assign(calls), param=path)
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

    def reply_reader(self, *, thinking: bool) -> ChatReplyReader:
        """A fresh reader for one generated turn.

        Reasoning starts at once when the prompt opened the channel (``always_open``; thinking
        is then necessarily on, ``check_request`` refuses it off), or when the model opens it
        itself before anything else. ``thinking`` is accepted for the XTML parser's signature;
        the prompt, not the flag, decides where the model's output starts.
        """
        del thinking
        calls = (kimitools.CallSectionReader(self.tool_marker_ids)
                 if self.tool_marker_ids is not None else None)
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


# -- loading (chatjson.md, "Validation at load") ----------------------------------------------

def _parse_object(obj_or_text: dict | str) -> dict:
    if isinstance(obj_or_text, str):
        try:
            obj_or_text = json.loads(obj_or_text)
        except ValueError as err:
            raise ChatFormatError(f"chat.json is not valid JSON: {err}") from None
    if not isinstance(obj_or_text, dict):
        raise ChatFormatError("chat.json must be a JSON object, not "
                              f"{type(obj_or_text).__name__}.")
    unknown = sorted(set(obj_or_text) - KNOWN_KEYS)
    if unknown:
        raise ChatFormatError(f"chat.json has unknown key(s) {', '.join(map(repr, unknown))}; "
                              f"known keys are {', '.join(sorted(KNOWN_KEYS))}.")
    for key in ("system", "user", "assistant", "open"):
        if key not in obj_or_text:
            raise ChatFormatError(f"chat.json has no {key!r}; serving needs system, user, "
                                  "assistant and open.")
    for key, value in obj_or_text.items():
        if key in PAIR_KEYS:
            if not (isinstance(value, list) and len(value) == 2
                    and all(isinstance(v, str) for v in value)):
                raise ChatFormatError(
                    f"chat.json {key!r} must be a list of two strings [prefix, suffix], "
                    f"not {json.dumps(value, default=repr)}.")
        elif not isinstance(value, str):
            raise ChatFormatError(
                f"chat.json {key!r} must be a string, not {json.dumps(value, default=repr)}.")
    return obj_or_text


def _check_markers(obj: dict, vocab: Vocabulary) -> None:
    for key, value in obj.items():
        for text in value if isinstance(value, list) else [value]:
            for marker in marker_strings(text):
                if _single_special(vocab, marker) is None:
                    raise ChatFormatError(
                        f"chat.json {key!r}: the marker {marker!r} (in {text!r}) is not a single "
                        "special token of this tokenizer; it would be read as prose.")


def _resolve_k2_tools(vocab: Vocabulary) -> kimitools.ToolMarkerIds | None:
    if any(_single_special(vocab, m) is None for m in kimitools.TURN_MARKERS):
        return None
    ids = [_single_special(vocab, m) for m in kimitools.TOOL_MARKERS]
    return None if None in ids else kimitools.ToolMarkerIds(*ids)


def load_chat_format(obj_or_text: dict | str, vocab: Vocabulary, *,
                     image_placeholder_id: int | None = None) -> ChatFormat:
    """Parse and validate a chat.json against the vocabulary it will be tokenized with.

    Args:
        obj_or_text: the chat.json object, or its text.
        vocab: the container's tokenizer (``tokenize_markup``, ``n_base_vocab``).
        image_placeholder_id: the token the engine expands into an image's positions
            (``ModelInfo.media_placeholder_id``); an ``image`` block must hold it exactly once.

    Raises:
        ChatFormatError: naming the key and the offending string.
    """
    obj = _parse_object(obj_or_text)
    _check_markers(obj, vocab)
    if not obj["open"]:
        raise ChatFormatError("chat.json 'open' is empty; nothing would hand the model the floor.")
    stop = obj.get("stop")
    end_key, end_text = ("stop", stop) if stop is not None else ("assistant", obj["assistant"][1])
    stop_ids = _specials(vocab, end_text)
    if not stop_ids:
        raise ChatFormatError(
            f"chat.json {end_key!r}: {end_text!r} holds no control token, so a generated turn "
            "could never end; give the assistant suffix a control token, or a 'stop'.")
    think_ids = None
    if "think" in obj:
        think_ids = tuple(_single_special(vocab, marker) for marker in obj["think"])
        if None in think_ids or think_ids[0] == think_ids[1]:
            raise ChatFormatError(f"chat.json 'think': {obj['think']!r} must be two distinct "
                                  "markers, each a single special token.")
    effort = obj.get("effort")
    if effort is not None and effort.count("{}") != 1:
        raise ChatFormatError(f"chat.json 'effort': {effort!r} must hold exactly one '{{}}'.")
    image = obj.get("image")
    if image is not None:
        if image_placeholder_id is None:
            raise ChatFormatError(f"chat.json 'image': {image!r} cannot carry an image; this "
                                  "tokenizer has no media placeholder token.")
        count = vocab.tokenize_markup(image).count(image_placeholder_id)
        if count != 1:
            raise ChatFormatError(f"chat.json 'image': {image!r} must hold exactly one image "
                                  f"placeholder token (id {image_placeholder_id}); it holds "
                                  f"{count}.")
    return ChatFormat(
        system=tuple(obj["system"]), user=tuple(obj["user"]), assistant=tuple(obj["assistant"]),
        open=obj["open"], prelude=obj.get("prelude", ""), stop=stop,
        think=tuple(obj["think"]) if "think" in obj else None, effort_template=effort,
        image_block=image, stop_ids=stop_ids, think_ids=think_ids,
        tool_marker_ids=_resolve_k2_tools(vocab), n_base_vocab=vocab.n_base_vocab)


# -- choosing a format at startup -------------------------------------------------------------

@attrs.frozen(kw_only=True)
class ChatFormatSelection:
    """Which chat format a container is served with. ``kind`` is None when neither works;
    ``error`` then names both reasons."""

    kind: str | None
    xtml_marker_ids: tuple[int, int, int, int] | None = None
    chat_format: ChatFormat | None = None
    error: str | None = None


def select_chat_format(vocab: Vocabulary, chat_json_text: str | None, *,
                       image_placeholder_id: int | None = None) -> ChatFormatSelection:
    """XTML when all four of its markers are single special tokens, else the chat.json.

    An unusable container is not an exception: it still serves the routes that need no chat
    format, so the reasons come back in ``error``. Only ``vocab.tokenize_markup`` may raise.

    Args:
        vocab: the container's tokenizer.
        chat_json_text: the container's chat.json text, or None when it has none.
        image_placeholder_id: see ``load_chat_format``.
    """
    xtml_ids = [_single_special(vocab, marker) for marker in XTML_MARKERS]
    if None not in xtml_ids:
        return ChatFormatSelection(kind="xtml", xtml_marker_ids=tuple(xtml_ids))
    missing = ", ".join(m for m, i in zip(XTML_MARKERS, xtml_ids) if i is None)
    if chat_json_text is None:
        why_not_chat_json = "the container has no chat.json"
    else:
        try:
            chat_format = load_chat_format(chat_json_text, vocab,
                                           image_placeholder_id=image_placeholder_id)
        except ChatFormatError as err:
            why_not_chat_json = err.message.rstrip(".")
        else:
            return ChatFormatSelection(kind="chat.json", chat_format=chat_format)
    return ChatFormatSelection(
        kind=None,
        error=f"No usable chat format: the tokenizer lacks the XTML marker(s) {missing} as "
              f"single tokens, and {why_not_chat_json}.")
