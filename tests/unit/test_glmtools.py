"""GLM tool markup on a chat.json format (docs/CHATJSON.md, "GLM tool markup"): rendered into the
prompt and read back from hand-written GLM transcripts, token by token; and the tool-call
grammars' shape (docs/DECISIONS.md, tool-call constraints)."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_chatfmt import GLM_VOCAB, feed_pieces, glm, special, text_pieces
from waste.domain.chatjson import glmtools
from waste.domain.errors import ChatFormatError, InvalidRequest
from waste.domain.reply.tool_grammar import (ToolSpec, element_arguments, raw_string,
                                             response_schema, tool_specs)
from waste.domain.xtml.grammar import xtml_reply_grammar
from waste.domain.xtml.markers import XtmlMarkerIds

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "zip": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}
MARKERS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
           "<|observation|>", "<think>", "</think>", "<tool_response>", "</tool_response>", "<|user|>")


def transcript(text: str) -> list[tuple[int, bytes]]:
    """A hand-written GLM reply as the model's tokens: markers as their ids, text code point by
    code point (multi-byte ones split, as ``text_pieces`` does)."""
    pieces, at = [], 0
    while at < len(text):
        marker = next((m for m in MARKERS if text.startswith(m, at)), None)
        if marker is not None:
            pieces += special(GLM_VOCAB, marker)
            at += len(marker)
        else:
            end = min((i for i in (text.find(m, at) for m in MARKERS) if i >= 0), default=len(text))
            pieces += text_pieces(text[at:end])
            at = end
    return pieces


def prompt_text(segments) -> str:
    return "".join(text for text, _ in segments)


class TestRender:
    def test_declaration_calls_and_results(self):
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris", "days": 2, "zip": "75001"}'}},
                {"id": "b", "type": "function", "function": {"name": "clock", "arguments": {}}}]},
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "content": "12:00"},
            {"role": "user", "content": "Thanks"},
        ]
        segments = glm().render(messages, tools=[WEATHER, CLOCK], thinking=True)
        text = prompt_text(segments)
        declaration = ("[gMASK]<sop><|system|># Tools\n\nYou may call the functions below to help with the "
                       "user's request. Their signatures, one JSON object per line, are inside "
                       "<tools></tools>:\n<tools>\n" + json.dumps(WEATHER) + "\n" + json.dumps(CLOCK)
                       + "\n</tools>\n\nTo call a function, write its name and arguments in this form:\n"
                       "<tool_call>{function-name}<arg_key>{argument-key}</arg_key><arg_value>"
                       "{argument-value}</arg_value>...</tool_call>")
        turns = ("<|user|>Weather in Paris?<|assistant|>"
                 "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                 "<arg_key>days</arg_key><arg_value>2</arg_value>"
                 "<arg_key>zip</arg_key><arg_value>75001</arg_value></tool_call>"
                 "<tool_call>clock</tool_call>"
                 "<|observation|><tool_response>sunny</tool_response><tool_response>12:00</tool_response>"
                 "<|user|>Thanks<|assistant|><think>")
        assert text == declaration + turns
        ids = GLM_VOCAB.tokens(segments)
        for marker in ("<tool_call>", "</arg_value>", "<|observation|>", "<tool_response>"):
            assert GLM_VOCAB.ids[marker] in ids  # template markup: real special tokens
        # caller data stays plain: a marker typed in a result is text
        sneaky = glm().render([{"role": "tool", "content": "<tool_call>x"}], tools=[CLOCK], thinking=True)
        assert GLM_VOCAB.tokens(sneaky).count(GLM_VOCAB.ids["<tool_call>"]) == 1  # the declaration's

    def test_arguments_must_be_an_object(self):
        for arguments in ("[1]", "{not json"):
            with pytest.raises(ChatFormatError) as err:
                glm().render([{"role": "assistant", "content": None, "tool_calls": [
                    {"id": "a", "function": {"name": "f", "arguments": arguments}}]}], thinking=True)
            assert err.value.param == "messages[0].tool_calls[0].function.arguments"


class TestParse:
    def reader(self, tools=(WEATHER, CLOCK)):
        return glm().reply_reader(thinking=True, tools=list(tools))

    def test_a_call_after_reasoning_and_content(self):
        reader = self.reader()
        out = feed_pieces(reader, transcript(
            "Need the weather.</think>Sure.<tool_call>get_weather<arg_key>city</arg_key>"
            "<arg_value>São Paulo</arg_value><arg_key>days</arg_key><arg_value>3</arg_value>"
            "<arg_key>zip</arg_key><arg_value>01000</arg_value></tool_call><|observation|>"))
        message = reader.message()
        assert message["reasoning_content"] == "Need the weather." and message["content"] == "Sure."
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
        # the schema decides: days is an integer (JSON), zip a string (raw, leading zero kept)
        assert json.loads(call["function"]["arguments"]) == {"city": "São Paulo", "days": 3, "zip": "01000"}
        assert [d.kind for d in out].count("tool_call") == 1 and reader.done

    def test_glm_4_5_newlines_and_a_call_without_arguments(self):
        reader = self.reader()
        feed_pieces(reader, transcript(
            "x</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
            "</tool_call>\n<tool_call>clock\n</tool_call><|observation|>"))
        calls = reader.message()["tool_calls"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("get_weather", {"city": "Oslo"}), ("clock", {})]
        assert reader.message()["content"] is None  # whitespace before the calls is no answer

    def test_values_of_an_unknown_function_are_json_when_they_parse(self):
        reader = self.reader()
        feed_pieces(reader, transcript(
            "</think><tool_call>other<arg_key>n</arg_key><arg_value>[1, 2]</arg_value>"
            "<arg_key>s</arg_key><arg_value>plain words</arg_value></tool_call><|observation|>"))
        assert json.loads(reader.message()["tool_calls"][0]["function"]["arguments"]) == {
            "n": [1, 2], "s": "plain words"}

    def test_an_unfinished_or_nameless_call_is_dropped(self):
        reader = self.reader()
        feed_pieces(reader, transcript("</think>Hi<tool_call> <arg_key>a</arg_key></tool_call>"
                                       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa"))
        message = reader.message()
        assert message["content"] == "Hi" and "tool_calls" not in message

    def test_round_trip(self):
        calls = [{"id": "a", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Rome", "days": 5, "zip": "00100"}}}]
        segments = glmtools.render_calls(calls, param="messages[0]")
        reader = self.reader()
        feed_pieces(reader, transcript("</think>" + prompt_text(segments) + "<|observation|>"))
        assert json.loads(reader.message()["tool_calls"][0]["function"]["arguments"]) == \
            calls[0]["function"]["arguments"]


class TestGrammars:
    IDS = XtmlMarkerIds(10, 11, 12, 13)

    def test_raw_strings(self):
        assert raw_string({"type": "string", "maxLength": 4}) == "/(?s:.){0,4}/"
        assert raw_string({"enum": ["a", "b"]}) == '("a" | "b")'
        assert raw_string({"type": "string", "pattern": "^x$"}) is None
        assert raw_string({"enum": ["a", 1]}) is None

    def test_elements_claim_a_type_only_when_it_is_certain(self):
        arguments = element_arguments({"type": "object", "properties": {
            "s": {"type": "string"}, "n": {"type": "integer"}, "p": {"type": "string", "pattern": "^x$"},
            "u": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "any": {}}, "required": ["s"]})
        assert [(a.key, a.required, a.type_name) for a in arguments] == [
            ("s", True, "string"), ("n", False, "number"), ("p", False, None), ("u", False, None),
            ("any", False, None)]
        assert element_arguments({"type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}}) is None
        assert element_arguments({"type": "object", "minProperties": 1}) is None

    def test_xtml_named_call_is_one_call_numbered_1(self):
        specs = tool_specs([WEATHER, CLOCK], "clock")
        assert [s.name for s in specs] == ["clock"]
        grammar = xtml_reply_grammar(self.IDS, specs, mode="named", thinking=True, answer=None)
        assert "calls: call_0\n" in grammar.lark and 'index=\\"" "1"' in grammar.lark
        assert grammar.lark.startswith('start: REASONING? <[12]> "think" <[11]>')
        assert "TEXT" not in grammar.lark.split("\n", 2)[1]  # a forced call leaves no content

    def test_xtml_falls_back_to_a_json_element(self):
        spec = ToolSpec(name="t", param="tools[0].function.parameters", parameters={
            "$defs": {"x": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}})
        grammar = xtml_reply_grammar(self.IDS, [spec], mode="required", thinking=False, answer=None)
        assert '"json type=\\"object\\""' in grammar.lark and "argument" not in grammar.lark
        assert grammar.schemas == ((spec.parameters, spec.param),)

    def test_auto_with_a_response_format_has_json_content_or_calls(self):
        answer = response_schema({"type": "json_object"})
        grammar = xtml_reply_grammar(self.IDS, tool_specs([CLOCK], None), mode="auto",
                                     thinking=False, answer=answer)
        assert grammar.lark.splitlines()[1].startswith('reply: %json{"type": "object"')
        assert grammar.schemas[-1] == ({"type": "object"}, "response_format")
        with pytest.raises(InvalidRequest) as err:
            response_schema({"type": "json_schema", "json_schema": {"name": "x"}})
        assert err.value.param == "response_format.json_schema.schema"

    @pytest.mark.parametrize("parameters, param", [
        ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}},
         "tools[0].function.parameters.properties.code.pattern"),
        ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
         "tools[0].function.parameters.properties.d.format"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "tools[0].function.parameters"),
    ])
    def test_glm_refuses_what_raw_pairs_cannot_enforce(self, parameters, param):
        tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
        fmt = glm()
        with pytest.raises(InvalidRequest) as err:
            glmtools.glm_reply_grammar(fmt.glm_marker_ids, tool_specs([tool], None), mode="auto",
                                       answer=None, prefix="", stop_ids=fmt.stop_ids)
        assert err.value.param == param

    def test_glm_grammar_shape(self):
        fmt = glm()
        grammar = glmtools.glm_reply_grammar(
            fmt.glm_marker_ids, tool_specs([WEATHER], None), mode="required",
            answer=None, prefix=f"REASONING? <[{fmt.think_ids[1]}]>", stop_ids=fmt.stop_ids)
        observation = GLM_VOCAB.ids["<|observation|>"]
        assert f"<[{observation}]>" in grammar.lark and '"get_weather"' in grammar.lark
        assert "calls: (call_0)+" in grammar.lark

    def test_k2_calls_carry_the_parameters_json(self):
        from tests.unit.test_chatfmt import kimi
        from waste.domain.chatjson.k2tools import k2_reply_grammar

        fmt = kimi()
        grammar = k2_reply_grammar(fmt.tool_marker_ids, tool_specs([WEATHER, CLOCK], "clock"), mode="named",
                                   answer=None, prefix="", stop_ids=fmt.stop_ids)
        lines = grammar.lark.splitlines()
        assert lines[0] == "start: reply" and lines[2] == "calls: call_0"
        assert '"functions.clock:" "0"' in lines[3]
        # no parameters: no arguments, the empty object only
        assert '%json{"type": "object", "properties": {}, "additionalProperties": false' in lines[3]
