"""Loading a chat.json: parse, validate, and resolve every marker against the vocabulary.

A container whose tokenizer lacks the XTML markers is addressed through its chat.json
(docs/CHATJSON.md). Every marker is resolved against the real vocabulary at load, because an
unknown one would be encoded as prose. The loaded ``ChatJsonFormat`` lives in
``chatjson.format``, its reply reader in ``chatjson.reply``.
"""

from __future__ import annotations

from typing import Any

import json
import re

from waste.domain.chatjson import glmtools, k2tools
from waste.domain.chatjson.format import ChatJsonFormat
from waste.domain.ports import Vocabulary
from waste.domain.errors import ChatFormatError

PAIR_KEYS = ("system", "user", "assistant", "think")
STRING_KEYS = ("open", "prelude", "stop", "effort", "image", "tools")
TOOL_PROTOCOLS = ("k2", "glm")
KNOWN_KEYS = frozenset(PAIR_KEYS + STRING_KEYS)

# Marker-looking substrings (docs/CHATJSON.md, "Validation at load"), each of which must resolve to
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


def marker_strings(text: str) -> list[str]:
    """The marker-looking substrings of one template string, in order."""
    return _MARKER.findall(text)


def chat_json_markers(chat_json: dict[str, Any]) -> list[str]:
    """Every distinct marker of a chat.json object, in order of appearance (keys in file order).

    The fake engine builds its specials from this (docs/HTTP.md §9.1).
    """
    seen: dict[str, None] = {}
    for value in chat_json.values():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                seen.update(dict.fromkeys(marker_strings(text)))
    if chat_json.get("tools") == "glm":  # the protocol's markers are not in any string
        seen.update(dict.fromkeys(glmtools.TOOL_MARKERS))
    return list(seen)


def single_special(vocab: Vocabulary, text: str) -> int | None:
    ids = vocab.tokenize_markup(text)
    return ids[0] if len(ids) == 1 and ids[0] >= vocab.n_base_vocab else None


def _specials(vocab: Vocabulary, text: str) -> tuple[int, ...]:
    return tuple(i for i in vocab.tokenize_markup(text) if i >= vocab.n_base_vocab)


# -- loading (docs/CHATJSON.md, "Validation at load") ----------------------------------------------

def _parse_object(obj_or_text: dict[str, Any] | str) -> dict[str, Any]:
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
    tools = obj_or_text.get("tools")
    if tools is not None and tools not in TOOL_PROTOCOLS:
        raise ChatFormatError(f"chat.json 'tools' must be one of {', '.join(TOOL_PROTOCOLS)}, "
                              f"not {tools!r}.")
    return obj_or_text


def _check_markers(obj: dict[str, Any], vocab: Vocabulary) -> None:
    for key, value in obj.items():
        for text in value if isinstance(value, list) else [value]:
            for marker in marker_strings(text):
                if single_special(vocab, marker) is None:
                    raise ChatFormatError(
                        f"chat.json {key!r}: the marker {marker!r} (in {text!r}) is not a single "
                        "special token of this tokenizer; it would be read as prose.")


def _resolve_k2_tools(vocab: Vocabulary) -> k2tools.ToolMarkerIds | None:
    if any(single_special(vocab, m) is None for m in k2tools.TURN_MARKERS):
        return None
    found = [single_special(vocab, m) for m in k2tools.TOOL_MARKERS]
    ids = [i for i in found if i is not None]
    return k2tools.ToolMarkerIds(*ids) if len(ids) == len(found) else None


def _resolve_glm_tools(vocab: Vocabulary) -> glmtools.GlmMarkerIds:
    found = {m: single_special(vocab, m) for m in glmtools.TOOL_MARKERS}
    missing = [m for m, i in found.items() if i is None]
    if missing:
        raise ChatFormatError(f"chat.json 'tools': 'glm' needs GLM's tool markers as single special "
                              f"tokens; this tokenizer lacks {', '.join(missing)}.")
    return glmtools.GlmMarkerIds(*(i for i in found.values() if i is not None))


def _resolve_tools(protocol: str | None, vocab: Vocabulary
                   ) -> tuple[k2tools.ToolMarkerIds | None, glmtools.GlmMarkerIds | None]:
    if protocol == "glm":
        return None, _resolve_glm_tools(vocab)
    k2 = _resolve_k2_tools(vocab)
    if protocol == "k2" and k2 is None:
        raise ChatFormatError("chat.json 'tools': 'k2' needs the five Kimi K2 tool markers and "
                              "<|im_system|>, <|im_middle|>, <|im_end|> as single special tokens.")
    return k2, None


def load_chat_format(obj_or_text: dict[str, Any] | str, vocab: Vocabulary, *,
                     image_placeholder_id: int | None = None) -> ChatJsonFormat:
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
    k2_ids, glm_ids = _resolve_tools(obj.get("tools"), vocab)
    if glm_ids is not None and glm_ids.observation not in stop_ids:
        stop_ids += (glm_ids.observation,)  # GLM ends a calling turn with <|observation|>
    think_ids: tuple[int, int] | None = None
    if "think" in obj:
        opener, closer = (single_special(vocab, marker) for marker in obj["think"])
        if opener is None or closer is None or opener == closer:
            raise ChatFormatError(f"chat.json 'think': {obj['think']!r} must be two distinct "
                                  "markers, each a single special token.")
        think_ids = (opener, closer)
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
    return ChatJsonFormat(
        system=tuple(obj["system"]), user=tuple(obj["user"]), assistant=tuple(obj["assistant"]),
        open=obj["open"], prelude=obj.get("prelude", ""), stop=stop,
        think=tuple(obj["think"]) if "think" in obj else None, effort_template=effort,
        image_block=image, stop_ids=stop_ids, think_ids=think_ids,
        tool_marker_ids=k2_ids, glm_marker_ids=glm_ids, n_base_vocab=vocab.n_base_vocab)
