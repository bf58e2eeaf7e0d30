"""The K3 reply parser (docs/XTML.md §6): the worked example, malformed output, chunking, round trips.

Hand-written renders use the spec's notation (⟦o⟧ ⟦s⟧ ⟦c⟧ ⟦e⟧ markup, ``·`` between plain
segments) so they are checked against the document, not against our renderer. The round trip
uses ``render_segments`` and a tiny fake tokenizer: one id per marker, one per character.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from waste.domain.xtml.markers import XtmlMarkerIds
from waste.domain.xtml.reply import RegionParser
from waste.domain.reply.events import Delta
from waste.domain.segments import Segment
from waste.domain.xtml.render import render_segments

# K3's ids (docs/XTML.md §1); the parser only needs them to be the marker ids it was given.
IDS = XtmlMarkerIds(open=163587, sep=163589, close=163588, end_of_msg=163586)
MARKER_TEXT = {"o": "<|open|>", "s": "<|sep|>", "c": "<|close|>", "e": "<|end_of_msg|>"}
ID_OF = {"<|open|>": IDS.open, "<|sep|>": IDS.sep, "<|close|>": IDS.close,
         "<|end_of_msg|>": IDS.end_of_msg}
MARKERS = tuple(ID_OF)


# ---- helpers ------------------------------------------------------------------------------

def xtml(notation: str) -> list[Segment]:
    """Segments from the spec's notation: ⟦x⟧ is a marker, ``·`` separates plain segments."""
    segments = []
    for piece in re.split(r"(⟦[osce]⟧)", notation):
        if piece.startswith("⟦"):
            segments.append(Segment(MARKER_TEXT[piece[1]], True))
        else:
            segments.extend(Segment(text, False) for text in piece.split("·") if text)
    return segments


def char_tokens(segments: list[Segment]) -> list[tuple[int, bytes | str]]:
    """The fake tokenizer: a marker is one id; plain text is one token per character."""
    tokens: list[tuple[int, bytes | str]] = []
    for segment in segments:
        if segment.markup:
            tokens.append((ID_OF[segment.text], segment.text.encode()))
        else:
            tokens.extend((ord(ch) % 150_000, ch) for ch in segment.text)
    return tokens


def byte_tokens(segments: list[Segment]) -> list[tuple[int, bytes | str]]:
    """As ``char_tokens``, but one token per UTF-8 byte, so characters are split."""
    tokens: list[tuple[int, bytes | str]] = []
    for segment in segments:
        if segment.markup:
            tokens.append((ID_OF[segment.text], segment.text.encode()))
        else:
            tokens.extend((byte, bytes([byte])) for byte in segment.text.encode())
    return tokens


def new_parser(thinking: bool) -> RegionParser:
    counter = itertools.count()
    return RegionParser(thinking=thinking, marker_ids=IDS,
                        call_id_factory=lambda: f"call_{next(counter)}")


def check_deltas(parser: RegionParser, deltas: list[Delta]) -> None:
    """Streaming deltas concatenate to the final fields; calls go out once, in order."""
    for delta in deltas:
        assert delta.kind in ("reasoning", "content", "tool_call")
        if delta.kind != "tool_call":
            assert delta.text
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == parser.reasoning
    assert "".join(d.text for d in deltas if d.kind == "content") == parser.content
    calls = [d for d in deltas if d.kind == "tool_call"]
    assert [d.index for d in calls] == list(range(len(calls)))
    assert [d.call for d in calls] == parser.tool_calls


def by_tokens(tokens, thinking: bool) -> RegionParser:
    parser = new_parser(thinking)
    deltas = []
    for token_id, piece in tokens:
        deltas += parser.feed_token(token_id, piece)
    deltas += parser.finish()
    check_deltas(parser, deltas)
    return parser


def by_text(chunks, thinking: bool) -> RegionParser:
    parser = new_parser(thinking)
    deltas = []
    for chunk in chunks:
        deltas += parser.feed(chunk)
    deltas += parser.finish()
    check_deltas(parser, deltas)
    for delta in deltas:
        assert not any(m in delta.text for m in MARKERS)
    return parser


def outcome(parser: RegionParser) -> tuple:
    return parser.message(), parser.done, parser.ended_by_marker


def text_of(segments: list[Segment]) -> str:
    return "".join(s.text for s in segments)


def parse_both(notation: str, thinking: bool) -> dict:
    """Parse a hand-written reply by id and by text; both must agree. Returns the message."""
    segments = xtml(notation)
    parser = by_tokens(char_tokens(segments), thinking)
    assert outcome(by_text([text_of(segments)], thinking)) == outcome(parser)
    return parser.message()


def every_split_agrees(text: str, thinking: bool) -> None:
    whole = outcome(by_text([text], thinking))
    for i in range(len(text) + 1):
        assert outcome(by_text([text[:i], text[i:]], thinking)) == whole, i
    assert outcome(by_text(list(text), thinking)) == whole


# ---- the worked example (§6) --------------------------------------------------------------

EXAMPLE = ("Need weather.⟦c⟧think⟦s⟧⟦o⟧response⟦s⟧⟦c⟧response⟦s⟧⟦o⟧tools⟦s⟧"
           "⟦o⟧call· tool·=\"·get_weather·\"· index·=\"·1·\"⟦s⟧"
           "⟦o⟧argument· key·=\"·city·\"· type·=\"·string·\"⟦s⟧Paris⟦c⟧argument⟦s⟧"
           "⟦o⟧argument· key·=\"·days·\"· type·=\"·number·\"⟦s⟧3⟦c⟧argument⟦s⟧"
           "⟦c⟧call⟦s⟧⟦c⟧tools⟦s⟧⟦c⟧message⟦s⟧⟦e⟧")


def test_worked_example():
    parser = by_tokens(char_tokens(xtml(EXAMPLE)), thinking=True)
    assert parser.message() == {
        "role": "assistant", "content": None, "reasoning_content": "Need weather.",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]}
    assert parser.done and parser.ended_by_marker
    assert parser.reasoning_tokens == len("Need weather.")  # header tokens excluded


def test_worked_example_under_every_text_split():
    every_split_agrees(text_of(xtml(EXAMPLE)), thinking=True)


def test_streaming_order_of_the_worked_example():
    parser = new_parser(True)
    kinds = []
    for token_id, piece in char_tokens(xtml(EXAMPLE)):
        kinds += [(d.kind, d.text) for d in parser.feed_token(token_id, piece)]
        if parser.done:
            break
    assert parser.done
    assert kinds[0] == ("reasoning", "N") and kinds[-1][0] == "tool_call"


def test_default_call_ids_are_unique_call_hex():
    parser = RegionParser(thinking=False)
    parser.feed('<|open|>call tool="a"<|sep|><|close|>call<|sep|>'
                '<|open|>call tool="b"<|sep|><|close|>call<|sep|>')
    ids = [call.id for call in parser.tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids) and ids[0] != ids[1]


# ---- malformed output (§6 "Malformed input") ----------------------------------------------

@pytest.mark.parametrize("notation, thinking, content, reasoning, calls, ended", [
    # the spec's three
    ("Hi⟦c⟧resp", False, "Hi", None, [], False),
    ("a⟦c⟧call⟦s⟧b", False, "ab", None, [], False),
    ("ok⟦c⟧response⟦s⟧⟦o⟧tools⟦s⟧⟦o⟧call tool=\"f\"⟦s⟧⟦o⟧argument key=\"k\"⟦s⟧[1, 2",
     False, "ok", None, [], False),
    # unterminated regions keep their text
    ("still thinking", True, "", "still thinking", [], False),
    ("r⟦c⟧think⟦s⟧⟦o⟧response⟦s⟧half an ans", True, "half an ans", "r", [], False),
    # stray closes and unknown tags are dropped; their headers never show
    ("a⟦c⟧think⟦s⟧b⟦c⟧tools⟦s⟧c⟦c⟧argument⟦s⟧d", False, "abcd", None, [], False),
    ("a⟦o⟧bogus x=\"1\"⟦s⟧b⟦o⟧think⟦s⟧c⟦o⟧message role=\"user\"⟦s⟧d", False, "abcd", None, [],
     False),
    ("a⟦o⟧argument key=\"k\"⟦s⟧b", False, "ab", None, [], False),  # argument outside a call
    # a sep with no pending tag is dropped
    ("a⟦s⟧b⟦s⟧⟦s⟧c", False, "abc", None, [], False),
    # a pending tag is dropped by open, close and end
    ("a⟦o⟧respo⟦o⟧tools⟦s⟧lost⟦c⟧tools⟦s⟧b", False, "ab", None, [], False),
    ("x⟦c⟧thi⟦c⟧think⟦s⟧y", True, "y", "x", [], False),
    ("x⟦c⟧think⟦c⟧response⟦s⟧y", True, "", "xy", [], False),
    ("a⟦c⟧respon⟦e⟧after", False, "a", None, [], True),
    # close message and end-of-message end the reply from any state; later text is ignored
    ("a⟦c⟧message⟦s⟧b⟦e⟧c", False, "a", None, [], True),
    ("th⟦c⟧message⟦s⟧", True, "", "th", [], True),
    ("⟦o⟧tools⟦s⟧⟦o⟧call tool=\"f\"⟦s⟧⟦o⟧argument key=\"k\"⟦s⟧1⟦c⟧message⟦s⟧", False, "",
     None, [], True),
    ("⟦o⟧call tool=\"f\"⟦s⟧⟦e⟧", False, "", None, [], True),
    # TOP: whitespace-only stretches dropped, anything else kept unstripped
    ("a⟦c⟧response⟦s⟧\n \n⟦c⟧message⟦s⟧", False, "a", None, [], True),
    ("a⟦c⟧response⟦s⟧\n  b \n⟦c⟧message⟦s⟧", False, "a\n  b \n", None, [], True),
    ("r⟦c⟧think⟦s⟧\n\n⟦o⟧response⟦s⟧ c ", True, " c ", "r", [], False),
    ("r⟦c⟧think⟦s⟧\n\nno response tag\n", True, "\n\nno response tag\n", "r", [], False),
    ("a⟦c⟧response⟦s⟧ ⟦o⟧odd⟦s⟧ \t⟦c⟧message⟦s⟧", False, "a", None, [], True),
    # every return to TOP starts a new stretch
    ("a⟦c⟧response⟦s⟧x⟦o⟧tools⟦s⟧⟦c⟧tools⟦s⟧\n⟦c⟧message⟦s⟧", False, "ax", None, [], True),
    # text directly in TOOLS and CALL is dropped
    ("⟦o⟧tools⟦s⟧chat⟦o⟧call tool=\"f\"⟦s⟧more⟦c⟧call⟦s⟧tail⟦c⟧tools⟦s⟧", False, "", None,
     [("f", "{}")], False),
    # a call implies tools from TOP, THINK and RESPONSE
    ("c⟦o⟧call tool=\"f\"⟦s⟧⟦c⟧call⟦s⟧", False, "c", None, [("f", "{}")], False),
    ("r⟦o⟧call tool=\"f\"⟦s⟧⟦c⟧call⟦s⟧", True, "", "r", [("f", "{}")], False),
    # an open argument or json is kept when the call closes
    ("⟦o⟧call tool=\"f\"⟦s⟧⟦o⟧argument key=\"k\" type=\"string\"⟦s⟧v⟦c⟧call⟦s⟧", False, "",
     None, [("f", '{"k": "v"}')], False),
    ("⟦o⟧call tool=\"f\"⟦s⟧⟦o⟧json type=\"object\"⟦s⟧{\"a\":1}⟦c⟧call⟦s⟧", False, "", None,
     [("f", '{"a": 1}')], False),
    # a call with no tool attribute is dropped; index is ignored
    ("⟦o⟧call index=\"1\"⟦s⟧⟦c⟧call⟦s⟧⟦o⟧call index=\"9\" tool=\"g\"⟦s⟧⟦c⟧call⟦s⟧", False, "",
     None, [("g", "{}")], False),
    # a second open call inside a call is an unexpected tag, dropped
    ("⟦o⟧call tool=\"f\"⟦s⟧⟦o⟧call tool=\"g\"⟦s⟧⟦c⟧call⟦s⟧", False, "", None, [("f", "{}")],
     False),
])
def test_malformed(notation, thinking, content, reasoning, calls, ended):
    message = parse_both(notation, thinking)
    expected_content = None if content == "" and calls else content
    assert message["content"] == expected_content
    assert message.get("reasoning_content") == reasoning
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in
           message.get("tool_calls", [])]
    assert got == calls
    parser = by_tokens(char_tokens(xtml(notation)), thinking)
    assert parser.ended_by_marker is ended and parser.done is ended
    every_split_agrees(text_of(xtml(notation)), thinking)


@pytest.mark.parametrize("element, arguments", [
    ('argument key="s" type="string"⟦s⟧ 007 ', '{"s": " 007 "}'),
    ('argument key="n" type="number"⟦s⟧007', '{"n": "007"}'),  # not JSON: kept as text
    ('argument key="n" type="number"⟦s⟧ 1.5e-07 ', '{"n": 1.5e-07}'),
    ('argument key="n"⟦s⟧[1, {"a": null}]', '{"n": [1, {"a": null}]}'),  # no type: JSON
    ('argument key="n" type="string"⟦s⟧true', '{"n": "true"}'),
    ('argument key="b" type="boolean"⟦s⟧true', '{"b": true}'),
    ('argument key="x" type="number"⟦s⟧NaN', '{"x": "NaN"}'),  # strict: no NaN
    ('argument key="x" type="number"⟦s⟧-Infinity', '{"x": "-Infinity"}'),
    ('argument key="x" type="number"⟦s⟧1e999', '{"x": "1e999"}'),  # overflows: not JSON
    ('argument key="x" type="object"⟦s⟧{"a": "\\ud800"}', '{"x": "{\\"a\\": \\"\\\\ud800\\"}"}'),
    ('argument key="u" type="string"⟦s⟧é\n"q"', '{"u": "é\\n\\"q\\""}'),
    ('argument type="string"⟦s⟧keyless', '{}'),
    ('argument key="" type="string"⟦s⟧', '{"": ""}'),
    ('argument key="a&quot;b&amp;quot;" type="string"⟦s⟧v', '{"a\\"b&quot;": "v"}'),
    ('argument key="k" type="string"⟦s⟧1⟦c⟧argument⟦s⟧⟦o⟧argument key="j"⟦s⟧2⟦c⟧argument⟦s⟧'
     '⟦o⟧argument key="k" type="number"⟦s⟧3', '{"k": 3, "j": 2}'),  # repeat replaces in place
    ('json type="object"⟦s⟧{"b":1,"a":[true]}', '{"b": 1, "a": [true]}'),
    ('json type="object"⟦s⟧{"tz": ', '{"tz": '),  # not JSON: verbatim
    ('json type="object"⟦s⟧[1, 2]', '[1, 2]'),  # JSON but not an object: verbatim
    ('json type="object"⟦s⟧{"a": NaN}', '{"a": NaN}'),
    ('json⟦s⟧{"a":1}⟦c⟧json⟦s⟧⟦o⟧json⟦s⟧{"b":2}', '{"a": 1}'),  # the first json wins
    ('argument key="k" type="string"⟦s⟧v⟦c⟧argument⟦s⟧⟦o⟧json⟦s⟧{"j":1}', '{"j": 1}'),
])
def test_call_arguments(element, arguments):
    notation = f"⟦o⟧call tool=\"f\"⟦s⟧⟦o⟧{element}⟦c⟧call⟦s⟧"
    message = parse_both(notation, thinking=False)
    assert message["tool_calls"][0]["function"]["arguments"] == arguments


def test_attributes_unescape_quot_before_amp():
    message = parse_both('⟦o⟧call index="1" tool="a&quot;b&amp;quot;c&amp;amp;"⟦s⟧⟦c⟧call⟦s⟧',
                         thinking=False)
    assert message["tool_calls"][0]["function"]["name"] == 'a"b&quot;c&amp;'


def test_a_repeated_attribute_keeps_its_first_value():
    # Unspecified by docs/XTML.md; reading left to right, the first pair found is the one used.
    message = parse_both('⟦o⟧call tool="a" tool="b"⟦s⟧⟦c⟧call⟦s⟧', thinking=False)
    assert message["tool_calls"][0]["function"]["name"] == "a"


def test_deep_nesting_never_raises():
    deep = "[" * 100_000 + "]" * 100_000
    message = parse_both(f'⟦o⟧call tool="f"⟦s⟧⟦o⟧argument key="d"⟦s⟧{deep}⟦c⟧call⟦s⟧',
                         thinking=False)
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"d": deep}


def test_spelled_out_markers_stay_text_when_fed_by_id():
    # The model writes the characters of a marker in ordinary tokens: no structure.
    spelled = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    segments = [Segment("see ", False), Segment(spelled, False)]
    parser = by_tokens(char_tokens(segments), thinking=False)
    assert parser.content == "see " + spelled
    assert not parser.done
    # Whole multi-character pieces, too.
    parser = by_tokens([(1, "see "), (2, "<|sep|>"), (3, b"<|close|>")], thinking=False)
    assert parser.content == "see <|sep|><|close|>" and not parser.done


def test_text_mode_cannot_tell_and_holds_partial_markers():
    parser = new_parser(False)
    assert parser.feed("a<|cl") == [Delta(kind="content", text="a")]
    assert parser.feed("ose") == []
    assert parser.feed("|>response<") == []
    assert parser.feed("|sep|> ") == []  # TOP whitespace is held until it is not all whitespace
    assert parser.feed("tail") == [Delta(kind="content", text=" tail")]
    assert parser.finish() == []
    assert parser.content == "a tail"


@pytest.mark.parametrize("text, content", [
    ("Hi<|clo", "Hi<|clo"),  # cut mid-marker: the held tail becomes text
    ("Hi<", "Hi<"),
    ("Hi<|close|>resp", "Hi"),  # cut mid-header: the pending tag is dropped
    ("a<|<|sep|>b<|x|>", "a<|b<|x|>"),
    ("<|open|<|sep|>", "<|open|"),
])
def test_text_mode_endings(text, content):
    assert by_text([text], thinking=False).content == content
    every_split_agrees(text, thinking=False)


def test_split_utf8_pieces():
    parser = new_parser(False)
    euro = "€".encode()
    assert parser.feed_token(1, euro[:1]) == []
    assert parser.feed_token(2, euro[1:2]) == []
    assert parser.feed_token(3, euro[2:] + b"x") == [Delta(kind="content", text="€x")]
    # Invalid bytes become U+FFFD; a character cut by a marker or by the end too.
    assert parser.feed_token(4, b"\xff") == [Delta(kind="content", text="\ufffd")]
    assert parser.feed_token(5, euro[:2]) == []
    assert parser.feed_token(IDS.close, b"<|close|>") == [Delta(kind="content", text="\ufffd")]
    parser.feed_token(6, b"response")
    parser.feed_token(IDS.sep, b"<|sep|>")
    assert parser.feed_token(7, "é".encode()[:1]) == []
    assert parser.finish() == [Delta(kind="content", text="\ufffd")]
    assert parser.content == "€x\ufffd\ufffd\ufffd"  # the last one is TOP text


def test_reasoning_tokens_count_think_text_tokens_only():
    segments = xtml("ab⟦c⟧think⟦s⟧⟦o⟧response⟦s⟧cd")
    parser = by_tokens(char_tokens(segments), thinking=True)
    assert parser.reasoning_tokens == 2
    assert by_tokens(char_tokens(xtml("ab")), thinking=False).reasoning_tokens == 0


def test_message_shapes():
    parser = by_text([""], thinking=True)
    assert parser.message() == {"role": "assistant", "content": ""}
    assert not parser.done and not parser.ended_by_marker
    parser = by_text(['<|open|>call tool="f"<|sep|><|close|>call<|sep|>'], thinking=False)
    assert parser.message()["content"] is None
    parser = by_text(['x<|open|>call tool="f"<|sep|><|close|>call<|sep|>'], thinking=False)
    assert parser.message()["content"] == "x"


def test_feeding_after_finish_is_ignored():
    parser = new_parser(False)
    parser.feed("a")
    parser.finish()
    assert parser.feed("b") == [] and parser.feed_token(1, "c") == [] and parser.finish() == []
    assert parser.content == "a"


def test_feed_token_needs_marker_ids():
    with pytest.raises(ValueError, match="marker_ids"):
        RegionParser(thinking=False).feed_token(1, b"x")


# ---- chunking and id/text agreement on arbitrary output -----------------------------------

FRAGMENTS = ["<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "<", "<|", "|>", "<|cl",
             "<|end_of", "think", "response", "tools", "call", "argument", "json", "message",
             ' tool="f"', ' key="k"', ' type="string"', ' type="number"', ' type="object"',
             "1", "x", " ", "\n", "é", "€", '"', "{", "}", "&quot;"]
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(pieces=st.lists(st.sampled_from(FRAGMENTS), max_size=40), thinking=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_feed_is_independent_of_chunking(pieces, thinking, cuts):
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert outcome(by_text(chunks, thinking)) == outcome(by_text([text], thinking))


def _plain_runs_spell_markers(segments: list[Segment]) -> bool:
    runs = [list(g) for markup, g in itertools.groupby(segments, key=lambda s: s.markup)
            if not markup]
    return any(m in text_of(run) for run in runs for m in MARKERS)


@SETTINGS
@given(segments=st.lists(st.one_of(
    st.sampled_from(MARKERS).map(lambda m: Segment(m, True)),
    st.sampled_from(FRAGMENTS[4:]).map(lambda t: Segment(t, False)),
    st.text(min_size=1, max_size=5).map(lambda t: Segment(t, False))), max_size=40),
    thinking=st.booleans())
def test_ids_and_text_agree_when_nothing_is_spelled_out(segments, thinking):
    assume(not _plain_runs_spell_markers(segments))
    expected = outcome(by_text([text_of(segments)], thinking))
    assert outcome(by_tokens(char_tokens(segments), thinking)) == expected
    assert outcome(by_tokens(byte_tokens(segments), thinking)) == expected


# ---- round trip: whatever the renderer writes, the parser reads back (§6) -----------------

def generation_prompt(thinking: bool) -> list[Segment]:
    """§3.6, written out by hand."""
    return xtml(f'⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧{"think" if thinking else "response"}⟦s⟧')


def reply_of(message: dict, thinking: bool) -> list[Segment]:
    """The render of one assistant message, minus its leading generation prompt."""
    segments = render_segments([message], thinking=thinking, add_generation_prompt=False)
    prompt = generation_prompt(thinking)
    assert segments[:len(prompt)] == prompt
    return segments[len(prompt):]


def expected_reading(message: dict, thinking: bool) -> dict:
    """What the parser must give back, derived from docs/XTML.md §3.5, not from the renderer."""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if not thinking or reasoning is None or not str(reasoning).strip():
        reasoning = ""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part["text"] for part in content)
    calls = []
    for entry in message.get("tool_calls") or []:
        function = entry.get("function", entry)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                calls.append((function["name"], arguments))  # raw: verbatim
                continue
        calls.append((function["name"], json.dumps(arguments or {}, ensure_ascii=False)))
    return {"reasoning": reasoning, "content": content or "", "calls": calls}


def check_round_trip(message: dict, thinking: bool, every_split: bool = True,
                     note=lambda label: None) -> None:
    expected = expected_reading(message, thinking)
    segments = reply_of(message, thinking)
    readings = [by_tokens(char_tokens(segments), thinking),
                by_tokens(byte_tokens(segments), thinking)]
    text = text_of(segments)
    note(f"{len(expected['calls'])} calls")
    if any(not arguments.startswith("{") for _, arguments in expected["calls"]):
        note("a raw json element")
    if _plain_runs_spell_markers(segments):
        note("spells out a marker: by id only")
    else:
        readings.append(by_text([text], thinking))
        if every_split:
            readings += [by_text([text[:i], text[i:]], thinking) for i in range(len(text) + 1)]
    for parser in readings:
        assert parser.reasoning == expected["reasoning"]
        assert parser.content == expected["content"]
        assert [(c.name, c.arguments) for c in parser.tool_calls] == expected["calls"]
        assert parser.done and parser.ended_by_marker
        out = parser.message()
        assert out["content"] == (None if not expected["content"] and expected["calls"]
                                  else expected["content"])
        assert ("reasoning_content" in out) == bool(expected["reasoning"])
        assert ("tool_calls" in out) == bool(expected["calls"])


E7_ARGUMENTS = ('{"s": "Oslo", "n": 1e2, "b": false, "z": null, "o": {"y": 1, "b": "é"}, '
                '"a": [1, 2]}')
E7 = {"role": "assistant", "content": "On it.", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": E7_ARGUMENTS}},
    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"tz": '}},
    {"id": "c3", "type": "function", "function": {"name": "h", "arguments": ""}}]}


def test_e7_hand_written_render_reads_back():
    # docs/XTML.md §4 E7, exactly as the spec writes it: independent of our renderer.
    reply = ("On it.⟦c⟧response⟦s⟧⟦o⟧tools⟦s⟧"
             '⟦o⟧call· tool·="·f·"· index·="·1·"⟦s⟧'
             '⟦o⟧argument· key·="·s·"· type·="·string·"⟦s⟧Oslo⟦c⟧argument⟦s⟧'
             '⟦o⟧argument· key·="·n·"· type·="·number·"⟦s⟧100.0⟦c⟧argument⟦s⟧'
             '⟦o⟧argument· key·="·b·"· type·="·boolean·"⟦s⟧false⟦c⟧argument⟦s⟧'
             '⟦o⟧argument· key·="·z·"· type·="·null·"⟦s⟧null⟦c⟧argument⟦s⟧'
             '⟦o⟧argument· key·="·o·"· type·="·object·"⟦s⟧{"y": 1, "b": "é"}⟦c⟧argument⟦s⟧'
             '⟦o⟧argument· key·="·a·"· type·="·array·"⟦s⟧[1, 2]⟦c⟧argument⟦s⟧⟦c⟧call⟦s⟧'
             '⟦o⟧call· tool·="·g·"· index·="·2·"⟦s⟧⟦o⟧json· type·="·object·"⟦s⟧{"tz": '
             "⟦c⟧json⟦s⟧⟦c⟧call⟦s⟧"
             '⟦o⟧call· tool·="·h·"· index·="·3·"⟦s⟧⟦c⟧call⟦s⟧⟦c⟧tools⟦s⟧⟦c⟧message⟦s⟧⟦e⟧')
    parser = by_tokens(char_tokens(xtml(reply)), thinking=False)
    assert parser.content == "On it."
    calls = [(c.name, c.arguments) for c in parser.tool_calls]
    assert calls == expected_reading(E7, thinking=False)["calls"]
    assert reply_of(E7, thinking=False) == xtml(reply)  # and the renderer agrees with the spec
    every_split_agrees(text_of(xtml(reply)), thinking=False)


@pytest.mark.parametrize("message", [
    E7,
    {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
    {"role": "assistant", "content": None, "reasoning_content": " \n"},
    {"role": "assistant", "content": "", "reasoning": "  spaced  \n", "tool_calls": [
        {"function": {"name": "", "arguments": {"": "", "q": 'say "<|sep|>" & go'}}}]},
    {"role": "assistant", "content": [{"type": "text", "text": "one "},
                                      {"type": "text", "text": "two"}]},
    {"role": "assistant", "content": "<|close|>message<|sep|><|end_of_msg|>",
     "reasoning_content": "<|close|>think<|sep|>"},
    {"role": "assistant", "content": "x", "tool_calls": [
        {"type": "function", "function": {"name": 'a"b&c', "arguments": '{"k": 1, "k": [2]}'}},
        {"name": "flat", "arguments": None}]},
])
@pytest.mark.parametrize("thinking", [True, False])
def test_round_trip_examples(message, thinking):
    check_round_trip(message, thinking)


TRICKY = ["<|", "<", "|>", "<|sep", "<|close|", '"', "&quot;", "&amp;", "&", " ", "\n", "\t", "é",
          "€", "😀", "<|kimi_image_placeholder|>", "\\u0041", "{", "}"]


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return bool(text.strip())
    return False


def assistant_messages(spelled_markers: bool) -> st.SearchStrategy[dict]:
    """Assistant messages the renderer can express; with ``spelled_markers``, plain text may
    contain whole marker strings (then only feeding by id can read it back)."""
    tricky = TRICKY + list(MARKERS) if spelled_markers else TRICKY
    texts = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(tricky)),
                     max_size=4).map("".join)
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                        st.floats(allow_nan=False, allow_infinity=False), texts)
    values = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)), max_leaves=6)
    objects = st.dictionaries(texts, values, max_size=4)
    arguments = st.one_of(
        st.none(), st.just({}), objects,
        objects.map(lambda obj: json.dumps(obj, ensure_ascii=False)),
        objects.map(json.dumps),  # \uXXXX escapes, surrogate pairs included
        st.sampled_from(["", "  ", "\n\t"]),
        texts.filter(_not_json),  # the raw-json case
        objects.filter(bool).map(lambda obj: json.dumps(obj)[:-1]),  # cut short: raw too
    )
    calls = st.lists(st.builds(
        lambda name, arguments, flat: ({"name": name, "arguments": arguments} if flat else
                                       {"id": "x", "type": "function",
                                        "function": {"name": name, "arguments": arguments}}),
        texts, arguments, st.booleans()), max_size=3)
    contents = st.one_of(st.none(), texts, st.lists(
        texts.filter(bool).map(lambda t: {"type": "text", "text": t}), max_size=3))

    @st.composite
    def messages(draw) -> dict:
        message = {"role": "assistant", "content": draw(contents)}
        reasoning_key = draw(st.sampled_from([None, "reasoning_content", "reasoning"]))
        if reasoning_key:
            message[reasoning_key] = draw(texts)
        drawn = draw(calls)
        if drawn or draw(st.booleans()):
            message["tool_calls"] = drawn
        return message

    return messages()


any_assistant_message = st.one_of(assistant_messages(False), assistant_messages(True))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=any_assistant_message, thinking=st.booleans())
def test_round_trip_whole_and_by_tokens(message, thinking):
    check_round_trip(message, thinking, every_split=False, note=event)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=assistant_messages(False), thinking=st.booleans())
def test_round_trip_every_split(message, thinking):
    check_round_trip(message, thinking, every_split=True, note=event)
