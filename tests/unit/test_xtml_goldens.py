"""The K3 renderer against goldens produced by the release's own ``encoding_k3.py``.

Every case is compared segment for segment (text and markup flag), and every refusal by
upstream's exception class name and message text (docs/XTML.md §1, §2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from waste.domain.errors import XTMLError
from waste.domain.xtml.render import render_segments

FIXTURE = Path(__file__).parent / "fixtures" / "xtml_goldens.json"
GOLDENS = json.loads(FIXTURE.read_text(encoding="utf-8"))
RENDERED = [case for case in GOLDENS["cases"] if "segments" in case]
REFUSED = [case for case in GOLDENS["cases"] if "error" in case]

# docs/XTML.md names the reference: moonshotai/Kimi-K3 at this revision, sha256 b9cb7ae1…6f5333.
UPSTREAM_REVISION = "9f62e4e9fffbd0a83ddd60e1c209d828994b3569"


def test_fixture_claims_upstream_provenance():
    meta = GOLDENS["meta"]
    assert "encoding_k3.py" in meta["generated_by"]
    assert UPSTREAM_REVISION in meta["generated_by"]
    assert meta["upstream_present"] is True, "goldens were not produced by the upstream encoder"
    assert meta["upstream_sha256"].startswith("b9cb7ae1")
    assert meta["upstream_sha256"].endswith("6f5333")
    assert len(meta["upstream_sha256"]) == 64


def test_fixture_has_both_kinds_of_case():
    assert len(RENDERED) >= 40
    assert {case["error"] for case in REFUSED} >= {"AssertionError", "ValueError"}
    names = [case["name"] for case in GOLDENS["cases"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", RENDERED, ids=[case["name"] for case in RENDERED])
def test_golden_segments(case):
    segments = render_segments(**case["input"])
    assert [list(segment) for segment in segments] == case["segments"]


@pytest.mark.parametrize("case", REFUSED, ids=[case["name"] for case in REFUSED])
def test_golden_refusal(case):
    with pytest.raises(XTMLError) as caught:
        render_segments(**case["input"])
    assert caught.value.kind == case["error"]
    assert str(caught.value) == case["message"]
