"""The fake engine's SCRIPT: parsing and validating docs/HTTP.md §9.1's JSON object.

Kept apart from the engine itself so a bad script is refused at startup with a message
naming the key, before anything is served.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from waste.domain.ports import (BudgetExceeded, EngineError, EngineFormatError, EngineIOError,
                                EngineOutOfMemory, InvalidState)

# A scripted failure's name -> the port's exception the fake raises for it.
SCRIPTED_ERRORS: dict[str, type[EngineError]] = {
    "io": EngineIOError, "format": EngineFormatError, "budget": BudgetExceeded,
    "nomem": EngineOutOfMemory, "state": InvalidState}
_KEYS = {"format", "chat_json", "k2_tool_markers", "image_positions", "load_delay_s",
         "prefill_delay_s", "token_delay_s", "replies", "tokenizer"}
_RULE_KEYS = {"when", "reasoning", "content", "tool_calls", "raw", "error", "after_tokens"}


class ScriptError(ValueError):
    """The fake-engine script is malformed; the message names the key."""


@attrs.frozen(kw_only=True)
class ReplyRule:
    """One scripted reply, applied when ``when`` (if any) occurs in the user text or prompt."""

    when: str | None = None
    reasoning: str | None = None
    content: str | None = None
    tool_calls: tuple[tuple[str, object], ...] = ()
    raw: str | None = None
    error: str | None = None
    after_tokens: int = 0


@attrs.frozen(kw_only=True)
class FakeScript:
    format: str = "xtml"
    chat_json: dict | None = None
    k2_tool_markers: bool = False
    image_positions: int = 4
    load_delay_s: float = 0.0
    prefill_delay_s: float = 0.0
    token_delay_s: float = 0.0
    replies: tuple[ReplyRule, ...] = ()
    tokenizer: bool = True  # false: a container converted without tokenizer files


def load_script(source: str | None) -> FakeScript:
    """``None`` or ``"builtin"`` gives the built-in script; otherwise a path or inline JSON."""
    if source in (None, "", "builtin"):
        return FakeScript()
    text = source if source.lstrip().startswith("{") else Path(source).read_text("utf-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"fake-engine script is not JSON: {exc}") from None
    return parse_script(obj)


def parse_script(obj: object) -> FakeScript:
    if not isinstance(obj, dict):
        raise ScriptError("fake-engine script must be a JSON object")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ScriptError(f"fake-engine script: unknown key {unknown[0]!r}")
    fmt = obj.get("format", "xtml")
    if fmt not in ("xtml", "chat.json", "none"):
        raise ScriptError("fake-engine script: 'format' must be 'xtml', 'chat.json' or 'none'")
    chat_json = obj.get("chat_json")
    if fmt == "chat.json" and not isinstance(chat_json, dict):
        raise ScriptError("fake-engine script: 'chat_json' (an object) is required with format 'chat.json'")
    numbers = {}
    for key in ("image_positions", "load_delay_s", "prefill_delay_s", "token_delay_s"):
        value = obj.get(key, attrs.fields_dict(FakeScript)[key].default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ScriptError(f"fake-engine script: {key!r} must be a non-negative number")
        numbers[key] = value
    if int(numbers["image_positions"]) < 1:
        raise ScriptError("fake-engine script: 'image_positions' must be at least 1")
    replies = obj.get("replies", [])
    if not isinstance(replies, list):
        raise ScriptError("fake-engine script: 'replies' must be a list")
    for key in ("k2_tool_markers", "tokenizer"):
        if key in obj and not isinstance(obj[key], bool):
            raise ScriptError(f"fake-engine script: {key!r} must be true or false")
    return FakeScript(
        format=fmt, chat_json=chat_json if fmt == "chat.json" else None,
        k2_tool_markers=obj.get("k2_tool_markers", False),
        tokenizer=obj.get("tokenizer", True),
        image_positions=int(numbers["image_positions"]),
        load_delay_s=float(numbers["load_delay_s"]),
        prefill_delay_s=float(numbers["prefill_delay_s"]),
        token_delay_s=float(numbers["token_delay_s"]),
        replies=tuple(_parse_rule(r, i) for i, r in enumerate(replies)),
    )


def _parse_rule(rule: object, i: int) -> ReplyRule:
    where = f"fake-engine script: replies[{i}]"
    if not isinstance(rule, dict):
        raise ScriptError(f"{where} must be an object")
    unknown = sorted(set(rule) - _RULE_KEYS)
    if unknown:
        raise ScriptError(f"{where}: unknown key {unknown[0]!r}")
    for key in ("when", "reasoning", "content", "raw"):
        if rule.get(key) is not None and not isinstance(rule[key], str):
            raise ScriptError(f"{where}.{key} must be a string")
    error = rule.get("error")
    if error is not None and error not in SCRIPTED_ERRORS:
        raise ScriptError(f"{where}.error must be one of {sorted(SCRIPTED_ERRORS)}")
    after = rule.get("after_tokens", 0)
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ScriptError(f"{where}.after_tokens must be a non-negative integer")
    calls = []
    for j, call in enumerate(rule.get("tool_calls") or []):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise ScriptError(f"{where}.tool_calls[{j}].name must be a non-empty string")
        args = call.get("arguments", {})
        if not isinstance(args, (dict, str)):
            raise ScriptError(f"{where}.tool_calls[{j}].arguments must be an object or a string")
        calls.append((call["name"], args))
    return ReplyRule(when=rule.get("when"), reasoning=rule.get("reasoning"),
                     content=rule.get("content"), tool_calls=tuple(calls), raw=rule.get("raw"),
                     error=error, after_tokens=after)
