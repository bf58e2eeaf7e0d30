"""A five-turn chat walked through the server with the prefix cache (docs/HTTP.md §6,
docs/ENGINE.md §2 "Prefix cache"), against each engine: tools declared, a tool exchange in
the history, and an Open-WebUI-style title request between turns.

From turn 2 on, the engine prefills only what it has not evaluated before: the count comes
from the engine itself (libwaste's evaluated positions; the fake's record), and equals the
prompt less the longest stored prefix, computed here from the prompts and replies the
engine saw. Every answer equals the one a server without the cache gives, the title
requests evict nothing of the conversation, and the turns' entries share their latents."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
from tests.contract.engines import serve

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
USER_TURNS = ["Hello! Who are you?", "What is the weather in Paris?",
              "Thanks. And tomorrow?", "Summarise our chat in one line.", "Goodbye."]


def title_request(history: list[dict]) -> dict:
    """Open-WebUI's task request: the history pasted into one user message, not streamed."""
    pasted = "\n".join(f"{m['role'].upper()}: {m.get('content') or ''}" for m in history)
    return {"messages": [{"role": "user", "content":
                          "### Task:\nGenerate a concise, 3-5 word title for the chat.\n"
                          f"<chat_history>\n{pasted}\n</chat_history>"}],
            "stream": False, "max_tokens": 8, "temperature": 0}


def evaluated_positions(served) -> int:
    """The engine's own count of evaluated positions since open."""
    inner = served.engine.inner
    if served.kind == "fake":
        return sum(inner.record.prefilled) + sum(max(0, g - 1) for g in inner.record.generated)
    return int(inner._read_stats_locked().tokens)


def expected_reuse(prompt: list[int], history: list[tuple[list[int], list[int]]]) -> int:
    """The longest prefix a cache that evicted nothing holds: the end of an earlier prompt
    (less one) or of its generation (prompt + reply less its last token)."""
    best = 0
    for earlier, reply in history:
        evaluated = earlier + reply[:-1]
        for point in (len(earlier) - 1, len(evaluated)):
            if point <= len(prompt) - 1 and evaluated[:point] == prompt[:point]:
                best = max(best, point)
    return best


def chat(client: httpx.Client, messages: list[dict], stream: bool) -> tuple[str, dict]:
    body = {"messages": messages, "tools": TOOLS, "temperature": 0, "thinking": False,
            "stream": stream, "stream_options": {"include_usage": True} if stream else None}
    if not stream:
        body.pop("stream_options")
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
        return data["choices"][0]["message"]["content"] or "", data["usage"]
    content: list[str] = []
    usage = None
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                content.append(choice["delta"].get("content") or "")
    assert usage is not None, "the stream sent no usage chunk"
    return "".join(content), usage


def test_a_five_turn_chat_prefills_only_new_tokens(engine_kind, request):
    if engine_kind == "vllm":
        pytest.skip("vLLM's prefix cache is its own (block-granular, counted inside vLLM); "
                    "this test reads our engines' evaluated positions")
    with contextlib.ExitStack() as stack:
        # The pasted titles and tools make prompts of up to ~1,500 tokens on the tiny model.
        cached = stack.enter_context(serve(engine_kind, request, ctx=2048))
        plain = stack.enter_context(serve(engine_kind, request, ctx=2048, prefix_cache=0))
        c = stack.enter_context(httpx.Client(base_url=cached.base, timeout=120))
        p = stack.enter_context(httpx.Client(base_url=plain.base, timeout=120))
        messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
        seen: list[tuple[list[int], list[int]]] = []  # (prompt, reply ids) the engine ran
        for turn, text in enumerate(USER_TURNS, start=1):
            messages.append({"role": "user", "content": text})
            before = evaluated_positions(cached)
            answer, usage = chat(c, messages, stream=True)
            prompt = cached.engine.record.prompts[-1]
            generated = cached.engine.record.generated[-1]
            prefilled = evaluated_positions(cached) - before - max(0, generated - 1)
            reuse = usage["prompt_tokens_details"]["cached_tokens"]
            assert usage["prompt_tokens"] == len(prompt)
            assert prefilled == len(prompt) - reuse, f"turn {turn}"
            assert reuse == expected_reuse(prompt, seen), f"turn {turn}"
            if turn > 1:  # at least the whole previous turn's prompt is reused
                previous_turn = seen[-2]  # seen[-1] is the title request between them
                assert reuse >= len(previous_turn[0]) - 1, f"turn {turn}"
            assert chat(p, messages, stream=True)[0] == answer, f"turn {turn}"
            seen.append((prompt, reply_ids(cached)))
            messages.append({"role": "assistant", "content": answer})
            if turn == 2:  # a tool exchange enters the history
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {
                        "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]})
                messages.append({"role": "tool", "tool_call_id": "call_1",
                                 "content": json.dumps({"forecast": "sunny", "c": 21})})
            title = title_request(messages)
            r = c.post("/v1/chat/completions", json=title)
            assert r.status_code == 200
            assert r.json() == p.post("/v1/chat/completions", json=title).json() | {
                "id": r.json()["id"], "created": r.json()["created"],
                "usage": r.json()["usage"], "waste": r.json()["waste"]}
            seen.append((cached.engine.record.prompts[-1],
                         reply_ids(cached)))
        stats = httpx.get(cached.base + "/v1/models", timeout=10)
        assert stats.status_code == 200
        metrics = httpx.get(cached.base + "/metrics", timeout=10).text
        values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                  if line.startswith("waste_prefix_cache_")}
        assert values["waste_prefix_cache_evictions_total"] == 0  # the titles evicted nothing
        assert values["waste_prefix_cache_entries"] > 0 and values["waste_prefix_cache_bytes"] > 0
        assert values["waste_prefix_cache_reused_tokens_total"] > 0
        # The turns' entries extend one another (docs/FORMAT.md §7.1): shared, not copied.
        inner = cached.engine.inner
        assert any(e.parent is not None for e in inner.prefix_cache)
        assert values["waste_prefix_cache_bytes"] == sum(e.counted for e in inner.prefix_cache)
        if cached.kind == "native":
            stored, as_whole_snapshots = inner.prefix_cache_sharing()
            assert stored < as_whole_snapshots


def reply_ids(served) -> list[int]:
    """The ids the engine delivered in its last generation."""
    return list(served.engine.record.replies[-1])
