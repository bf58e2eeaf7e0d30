"""The fake engine's reply: read the prompt back (by ids), pick a rule, render its tokens.

The reply is rendered as the container's format would have the model write it: XTML's
assistant turn (xtml.md §3.5) or the chat.json turn, so both server paths parse real markup.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from waste.adapters.fake_script import ReplyRule
from waste.domain.xtml.render import render_segments

if TYPE_CHECKING:
    from waste.adapters.fake import FakeEngine

# The XTML generation prompt is 10 segments: ⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧.
_XTML_GENERATION_PROMPT_SEGMENTS = 10


def plan_reply(engine: "FakeEngine", prompt: list[int]) -> tuple[list[int], ReplyRule | None]:
    """The token ids the fake will generate for ``prompt``, and the rule that chose them."""
    completion_mode = all(t < engine.n_base_vocab for t in prompt)
    prompt_text = "".join(engine.token_text(t) for t in prompt)
    user_text = prompt_text if completion_mode else _last_user_text(engine, prompt)
    rule = next((r for r in engine.script.replies
                 if r.when is None or r.when in user_text or r.when in prompt_text), None)
    if rule is not None and rule.raw is not None:
        return engine.markup_ids(rule.raw), rule
    if rule is not None and (rule.content is not None or rule.reasoning is not None or rule.tool_calls):
        reasoning, content, calls = rule.reasoning or "", rule.content or "", rule.tool_calls
    else:
        reasoning, content, calls = "Thinking.", "Echo: " + user_text, ()
    if completion_mode:
        return engine.text_ids(content) + [engine.special_id("[EOS]")], rule
    if engine.script.format == "xtml":
        return _xtml_reply(engine, prompt, reasoning, content, calls), rule
    return _chat_json_reply(engine, prompt, reasoning, content, calls), rule


def _xtml_reply(engine, prompt, reasoning, content, calls) -> list[int]:
    thinking = prompt[-7:] == engine.markup_ids("<|open|>think<|sep|>")
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls]
    segments = render_segments([message], thinking=thinking, add_generation_prompt=False)
    return _encode(engine, segments[_XTML_GENERATION_PROMPT_SEGMENTS:])


def _chat_json_reply(engine, prompt, reasoning, content, calls) -> list[int]:
    fmt = engine.script.chat_json
    think = fmt.get("think")
    ids: list[int] = []
    if think and engine.special_id(think[0]) is not None and prompt[-1] == engine.special_id(think[0]):
        ids += engine.text_ids(reasoning) + engine.markup_ids(think[1])
    ids += engine.text_ids(content)
    if calls and engine.script.k2_tool_markers:
        ids += engine.markup_ids("<|tool_calls_section_begin|>")
        for i, (name, args) in enumerate(calls):
            text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            ids += engine.markup_ids("<|tool_call_begin|>")
            ids += engine.text_ids(f"functions.{name}:{i}")
            ids += engine.markup_ids("<|tool_call_argument_begin|>")
            ids += engine.text_ids(text)
            ids += engine.markup_ids("<|tool_call_end|>")
        ids += engine.markup_ids("<|tool_calls_section_end|>")
    end = fmt.get("stop") or fmt["assistant"][1]
    return ids + engine.markup_ids(end)


def _encode(engine, segments) -> list[int]:
    ids: list[int] = []
    for seg in segments:
        ids += engine.markup_ids(seg.text) if seg.markup else engine.text_ids(seg.text)
    return ids


def _last_user_text(engine, prompt: list[int]) -> str:
    """The text of the last user turn, read by ids (user text can never contain a marker id)."""
    if engine.script.format == "xtml":
        start = _last_xtml_user_body(engine, prompt)
        closer = {engine.special_id("<|close|>"), engine.special_id("<|open|>")}
    else:
        user = engine.script.chat_json["user"]
        opener = engine.markup_ids(user[0])
        found = _rfind(prompt, opener)
        start = found + len(opener) if found >= 0 else -1
        closer = set(engine.markup_ids(user[1])[:1]) if user[1] else set()
        image_ids = set(engine.markup_ids(engine.script.chat_json.get("image") or ""))
        closer |= {t for t in range(engine.n_base_vocab, engine.model_info().vocab)} - image_ids
    if start < 0:
        return ""
    text, in_image = [], False
    for token in prompt[start:]:
        if token in closer and not _is_media(engine, token):
            break
        if _is_media(engine, token):
            in_image = token != engine.special_id("<|media_end|>")
            continue
        if not in_image:
            text.append(engine.token_text(token))
    return "".join(text)


_ATTRIBUTE = re.compile(r' ([A-Za-z_][\w-]*)="([^"]*)"')


def _last_xtml_user_body(engine, prompt: list[int]) -> int:
    """Where the last ``⟦o⟧message role="user" …⟦s⟧`` header's body starts, or -1.

    The header is parsed (any attributes, in any order: a ``name`` included), not matched
    as one fixed opener.
    """
    open_id, sep_id = engine.special_id("<|open|>"), engine.special_id("<|sep|>")
    body = -1
    for i, token in enumerate(prompt):
        if token != open_id:
            continue
        try:
            sep = prompt.index(sep_id, i + 1)
        except ValueError:
            break
        header = "".join(engine.token_text(t) for t in prompt[i + 1:sep])
        tag, _, _ = header.partition(" ")
        if tag == "message" and dict(_ATTRIBUTE.findall(header[len(tag):])).get("role") == "user":
            body = sep + 1
    return body


def _is_media(engine, token: int) -> bool:
    return engine.script.format == "xtml" and token in {
        engine.special_id(t) for t in ("<|media_begin|>", "<|media_content|>", "<|media_pad|>",
                                       "<|media_end|>", "<|kimi_image_placeholder|>")}


def _rfind(haystack: list[int], needle: list[int]) -> int:
    n = len(needle)
    for i in range(len(haystack) - n, -1, -1):
        if haystack[i:i + n] == needle:
            return i
    return -1
