"""Line separators inside SSE JSON (issue 11, fault 8).

U+2028, U+2029 and U+0085 are line breaks to some line splitters (httpx's ``iter_lines``,
Python's ``str.splitlines``); written raw inside ``data:`` JSON they cut an event in two.
"""

from __future__ import annotations

import json

import httpx

from tests.contract.serving import fake, running
from waste.app import Settings

TEXT = "a\u2028b\u2029c\u0085d"


def test_line_separators_are_escaped_in_stream_json():
    engine = fake({"replies": [{"content": TEXT}]})
    with running(engine, Settings(fake_engine="builtin")) as (base, _):
        with httpx.Client(base_url=base, timeout=20) as c, c.stream(
                "POST", "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
            raw = r.read().decode("utf-8")
        for char in "\u2028\u2029\u0085":
            assert char not in raw
        content = ""
        for line in raw.splitlines():  # splits on all three, as line-based clients do
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                content += delta.get("content") or ""
        assert content == TEXT
