"""The fake engine's reply: read the prompt back (by ids), pick a rule, render its tokens.

The reply is rendered as the container's format would have the model write it: XTML's
assistant turn (docs/XTML.md §3.5) or the chat.json turn, so both server paths parse real markup.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from waste.domain.chatjson import k2tools
from waste.domain.segments import Segment
from waste.domain.xtml import markers as xtml
from waste.domain.xtml.render import render_segments

from waste.adapters.fake.script import FakeScript, ReplyRule
from waste.adapters.fake.vocabulary import EOS, FakeVocabulary

# The XTML generation prompt is 10 segments: ⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧.
_XTML_GENERATION_PROMPT_SEGMENTS = 10


def plan_reply(vocab: FakeVocabulary, script: FakeScript,
               prompt: list[int]) -> tuple[list[int], ReplyRule | None]:
    """The token ids the fake will generate for ``prompt``, and the rule that chose them."""
    completion_mode = all(t < vocab.n_base_vocab for t in prompt)
    prompt_text = "".join(vocab.token_text(t) for t in prompt)
    user_text = prompt_text if completion_mode else _last_user_text(vocab, script, prompt)
    rule = next((r for r in script.replies
                 if r.when is None or r.when in user_text or r.when in prompt_text), None)
    if rule is not None and rule.raw is not None:
        return vocab.markup_ids(rule.raw), rule
    if rule is not None and (rule.content is not None or rule.reasoning is not None or rule.tool_calls):
        reasoning, content, calls = rule.reasoning or "", rule.content or "", rule.tool_calls
    else:
        reasoning, content, calls = "Thinking.", "Echo: " + user_text, ()
    if completion_mode:
        return vocab.text_ids(content) + [_special(vocab, EOS)], rule
    if script.format == "xtml":
        return _xtml_reply(vocab, prompt, reasoning, content, calls), rule
    return _chat_json_reply(vocab, script, prompt, reasoning, content, calls), rule


def _xtml_reply(vocab: FakeVocabulary, prompt: list[int], reasoning: str, content: str,
                calls: Sequence[tuple[str, Any]]) -> list[int]:
    thinking = prompt[-7:] == vocab.markup_ids(f"{xtml.OPEN}think{xtml.SEP}")
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls]
    segments = render_segments([message], thinking=thinking, add_generation_prompt=False)
    return _encode(vocab, segments[_XTML_GENERATION_PROMPT_SEGMENTS:])


def _chat_json_reply(vocab: FakeVocabulary, script: FakeScript, prompt: list[int],
                     reasoning: str, content: str,
                     calls: Sequence[tuple[str, Any]]) -> list[int]:
    fmt = script.chat_json or {}
    think = fmt.get("think")
    ids: list[int] = []
    if think and vocab.special_id(think[0]) is not None and prompt[-1] == vocab.special_id(think[0]):
        ids += vocab.text_ids(reasoning) + vocab.markup_ids(think[1])
    ids += vocab.text_ids(content)
    if calls and script.k2_tool_markers:
        ids += vocab.markup_ids(k2tools.SECTION_BEGIN)
        for i, (name, args) in enumerate(calls):
            text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            ids += vocab.markup_ids(k2tools.CALL_BEGIN)
            ids += vocab.text_ids(f"functions.{name}:{i}")
            ids += vocab.markup_ids(k2tools.ARGUMENT_BEGIN)
            ids += vocab.text_ids(text)
            ids += vocab.markup_ids(k2tools.CALL_END)
        ids += vocab.markup_ids(k2tools.SECTION_END)
    end = fmt.get("stop") or fmt["assistant"][1]
    return ids + vocab.markup_ids(end)


def _encode(vocab: FakeVocabulary, segments: Sequence[Segment]) -> list[int]:
    ids: list[int] = []
    for seg in segments:
        ids += vocab.markup_ids(seg.text) if seg.markup else vocab.text_ids(seg.text)
    return ids


def _last_user_text(vocab: FakeVocabulary, script: FakeScript, prompt: list[int]) -> str:
    """The text of the last user turn, read by ids (user text can never contain a marker id)."""
    if script.format == "xtml":
        start = _last_xtml_user_body(vocab, prompt)
        closer = {vocab.special_id(xtml.CLOSE), vocab.special_id(xtml.OPEN)}
    else:
        chat_json = script.chat_json or {}
        user = chat_json["user"]
        opener = vocab.markup_ids(user[0])
        found = _rfind(prompt, opener)
        start = found + len(opener) if found >= 0 else -1
        closer = set(vocab.markup_ids(user[1])[:1]) if user[1] else set()
        image_ids = set(vocab.markup_ids(chat_json.get("image") or ""))
        closer |= {t for t in range(vocab.n_base_vocab, vocab.size)} - image_ids
    if start < 0:
        return ""
    text, in_image = [], False
    for token in prompt[start:]:
        if token in closer and not _is_media(vocab, script, token):
            break
        if _is_media(vocab, script, token):
            in_image = token != vocab.special_id(xtml.MEDIA_END)
            continue
        if not in_image:
            text.append(vocab.token_text(token))
    return "".join(text)


_ATTRIBUTE = re.compile(r' ([A-Za-z_][\w-]*)="([^"]*)"')


def _last_xtml_user_body(vocab: FakeVocabulary, prompt: list[int]) -> int:
    """Where the last ``⟦o⟧message role="user" …⟦s⟧`` header's body starts, or -1.

    The header is parsed (any attributes, in any order: a ``name`` included), not matched
    as one fixed opener.
    """
    open_id, sep_id = _special(vocab, xtml.OPEN), _special(vocab, xtml.SEP)
    body = -1
    for i, token in enumerate(prompt):
        if token != open_id:
            continue
        try:
            sep = prompt.index(sep_id, i + 1)
        except ValueError:
            break
        header = "".join(vocab.token_text(t) for t in prompt[i + 1:sep])
        tag, _, _ = header.partition(" ")
        if tag == "message" and dict(_ATTRIBUTE.findall(header[len(tag):])).get("role") == "user":
            body = sep + 1
    return body


def _is_media(vocab: FakeVocabulary, script: FakeScript, token: int) -> bool:
    return script.format == "xtml" and token in {vocab.special_id(t) for t in xtml.MEDIA}


def _rfind(haystack: list[int], needle: list[int]) -> int:
    n = len(needle)
    for i in range(len(haystack) - n, -1, -1):
        if haystack[i:i + n] == needle:
            return i
    return -1


def _special(vocab: FakeVocabulary, text: str) -> int:
    token = vocab.special_id(text)
    if token is None:
        raise AssertionError(f"the fake vocabulary lacks {text!r}")
    return token
