"""The demo model's only window on ``waste.domain``: the server's request parser, its XTML
renderer and its by-token reply parser.

Training prompts and targets are made here with exactly the code the server runs, so what the
model learns is byte for byte what it will be sent and what the server will parse. Every
``waste.domain`` import of the demo tools is in this module.
"""

from __future__ import annotations

from typing import Callable, Sequence

from waste.domain.requests.parse import parse_chat_request
from waste.domain.segments import Segment
from waste.domain.xtml.format import XtmlFormat
from waste.domain.xtml.markers import STRUCTURE as XTML_MARKERS
from waste.domain.xtml.markers import XtmlMarkerIds
from waste.domain.xtml.render import render_segments
from waste.domain.xtml.reply import RegionParser

__all__ = ["XTML_MARKERS", "Segment", "parse_reply", "plain_texts", "prompt_segments",
           "reply_segments"]

# Rendering never looks at marker ids (only the reply reader does); these stand in for them.
_RENDER_ONLY = XtmlFormat(marker_ids=XtmlMarkerIds(-1, -2, -3, -4))


def prompt_segments(body: dict) -> tuple[list[Segment], bool]:
    """The prompt the server renders for the chat request ``body`` and whether thinking is on
    (the server default: on, effort ``max`` unless the body says otherwise)."""
    plan = _RENDER_ONLY.plan(parse_chat_request(body), default_thinking=True)
    return list(plan.segments), plan.thinking


def reply_segments(message: dict, *, thinking: bool) -> list[Segment]:
    """The segments the model writes for the assistant ``message``: its render without the
    generation prompt it starts with (docs/XTML.md §6 round trip), ending with ``<|end_of_msg|>``."""
    prompt = render_segments([], thinking=thinking)
    whole = render_segments([message], thinking=thinking, add_generation_prompt=False)
    if whole[:len(prompt)] != prompt:
        raise AssertionError("an assistant render must begin with the generation prompt")
    return whole[len(prompt):]


def plain_texts(example) -> list[str]:
    """Every plain segment's text of ``example``'s prompt and reply (the BPE corpus)."""
    prompt, thinking = prompt_segments(example.body)
    reply = reply_segments(example.reply.message(), thinking=thinking)
    return [s.text for s in prompt + reply if not s.markup]


def parse_reply(ids: Sequence[int], piece: Callable[[int], bytes], marker_ids: Sequence[int], *,
                thinking: bool = True) -> tuple[dict, bool]:
    """What the server's reply parser makes of generated ``ids``: (OpenAI message, whether the
    turn ended by its markers)."""
    parser = RegionParser(thinking=thinking, marker_ids=XtmlMarkerIds(*marker_ids),
                          call_id_factory=lambda: "call_demo")
    for token in ids:
        parser.feed_token(token, piece(token))
        if parser.done:
            break
    ended = parser.done
    parser.finish()
    return parser.message(), ended
