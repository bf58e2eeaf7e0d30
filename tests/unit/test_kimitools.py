"""The Kimi K2 tool protocol: declaration, calls, results, id rewriting, and reading calls back.

The grammar comes from docs/CHATJSON.md; test_chatfmt.TestAgainstUpstream checks the whole render
against K2's own chat_template.jinja when ``K2_DIR`` names a release directory.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waste.domain.chatjson import k2tools as kt
from waste.domain.errors import KimiToolError
from waste.domain.reply.events import ToolCall
from waste.domain.segments import Segment

# Kimi's own ids for the five markers (docs/CHATJSON.md), so a test reads like a real reply.
MARKER_IDS = kt.ToolMarkerIds(163595, 163596, 163597, 163598, 163599)
MARKER_ID_BY_TEXT = dict(zip(kt.TOOL_MARKERS, [163595, 163596, 163597, 163598, 163599]))

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Météo d'une ville",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def seg(text: str, markup: bool) -> Segment:
    return Segment(text, markup)


def feed_segments(reader: kt.CallSectionReader, segments: list[Segment]) -> list:
    """Feed segments the way a host would: markers by id, plain text one character at a time."""
    outcomes = []
    for text, is_markup in segments:
        if is_markup and text in MARKER_ID_BY_TEXT:
            outcomes += reader.feed_marker(MARKER_ID_BY_TEXT[text])
        else:
            assert not is_markup, f"unexpected markup {text!r} in a call section"
            for char in text:
                reader.feed_text(char)
    return outcomes


class TestDeclaration:
    def test_compact_json_key_order_and_non_ascii_kept(self):
        tools = [{"type": "function", "function": {"name": "z", "description": "é",
                                                   "parameters": {"b": 1, "a": [1, 2]}}}]
        assert kt.render_declaration(tools) == [
            seg("<|im_system|>tool_declare<|im_middle|>", True),
            seg('[{"type":"function","function":{"name":"z","description":"é",'
                '"parameters":{"b":1,"a":[1,2]}}}]', False),
            seg("<|im_end|>", True),
        ]


class TestArguments:
    @pytest.mark.parametrize("arguments, text", [
        ('{"city": "Paris"}', '{"city": "Paris"}'),  # a string is carried verbatim
        ({"city": "Zürich", "days": 3}, '{"city":"Zürich","days":3}'),  # an object, compact
        (None, "{}"),
        ("not json at all", "not json at all"),  # unparseable renders raw (docs/HTTP.md §2.3)
        ('{"x": NaN}', '{"x": NaN}'),  # NaN is not JSON: unparseable, raw
    ])
    def test_rendered_text(self, arguments, text):
        assert kt.parse_call_arguments(arguments) == text

    @pytest.mark.parametrize("arguments", ["[1, 2]", "5", "null", '"x"', "true"])
    def test_json_that_is_not_an_object_is_refused(self, arguments):
        with pytest.raises(KimiToolError) as err:
            kt.parse_call_arguments(arguments, param="messages[1].tool_calls[0].function.arguments")
        assert err.value.param == "messages[1].tool_calls[0].function.arguments"
        assert "JSON object" in err.value.message

    @pytest.mark.parametrize("arguments", [[1], 5, True, 1.5])
    def test_other_types_are_refused(self, arguments):
        with pytest.raises(KimiToolError):
            kt.parse_call_arguments(arguments, param="p")

    def test_render_calls_raises_with_the_call_path(self):
        calls = [{"id": "a", "function": {"name": "f", "arguments": "{}"}},
                 {"id": "b", "function": {"name": "g", "arguments": "[]"}}]
        with pytest.raises(KimiToolError) as err:
            kt.render_calls(calls, ["functions.f:0", "functions.g:1"], param="messages[3]")
        assert err.value.param == "messages[3].tool_calls[1].function.arguments"


class TestCallsAndResults:
    def test_call_section_grammar(self):
        calls = [{"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                 {"id": "call_2", "type": "function",
                  "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]
        ids = kt.CallIds().assign(calls)
        assert ids == ["functions.get_weather:0", "functions.get_time:1"]
        assert kt.render_calls(calls, ids) == [
            seg("<|tool_calls_section_begin|>", True),
            seg("<|tool_call_begin|>", True), seg("functions.get_weather:0", False),
            seg("<|tool_call_argument_begin|>", True), seg('{"city":"Paris"}', False),
            seg("<|tool_call_end|>", True),
            seg("<|tool_call_begin|>", True), seg("functions.get_time:1", False),
            seg("<|tool_call_argument_begin|>", True), seg('{"tz":"CET"}', False),
            seg("<|tool_call_end|>", True),
            seg("<|tool_calls_section_end|>", True),
        ]

    def test_result_grammar_with_and_without_a_name(self):
        assert kt.render_result("18°C", "functions.get_weather:0", None) == [
            seg("<|im_system|>", True), seg("tool", False), seg("<|im_middle|>", True),
            seg("## Return of functions.get_weather:0\n18°C", False), seg("<|im_end|>", True)]
        assert kt.render_result("x", "functions.f:0", "f")[1] == seg("f", False)

    def test_client_ids_are_rewritten_consistently_with_their_results(self):
        ids = kt.CallIds()
        assigned = ids.assign([{"id": "call_abc", "function": {"name": "f"}},
                               {"id": "call_def", "function": {"name": "g"}}])
        assert assigned == ["functions.f:0", "functions.g:1"]
        # Results may come in any order; each answers the call it names.
        assert ids.answer("call_def") == "functions.g:1"
        assert ids.answer("call_abc") == "functions.f:0"

    def test_indexes_restart_with_each_assistant_turn(self):
        ids = kt.CallIds()
        ids.assign([{"id": "x", "function": {"name": "f"}}])
        assert ids.answer("x") == "functions.f:0"
        assert ids.assign([{"id": "x", "function": {"name": "f"}},
                           {"id": "y", "function": {"name": "f"}}]) == \
            ["functions.f:0", "functions.f:1"]
        assert ids.answer("y") == "functions.f:1"

    def test_every_id_is_rewritten_by_position_and_missing_ids_answer_by_position(self):
        ids = kt.CallIds()
        assigned = ids.assign([{"id": "functions.f:7", "function": {"name": "f"}},
                               {"function": {"name": "g"}},
                               {"id": "functions.other:2", "function": {"name": "h"}}])
        # Even a client id already of the K2 form: IDX is the call's position in the turn.
        assert assigned == ["functions.f:0", "functions.g:1", "functions.h:2"]
        assert ids.answer(None) == "functions.f:0"
        assert ids.answer(None) == "functions.g:1"
        assert ids.answer("functions.other:2") == "functions.h:2"
        assert ids.answer("never-issued") == "never-issued"

    def test_a_k2_form_client_id_cannot_collide_with_a_rewritten_one(self):
        ids = kt.CallIds()
        assigned = ids.assign([{"id": "functions.f:1", "function": {"name": "f"}},
                               {"id": "x", "function": {"name": "f"}}])
        assert assigned == ["functions.f:0", "functions.f:1"]
        assert [ids.answer("x"), ids.answer("functions.f:1")] == assigned[::-1]

    def test_calls_sharing_a_client_id_are_answered_in_turn(self):
        ids = kt.CallIds()
        ids.assign([{"id": "same", "function": {"name": "f"}},
                    {"id": "same", "function": {"name": "f"}}])
        assert [ids.answer("same"), ids.answer("same")] == ["functions.f:0", "functions.f:1"]


class TestCallSectionReader:
    def reader(self) -> kt.CallSectionReader:
        return kt.CallSectionReader(MARKER_IDS)

    def test_complete_call(self):
        reader = self.reader()
        out = feed_segments(reader, [
            seg("<|tool_calls_section_begin|>", True), seg("<|tool_call_begin|>", True),
            seg(" functions.get_weather:0 ", False), seg("<|tool_call_argument_begin|>", True),
            seg('{"city":"Paris","days":3}', False), seg("<|tool_call_end|>", True),
            seg("<|tool_calls_section_end|>", True)])
        assert out == [ToolCall("functions.get_weather:0", "get_weather",
                                '{"city": "Paris", "days": 3}')]
        assert not reader.active

    def test_name_is_between_the_first_dot_and_the_last_colon(self):
        assert kt.name_from_call_id("functions.ns.tool:x:3") == "ns.tool:x"
        assert kt.name_from_call_id("functions.f:0") == "f"
        for bad in ("functions.f", "f:0", "functions.:0", "functions.f:x", ""):
            assert kt.name_from_call_id(bad) is None, bad

    @pytest.mark.parametrize("call_id, arguments", [
        ("functions.f:0", "[1, 2]"),          # arguments not an object
        ("functions.f:0", '{"a": '),          # arguments not JSON
        ("functions.f:0", '{"a": NaN}'),      # not RFC 8259 JSON
        ("get_weather", '{"a": 1}'),          # id not of the K2 form
    ])
    def test_malformed_call_is_dropped_and_its_text_kept(self, call_id, arguments):
        reader = self.reader()
        out = feed_segments(reader, [
            seg("<|tool_calls_section_begin|>", True), seg("<|tool_call_begin|>", True),
            seg(call_id, False), seg("<|tool_call_argument_begin|>", True),
            seg(arguments, False), seg("<|tool_call_end|>", True)])
        assert out == [call_id + arguments]

    def test_call_without_argument_marker_is_text(self):
        reader = self.reader()
        out = feed_segments(reader, [seg("<|tool_call_begin|>", True), seg("functions.f:0", False),
                                     seg("<|tool_call_end|>", True)])
        assert out == ["functions.f:0"]

    def test_unfinished_call_is_dropped(self):
        reader = self.reader()
        out = feed_segments(reader, [
            seg("<|tool_calls_section_begin|>", True), seg("<|tool_call_begin|>", True),
            seg("functions.f:0", False), seg("<|tool_call_argument_begin|>", True),
            seg('{"a": 1}', False)])
        reader.finish()
        assert out == [] and not reader.active
        # A stray end marker after the drop completes nothing.
        assert reader.feed_marker(MARKER_IDS.call_end) == []

    def test_a_new_call_drops_an_unfinished_one(self):
        reader = self.reader()
        out = feed_segments(reader, [
            seg("<|tool_call_begin|>", True), seg("functions.f:0", False),
            seg("<|tool_call_argument_begin|>", True), seg('{"a"', False),
            seg("<|tool_call_begin|>", True), seg("functions.g:1", False),
            seg("<|tool_call_argument_begin|>", True), seg("{}", False),
            seg("<|tool_call_end|>", True)])
        assert out == [ToolCall("functions.g:1", "g", "{}")]

    def test_text_between_calls_is_dropped(self):
        reader = self.reader()
        out = feed_segments(reader, [
            seg("<|tool_calls_section_begin|>", True), seg("\n  ", False),
            seg("<|tool_call_begin|>", True), seg("functions.f:0", False),
            seg("<|tool_call_argument_begin|>", True), seg("{}", False),
            seg("<|tool_call_end|>", True), seg("junk", False),
            seg("<|tool_calls_section_end|>", True)])
        assert out == [ToolCall("functions.f:0", "f", "{}")]


_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,12}", fullmatch=True)
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


class TestRoundTrip:
    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(_names, st.dictionaries(st.text(max_size=6), _json, max_size=4),
                              st.booleans()), min_size=1, max_size=3))
    def test_rendered_calls_read_back(self, specs):
        calls = [{"id": f"call_{i}", "type": "function",
                  "function": {"name": name,
                               "arguments": json.dumps(args) if as_string else args}}
                 for i, (name, args, as_string) in enumerate(specs)]
        ids = kt.CallIds().assign(calls)
        reader = kt.CallSectionReader(MARKER_IDS)
        out = feed_segments(reader, kt.render_calls(calls, ids))
        assert [(c.id, c.name, json.loads(c.arguments)) for c in out] == \
            [(f"functions.{name}:{i}", name, args) for i, (name, args, _) in enumerate(specs)]
