"""Reading SSE streams in tests: events as parsed JSON, comments and [DONE] kept visible."""

from __future__ import annotations

import json
from typing import Any

import httpx


def read_events(response: httpx.Response) -> list:
    """All events of a stream: dicts for JSON data, "[DONE]", and ":comment" strings."""
    events, buffer = [], ""
    for text in response.iter_text():
        buffer += text
        while "\n\n" in buffer:
            raw, buffer = buffer.split("\n\n", 1)
            if raw.startswith(":"):
                events.append(raw)
                continue
            assert raw.startswith("data: "), raw
            data = raw[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    assert buffer == "", f"stream ended mid-event: {buffer!r}"
    return events


def stream(client: httpx.Client, path: str, body: dict) -> tuple[httpx.Response, list]:
    with client.stream("POST", path, json=body) as response:
        return response, read_events(response)


def join_deltas(events: list) -> dict:
    """Concatenate chat deltas into a message-like dict, tool calls reassembled by index."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for event in events:
        if not isinstance(event, dict) or not event.get("choices"):
            continue
        choice = event["choices"][0]
        delta = choice["delta"]
        content.append(delta.get("content") or "")
        reasoning.append(delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or []:
            slot = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = call.get("id") or slot["id"]
            fn = call.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return {"content": "".join(content), "reasoning": "".join(reasoning),
            "calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}
