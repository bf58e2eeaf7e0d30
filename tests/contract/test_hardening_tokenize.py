"""/tokenize with_pieces makes one tokenizer call for every piece (issue 11, fault 4).

It used to make one worker-thread hop per token (300 KB of text took a minute). The fake
counts its tokenizer calls; each is one hop.
"""

from __future__ import annotations

import httpx

from tests.contract.serving import fake, running
from waste.app import Settings


def test_with_pieces_is_one_tokenizer_call():
    engine = fake()
    text = "the quick brown fox jumps over the lazy dog " * 50
    with running(engine, Settings(fake_engine="builtin")) as (base, _):
        with httpx.Client(base_url=base, timeout=20) as c:
            plain = c.post("/tokenize", json={"content": text}).json()["tokens"]
            before = engine.record.tokenizer_calls
            reply = c.post("/tokenize", json={"content": text, "with_pieces": True})
            assert reply.status_code == 200, reply.text
            pieces = reply.json()["tokens"]
    assert len(plain) > 100
    assert [p["id"] for p in pieces] == plain
    assert "".join(p["piece"] for p in pieces) == text
    assert engine.record.tokenizer_calls - before == 2  # tokenize, then every piece at once
