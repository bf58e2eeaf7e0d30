"""The fake engine's reply: read the prompt back (by ids), pick a rule, render its tokens.

The reply is rendered as the container's format would have the model write it: XTML's
assistant turn (xtml.md §3.5) or the chat.json turn, so both server paths parse real markup.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from waste.adapters.fake_script import ReplyRule

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
        return engine.tokenize_markup(rule.raw), rule
    if rule is not None and (rule.content is not None or rule.reasoning is not None or rule.tool_calls):
        reasoning, content, calls = rule.reasoning or "", rule.content or "", rule.tool_calls
    else:
        reasoning, content, calls = "Thinking.", "Echo: " + user_text, ()
    if completion_mode:
        return engine.tokenize(content) + [engine.special_id("[EOS]")], rule
    if engine.script.format == "xtml":
        return _xtml_reply(engine, prompt, reasoning, content, calls), rule
    return _chat_json_reply(engine, prompt, reasoning, content, calls), rule


def _xtml_reply(engine, prompt, reasoning, content, calls) -> list[int]:
    from waste.domain.xtml import render_segments

    thinking = prompt[-7:] == engine.tokenize_markup("<|open|>think<|sep|>")
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
        ids += engine.tokenize(reasoning) + engine.tokenize_markup(think[1])
    ids += engine.tokenize(content)
    if calls and engine.script.k2_tool_markers:
        ids += engine.tokenize_markup("<|tool_calls_section_begin|>")
        for i, (name, args) in enumerate(calls):
            text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            ids += engine.tokenize_markup("<|tool_call_begin|>")
            ids += engine.tokenize(f"functions.{name}:{i}")
            ids += engine.tokenize_markup("<|tool_call_argument_begin|>")
            ids += engine.tokenize(text)
            ids += engine.tokenize_markup("<|tool_call_end|>")
        ids += engine.tokenize_markup("<|tool_calls_section_end|>")
    end = fmt.get("stop") or fmt["assistant"][1]
    return ids + engine.tokenize_markup(end)


def _encode(engine, segments) -> list[int]:
    ids: list[int] = []
    for seg in segments:
        ids += engine.tokenize_markup(seg.text) if seg.markup else engine.tokenize(seg.text)
    return ids


def _last_user_text(engine, prompt: list[int]) -> str:
    """The text of the last user turn, read by ids (user text can never contain a marker id)."""
    if engine.script.format == "xtml":
        opener = engine.tokenize_markup('<|open|>message role="user"<|sep|>')
        closer = {engine.special_id("<|close|>"), engine.special_id("<|open|>")}
    else:
        user = engine.script.chat_json["user"]
        opener = engine.tokenize_markup(user[0])
        closer = set(engine.tokenize_markup(user[1])[:1]) if user[1] else set()
        image_ids = set(engine.tokenize_markup(engine.script.chat_json.get("image") or ""))
        closer |= {t for t in range(engine.n_base_vocab, engine.model_info().vocab)} - image_ids
    start = _rfind(prompt, opener)
    if start < 0:
        return ""
    text, in_image = [], False
    for token in prompt[start + len(opener):]:
        if token in closer and not _is_media(engine, token):
            break
        if _is_media(engine, token):
            in_image = token != engine.special_id("<|media_end|>")
            continue
        if not in_image:
            text.append(engine.token_text(token))
    return "".join(text)


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
