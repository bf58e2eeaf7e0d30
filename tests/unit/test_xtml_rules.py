"""The K3 renderer's rules, written from the text of docs/XTML.md §1–§4, not from its own output.

The §4 worked examples are copied verbatim in the spec's ⟦⟧ notation and parsed into
segment lists; the other tables cover rules the upstream goldens may not exercise.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waste.domain.errors import XTMLError
from waste.domain.segments import Segment
from waste.domain.xtml.markers import CLOSE, END_OF_MSG, MEDIA_PLACEHOLDER, OPEN, SEP
from waste.domain.xtml.render import image_prompt, render_segments

PROMPT_A = "<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_end|>"
PROMPT_B = "<|media_begin|>image 32x16<|media_content|><|media_pad|><|media_end|>"
MARKERS = {"o": OPEN, "s": SEP, "c": CLOSE, "e": END_OF_MSG}


def parse(notation: str) -> list[list]:
    """The §1 notation as golden-style pairs: ⟦x⟧ is markup, plain text is split on ``·``.

    Line breaks are only for reading; ``\\n`` inside a plain segment is a newline.
    """
    joined = "".join(notation.strip().splitlines())
    segments: list[list] = []
    for position, chunk in enumerate(re.split(r"⟦(.*?)⟧", joined)):
        if position % 2:
            segments.append([MARKERS.get(chunk, chunk), True])
        elif chunk:
            for piece in chunk.split("·"):
                assert piece, f"an empty plain segment in the notation: {chunk!r}"
                segments.append([piece.replace("\\n", "\n"), False])
    return segments


def render(**kwargs) -> list[list]:
    return [list(segment) for segment in render_segments(**kwargs)]


def refusal(**kwargs) -> tuple[str, str]:
    with pytest.raises(XTMLError) as caught:
        render_segments(**kwargs)
    return caught.value.kind, str(caught.value)


def python_error(operation) -> tuple[str, str]:
    """What Python itself raises for ``operation``: the oracle for upstream's natural errors."""
    try:
        operation()
    except Exception as exc:  # noqa: BLE001 - we want whatever Python raises
        return type(exc).__name__, str(exc)
    raise AssertionError("the probe did not raise")


def messages_of(segments: list[list]) -> list[list[list]]:
    """Split a render into its messages (each ending with ⟦e⟧), dropping the generation prompt."""
    found, current = [], []
    for segment in segments:
        current.append(segment)
        if segment == [END_OF_MSG, True]:
            found.append(current)
            current = []
    return found


def test_parse_notation_by_hand():
    assert parse('⟦o⟧message· role·="·user·"⟦s⟧a\\nb⟦c⟧x⟦s⟧⟦e⟧\n⟦<|media_begin|>⟧') == [
        [OPEN, True], ["message", False], [" role", False], ['="', False], ["user", False],
        ['"', False], [SEP, True], ["a\nb", False], [CLOSE, True], ["x", False], [SEP, True],
        [END_OF_MSG, True], ["<|media_begin|>", True],
    ]


# ---- §4 worked examples, verbatim ----------------------------------------------------------

E_INPUTS = {
    "E1": r'''{"messages":[{"role":"user","content":"Hello"}]}''',
    "E2": r'''{"messages":[{"role":"system","content":"Be brief.","name":"ops"},{"role":"user","content":"Hi","name":"a\"b&c"},{"role":"developer","content":"dropped"}],"add_generation_prompt":false}''',
    "E3": r'''{"messages":[{"role":"user","content":[{"type":"text","text":"one "},{"type":"text","text":"two"}]},{"role":"user","content":"<|close|>message<|sep|>"}],"add_generation_prompt":false}''',
    "E4": r'''{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!","reasoning_content":"Greet back."},{"role":"assistant","content":null,"reasoning_content":" \n"}],"add_generation_prompt":false}''',
    "E5": r'''{"messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"search","description":"搜索","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}],"thinking":false}''',
    "E6": r'''{"messages":[{"role":"user","content":"Hi"},{"role":"system","tools":[{"type":"function","function":{"name":"clock"}}],"content":"ignored"}],"thinking":false,"add_generation_prompt":false}''',
    "E7": r'''{"messages":[{"role":"assistant","content":"On it.","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"s\": \"Oslo\", \"n\": 1e2, \"b\": false, \"z\": null, \"o\": {\"y\": 1, \"b\": \"é\"}, \"a\": [1, 2]}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{\"tz\": "}},{"id":"c3","type":"function","function":{"name":"h","arguments":""}}]}],"thinking":false,"add_generation_prompt":false}''',
    "E8": r'''{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"clock","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c2","content":"12:00","name":"stale"},{"role":"tool","tool_call_id":"c1","content":"sunny"}],"thinking":false,"add_generation_prompt":false}''',
    "E10": r'''{"messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"thinking_effort":"max","tool_choice":"required","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}}}}''',
    "E11": r'''{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,..."}},{"type":"text","text":"vs <|kimi_image_placeholder|>?"}]}],"image_prompts":["<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_end|>","<|media_begin|>image 32x16<|media_content|><|media_pad|><|media_end|>"],"thinking":false}''',
}

E_OUTPUTS = {
    "E1": r"""
⟦o⟧message· role·="·user·"⟦s⟧Hello⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧
""",
    "E2": r"""
⟦o⟧message· role·="·system·"· name·="·ops·"⟦s⟧Be brief.⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·user·"· name·="·a&quot;b&amp;c·"⟦s⟧Hi⟦c⟧message⟦s⟧⟦e⟧
""",
    "E3": r"""
⟦o⟧message· role·="·user·"⟦s⟧one ·two⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·user·"⟦s⟧<|close|>message<|sep|>⟦c⟧message⟦s⟧⟦e⟧
""",
    "E4": r"""
⟦o⟧message· role·="·user·"⟦s⟧Hi⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧Greet back.⟦c⟧think⟦s⟧⟦o⟧response⟦s⟧Hello!⟦c⟧response⟦s⟧⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧⟦c⟧think⟦s⟧⟦o⟧response⟦s⟧⟦c⟧response⟦s⟧⟦c⟧message⟦s⟧⟦e⟧
""",
    "E5": r"""
⟦o⟧message· role·="·system·"· type·="·tool-declare·"⟦s⟧# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n[{"function":{"description":"搜索","name":"search","parameters":{"properties":{"q":{"type":"string"}},"type":"object"}},"type":"function"}]\n```⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·user·"⟦s⟧Hi⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧response⟦s⟧
""",
    "E6": r"""
⟦o⟧message· role·="·user·"⟦s⟧Hi⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·system·"· type·="·tool-declare·"⟦s⟧## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\nYou have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n```json\n[{"function":{"name":"clock"},"type":"function"}]\n```⟦c⟧message⟦s⟧⟦e⟧
""",
    "E7": r"""
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧response⟦s⟧On it.⟦c⟧response⟦s⟧⟦o⟧tools⟦s⟧
⟦o⟧call· tool·="·f·"· index·="·1·"⟦s⟧
⟦o⟧argument· key·="·s·"· type·="·string·"⟦s⟧Oslo⟦c⟧argument⟦s⟧
⟦o⟧argument· key·="·n·"· type·="·number·"⟦s⟧100.0⟦c⟧argument⟦s⟧
⟦o⟧argument· key·="·b·"· type·="·boolean·"⟦s⟧false⟦c⟧argument⟦s⟧
⟦o⟧argument· key·="·z·"· type·="·null·"⟦s⟧null⟦c⟧argument⟦s⟧
⟦o⟧argument· key·="·o·"· type·="·object·"⟦s⟧{"y": 1, "b": "é"}⟦c⟧argument⟦s⟧
⟦o⟧argument· key·="·a·"· type·="·array·"⟦s⟧[1, 2]⟦c⟧argument⟦s⟧⟦c⟧call⟦s⟧
⟦o⟧call· tool·="·g·"· index·="·2·"⟦s⟧⟦o⟧json· type·="·object·"⟦s⟧{"tz": ⟦c⟧json⟦s⟧⟦c⟧call⟦s⟧
⟦o⟧call· tool·="·h·"· index·="·3·"⟦s⟧⟦c⟧call⟦s⟧⟦c⟧tools⟦s⟧⟦c⟧message⟦s⟧⟦e⟧
""",
    "E8": r"""
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧response⟦s⟧⟦c⟧response⟦s⟧⟦o⟧tools⟦s⟧⟦o⟧call· tool·="·weather·"· index·="·1·"⟦s⟧⟦c⟧call⟦s⟧⟦o⟧call· tool·="·clock·"· index·="·2·"⟦s⟧⟦c⟧call⟦s⟧⟦c⟧tools⟦s⟧⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·tool·"· tool·="·weather·"· index·="·1·"⟦s⟧sunny⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·tool·"· tool·="·clock·"· index·="·2·"⟦s⟧12:00⟦c⟧message⟦s⟧⟦e⟧
""",
    "E10": r"""
⟦o⟧message· role·="·system·"· type·="·tool-declare·"⟦s⟧# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n[{"function":{"name":"f"},"type":"function"}]\n```⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·system·"· type·="·thinking-effort·"⟦s⟧`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=max`.⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·user·"⟦s⟧Hi⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·system·"· type·="·tool-choice·"⟦s⟧The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·system·"· type·="·response-format·"⟦s⟧The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data without markdown code blocks (```json) or any additional formatting.\nThe JSON data must match the following schema:\n```json\n{"properties":{"a":{"type":"string"},"b":{"type":"integer"}},"type":"object"}\n```⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧
""",
    "E11": r"""
⟦o⟧message· role·="·user·"⟦s⟧⟦<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_end|>⟧vs ⟦<|media_begin|>image 32x16<|media_content|><|media_pad|><|media_end|>⟧?⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧response⟦s⟧
""",
}

# §3.4 bodies, as the spec's JSON string literals.
TOOL_CHOICE_NONE = json.loads(r'''"The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message."''')
JSON_OBJECT_BODY = json.loads(r'''"The system is invoked with `response_format=json_object`.\nYour response must be raw JSON data without markdown code blocks (```json) or any additional formatting."''')


def example_input(name: str) -> dict:
    return json.loads(E_INPUTS[name])


@pytest.mark.parametrize("name", sorted(E_INPUTS))
def test_worked_example(name):
    assert render(**example_input(name)) == parse(E_OUTPUTS[name])


def test_e1_without_thinking_ends_in_response():
    expected = parse(E_OUTPUTS["E1"])
    expected[-2] = ["response", False]
    assert render(**example_input("E1"), thinking=False) == expected


def test_e4_without_thinking_drops_every_think():
    rendered = messages_of(render(**example_input("E4") | {"thinking": False}))
    assert rendered[1] == parse(
        "⟦o⟧message· role·=\"·assistant·\"⟦s⟧⟦o⟧response⟦s⟧Hello!⟦c⟧response⟦s⟧⟦c⟧message⟦s⟧⟦e⟧"
    )
    assert rendered[2] == parse(
        '⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧response⟦s⟧⟦c⟧response⟦s⟧⟦c⟧message⟦s⟧⟦e⟧'
    )
    assert ["think", False] not in sum(rendered, [])


def test_e9_one_stranger_leaves_the_run_and_names_by_position():
    given_input = example_input("E8")
    given_input["messages"][1:] = [
        {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
        {"role": "tool", "tool_call_id": "zz", "content": "sunny"},
    ]
    rendered = messages_of(render(**given_input))
    e8 = messages_of(parse(E_OUTPUTS["E8"]))
    assert rendered[0] == e8[0]
    assert sum(rendered[1:], []) == parse(r"""
⟦o⟧message· role·="·tool·"· tool·="·weather·"· index·="·1·"⟦s⟧12:00⟦c⟧message⟦s⟧⟦e⟧
⟦o⟧message· role·="·tool·"· tool·="·clock·"· index·="·2·"⟦s⟧sunny⟦c⟧message⟦s⟧⟦e⟧
""")


@pytest.mark.parametrize(
    ("overrides", "line", "body"),
    [
        ({"tool_choice": "none"}, 3, TOOL_CHOICE_NONE),
        ({"response_format": {"type": "json_object"}}, 4, JSON_OBJECT_BODY),
    ],
)
def test_e10_variants_swap_in_their_bodies(overrides, line, body):
    expected = messages_of(parse(E_OUTPUTS["E10"]))
    assert expected[line][8] in (["tool-choice", False], ["response-format", False])
    expected[line][11] = [body, False]  # ⟦o⟧, message, 2 attrs of 4, ⟦s⟧, then the body
    assert messages_of(render(**example_input("E10") | overrides)) == expected


def test_e11_without_prompts_keeps_the_typed_placeholder_plain():
    rendered = render(**example_input("E11") | {"image_prompts": None})
    assert messages_of(rendered)[0] == parse(
        '⟦o⟧message· role·="·user·"⟦s⟧⟦<|kimi_image_placeholder|>⟧vs <|kimi_image_placeholder|>?'
        "⟦c⟧message⟦s⟧⟦e⟧"
    )


def test_e12_refusals():
    hello = {"messages": [{"role": "user", "content": "Hello"}]}
    assert refusal(**hello, thinking_effort="medium") == (
        "AssertionError",
        "Unsupported thinking_effort='medium'; supported values are ['high', 'low', 'max'].",
    )
    assert render(**hello, thinking_effort="medium", thinking=False) == render(**hello, thinking=False)
    assert ["thinking-effort", False] not in render(**hello, thinking_effort="medium", thinking=False)
    call = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1,2]"}}]}
    assert refusal(messages=[call]) == ("ValueError", "Kimi K3 tool call arguments must be a JSON object.")
    call["tool_calls"][0]["function"]["arguments"] = 5
    assert refusal(messages=[call]) == (
        "TypeError", "Kimi K3 tool call arguments must be a dict or a JSON object string."
    )
    assert refusal(messages=[{"role": "tool", "content": "x"}]) == (
        "ValueError",
        "Kimi K3 tool messages need a resolvable tool name: carry `tool`/`name`, "
        "or match a preceding assistant tool_call by order.",
    )
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    assert refusal(messages=[image], image_prompts=[PROMPT_A, PROMPT_B]) == (
        "ValueError", "image prompt count 2 != consumed placeholder count 1"
    )


# ---- §1 segments and §3.1 tags --------------------------------------------------------------

def user(content, **extra) -> dict:
    return {"role": "user", "content": content, **extra}


def test_attribute_is_four_plain_segments_and_three_when_empty():
    rendered = render(messages=[user("x", name="n")], add_generation_prompt=False)
    assert rendered[:11] == parse('⟦o⟧message· role·="·user·"· name·="·n·"⟦s⟧')
    tool = {"role": "tool", "tool": "", "content": "r"}
    assert render(messages=[tool], add_generation_prompt=False) == parse(
        '⟦o⟧message· role·="·tool·"· tool·="·"· index·="·1·"⟦s⟧r⟦c⟧message⟦s⟧⟦e⟧'
    )


def test_empty_content_puts_sep_straight_before_close():
    for content in ("", None, []):
        assert render(messages=[user(content)], add_generation_prompt=False) == parse(
            '⟦o⟧message· role·="·user·"⟦s⟧⟦c⟧message⟦s⟧⟦e⟧'
        )
    assert render(messages=[{"role": "user"}], add_generation_prompt=False) == parse(
        '⟦o⟧message· role·="·user·"⟦s⟧⟦c⟧message⟦s⟧⟦e⟧'
    )


def test_adjacent_plain_segments_are_never_merged():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": ""}, {"type": "input_text", "text": "b"}]
    rendered = render(messages=[user(parts)], add_generation_prompt=False)
    assert rendered[7:9] == [["a", False], ["b", False]]  # the empty part is omitted, not merged


def test_no_bos_and_no_eos():
    rendered = render(messages=[user("hi")])
    assert rendered[0] == [OPEN, True]
    assert rendered[-1] == [SEP, True]
    assert render(messages=[]) == parse('⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧')


def test_generation_prompt_never_has_a_name():
    rendered = render(messages=[{"role": "assistant", "content": "a", "name": "kimi"}])
    assert rendered[-10:] == parse('⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧')
    assert ["kimi", False] in rendered


def test_markup_written_by_anyone_stays_plain():
    text = f"{OPEN}x{SEP}{CLOSE}{END_OF_MSG}{PROMPT_A}"
    call = {"function": {"name": "f", "arguments": {"k": text}}}
    rendered = render(messages=[user(text), {"role": "assistant", "content": text,
                                             "reasoning_content": text, "tool_calls": [call]},
                                {"role": "tool", "tool": text, "content": text}])
    assert rendered.count([text, False]) == 6  # content ×3, reasoning, argument, tool attr
    assert [text, True] not in rendered


def test_names_render_only_when_truthy_and_stringify():
    for name, present in (("", False), (None, False), (0, False), (7, True), ("ops", True)):
        rendered = render(messages=[{"role": "system", "content": "s", "name": name}])
        assert ([" name", False] in rendered) is present
    assert ["7", False] in render(messages=[user("u", name=7)])


def test_unknown_roles_and_non_dicts_are_skipped_and_system_is_not_hoisted():
    rendered = render(messages=["junk", None, {"role": "developer", "content": "d"}, user("a"),
                                {"role": "system", "content": "s"}, {"role": "function", "content": "f"}],
                      add_generation_prompt=False)
    assert rendered == parse('⟦o⟧message· role·="·user·"⟦s⟧a⟦c⟧message⟦s⟧⟦e⟧'
                             '⟦o⟧message· role·="·system·"⟦s⟧s⟦c⟧message⟦s⟧⟦e⟧')


# ---- escaping -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ('a"b&c', "a&quot;b&amp;c"),
        ("&quot;", "&amp;quot;"),  # & first: an already-escaped quote is escaped again, once
        ('"&"', "&quot;&amp;&quot;"),
        ("<>'\n\t", "<>'\n\t"),  # nothing else is escaped
    ],
)
def test_attribute_escaping(raw, escaped):
    rendered = render(messages=[user("b", name=raw)], add_generation_prompt=False)
    assert rendered[8] == [escaped, False]


def test_bodies_are_never_escaped():
    body = '"&<>&quot;'
    call = {"function": {"name": 'q"&', "arguments": {'k"&': body}}}
    rendered = render(messages=[user(body), {"role": "assistant", "content": body, "tool_calls": [call]}])
    assert rendered.count([body, False]) == 3
    assert ["q&quot;&amp;", False] in rendered and ["k&quot;&amp;", False] in rendered


# ---- purity ---------------------------------------------------------------------------------

def test_inputs_are_not_mutated():
    kwargs = example_input("E8") | {
        "tools": [{"function": {"name": "f", "parameters": {"b": 1, "a": 2}}, "type": "function"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"z": 1, "a": 1}}},
        "image_prompts": [],
    }
    kwargs["messages"].append({"role": "assistant", "tool_calls": [
        {"function": {"name": "g", "arguments": {"y": [1, {"b": 2, "a": 1}], "x": 1}}}]})
    before = copy.deepcopy(kwargs)
    render_segments(**kwargs)
    assert kwargs == before
    assert json.dumps(kwargs) == json.dumps(before)  # key order too
    assert "tool" not in kwargs["messages"][1] and kwargs["messages"][1]["name"] == "stale"


# ---- §3.9 canonical JSON --------------------------------------------------------------------

def declaration_body(segments: list[list]) -> str:
    return segments[11][0]


def test_tools_are_deep_sorted_by_code_point_and_compact():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "é": 1, "b": [{"z": 1, "a": [3, 1]}, "x"], "B": None, "a b": {"y": True, "x": 1.5}}}}]
    body = declaration_body(render(messages=[], tools=tools))
    assert body.endswith(
        '[{"function":{"name":"f","parameters":{"B":null,"a b":{"x":1.5,"y":true},'
        '"b":[{"a":[3,1],"z":1},"x"],"é":1}},"type":"function"}]\n```'
    )


def test_lazy_tools_are_deep_sorted_and_empty_lazy_tools_is_a_plain_system_message():
    lazy = {"role": "system", "tools": [{"b": 1, "a": {"d": 1, "c": "ü"}}], "content": "c", "name": "n"}
    rendered = render(messages=[lazy], add_generation_prompt=False)
    assert declaration_body(rendered).endswith('[{"a":{"c":"ü","d":1},"b":1}]\n```')
    assert ["c", False] not in rendered and ["n", False] not in rendered
    plain_system = render(messages=[lazy | {"tools": []}], add_generation_prompt=False)
    assert plain_system == parse('⟦o⟧message· role·="·system·"· name·="·n·"⟦s⟧c⟦c⟧message⟦s⟧⟦e⟧')


def test_empty_tools_render_nothing():
    assert render(messages=[user("x")], tools=[]) == render(messages=[user("x")])
    assert render(messages=[user("x")], tools=None) == render(messages=[user("x")])


# ---- §3.5 arguments -------------------------------------------------------------------------

def arguments_render(arguments) -> list[list]:
    """The segments between ⟦o⟧call…⟦s⟧ and ⟦c⟧call of a single call."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    rendered = render(messages=[{"role": "assistant", "tool_calls": [call]}],
                      thinking=False, add_generation_prompt=False)
    start = rendered.index(["call", False]) + 10
    end = len(rendered) - 1 - rendered[::-1].index(["call", False]) - 1
    return rendered[start:end]


def argument(key, kind, body) -> list[list]:
    return parse(f'⟦o⟧argument· key·="·{key}·"· type·="·{kind}·"⟦s⟧{body}⟦c⟧argument⟦s⟧')


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (None, []),
        ({}, []),
        ("", []),
        (" \n\t ", []),
        ("{}", []),
        ('{"b": true, "n": 1, "f": 1.5e-7, "s": "", "l": []}',
         argument("b", "boolean", "true") + argument("n", "number", "1")
         + argument("f", "number", "1.5e-07")
         + parse('⟦o⟧argument· key·="·s·"· type·="·string·"⟦s⟧⟦c⟧argument⟦s⟧')
         + argument("l", "array", "[]")),
        ('{"x": NaN, "y": -Infinity, "z": 123456789012345678901234567890}',
         argument("x", "number", "NaN") + argument("y", "number", "-Infinity")
         + argument("z", "number", "123456789012345678901234567890")),
        ('{"a": 1, "b": 2, "a": 3}', argument("a", "number", "3") + argument("b", "number", "2")),
        ('{"o": {"z": [1, {"b": "ü", "a": null}], "a": 2.0}}',
         argument("o", "object", '{"z": [1, {"b": "ü", "a": null}], "a": 2.0}')),
        ({"z": (1, 2), "a": {"k": "\u2603"}},
         argument("z", "array", "[1, 2]") + argument("a", "object", '{"k": "\u2603"}')),
        ('{"s": "line\\nnext \\"q\\""}', argument("s", "string", 'line\\nnext "q"')),
    ],
)
def test_argument_normalisation(arguments, expected):
    assert arguments_render(arguments) == expected


@pytest.mark.parametrize("raw", ['{"tz": ', "not json", '{"a": "raw\tcontrol"}', "{'a': 1}", "{} {}"])
def test_unparseable_arguments_are_a_raw_json_element(raw):
    assert arguments_render(raw) == [[OPEN, True], ["json", False], [" type", False], ['="', False],
                                     ["object", False], ['"', False], [SEP, True], [raw, False],
                                     [CLOSE, True], ["json", False], [SEP, True]]


@pytest.mark.parametrize("arguments", ["[1]", "5", "null", '"x"', "true", " [] "])
def test_json_that_is_not_an_object_is_refused(arguments):
    call = {"function": {"name": "f", "arguments": arguments}}
    assert refusal(messages=[{"role": "assistant", "tool_calls": [call]}]) == (
        "ValueError", "Kimi K3 tool call arguments must be a JSON object."
    )


def test_an_integer_over_python_s_digit_cap_escapes_json_loads_as_upstream_would():
    # CPython's json.loads raises a bare ValueError (not a JSONDecodeError) for an integer of
    # more than 4,300 digits. We take upstream to catch only JSONDecodeError, so this is not
    # the raw case: the ValueError escapes, relabelled (docs/DECISIONS.md, "XTML renderer").
    assert arguments_render('{"n": ' + "7" * 4300 + "}") == argument("n", "number", "7" * 4300)
    call = {"function": {"name": "f", "arguments": '{"n": ' + "7" * 4301 + "}"}}
    kind, message = refusal(messages=[{"role": "assistant", "tool_calls": [call]}])
    assert kind == "ValueError" and message.startswith("Exceeds the limit (4300 digits)")
    deep = {"function": {"name": "f", "arguments": "[" * 100_000}}
    assert refusal(messages=[{"role": "assistant", "tool_calls": [deep]}])[0] == "RecursionError"


@pytest.mark.parametrize("arguments", [[1], 5, 1.5, True, False, ("a",)])
def test_arguments_of_another_type_are_refused(arguments):
    call = {"function": {"name": "f", "arguments": arguments}}
    assert refusal(messages=[{"role": "assistant", "tool_calls": [call]}]) == (
        "TypeError", "Kimi K3 tool call arguments must be a dict or a JSON object string."
    )


def test_call_without_function_key_is_its_own_function_and_id_is_never_rendered():
    calls = [{"id": "secret-id", "name": "bare", "arguments": '{"a": 1}'},
             {"id": "other-id", "function": {"name": "wrapped"}}]
    rendered = render(messages=[{"role": "assistant", "tool_calls": calls}], thinking=False)
    assert ["bare", False] in rendered and ["wrapped", False] in rendered
    assert ["2", False] in rendered
    assert not any("-id" in text for text, _ in rendered)


def test_empty_tool_calls_render_no_tools_element():
    for calls in ([], None):
        rendered = render(messages=[{"role": "assistant", "content": "a", "tool_calls": calls}])
        assert ["tools", False] not in rendered


# ---- §3.5 think ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("fields", "body"),
    [
        ({"reasoning_content": "  keep  \n"}, "  keep  \n"),  # unstripped
        ({"reasoning_content": "", "reasoning": "r"}, "r"),
        ({"reasoning_content": None, "reasoning": "r"}, "r"),
        ({"reasoning_content": "rc", "reasoning": "r"}, "rc"),
        ({"reasoning": 42}, "42"),
        ({"reasoning": "\u3000\n"}, None),
        ({}, None),
    ],
)
def test_think_element(fields, body):
    rendered = render(messages=[{"role": "assistant", "content": "c", **fields}], add_generation_prompt=False)
    think = "" if body is None else body.replace("\n", "\\n") + "⟦c⟧"
    expected = parse('⟦o⟧message· role·="·assistant·"⟦s⟧⟦o⟧think⟦s⟧' + (think or "⟦c⟧")
                     + "think⟦s⟧⟦o⟧response⟦s⟧c⟦c⟧response⟦s⟧⟦c⟧message⟦s⟧⟦e⟧")
    assert rendered == expected


# ---- §3.7 tool results ----------------------------------------------------------------------

def assistant_calling(*names, ids=None) -> dict:
    ids = ids if ids is not None else [f"c{n}" for n in range(1, len(names) + 1)]
    calls = []
    for name, call_id in zip(names, ids):
        call = {"type": "function", "function": {"name": name, "arguments": "{}"}}
        if call_id is not ...:
            call["id"] = call_id
        calls.append(call)
    return {"role": "assistant", "content": None, "tool_calls": calls}


def result(content, **extra) -> dict:
    return {"role": "tool", "content": content, **extra}


def tool_line(name, index, body) -> list[list]:
    return parse(f'⟦o⟧message· role·="·tool·"· tool·="·{name}·"· index·="·{index}·"⟦s⟧{body}⟦c⟧message⟦s⟧⟦e⟧')


def rendered_tools(messages) -> list[list[list]]:
    return [m for m in messages_of(render(messages=messages, thinking=False)) if m[4] == ["tool", False]]


def test_answering_calls_one_and_three_gives_indexes_one_and_two():
    messages = [assistant_calling("a", "b", "c"), result("r3", tool_call_id="c3"), result("r1", tool_call_id="c1")]
    assert rendered_tools(messages) == [tool_line("a", 1, "r1"), tool_line("c", 2, "r3")]


def test_numbering_resets_only_at_an_assistant_message():
    messages = [result("x", tool="t"), {"role": "user", "content": "u"}, result("y", tool="t"),
                {"role": "system", "content": "s"}, result("z", tool="t"),
                {"role": "assistant", "content": "a"}, result("w", tool="t")]
    assert rendered_tools(messages) == [tool_line("t", 1, "x"), tool_line("t", 2, "y"),
                                        tool_line("t", 3, "z"), tool_line("t", 1, "w")]


def test_resort_matches_the_last_assistant_even_across_other_messages():
    messages = [assistant_calling("a", "b"), {"role": "user", "content": "u"},
                result("rb", tool_call_id="c2"), result("ra", tool_call_id="c1")]
    assert rendered_tools(messages) == [tool_line("a", 1, "ra"), tool_line("b", 2, "rb")]


def test_resort_is_all_or_nothing():
    messages = [assistant_calling("a", "b", "c"), result("rc", tool_call_id="c3", tool="kept"),
                result("rx", tool_call_id=None), result("ra", tool_call_id="c1")]
    assert rendered_tools(messages) == [tool_line("kept", 1, "rc"), tool_line("b", 2, "rx"),
                                        tool_line("c", 3, "ra")]


def test_a_non_dict_or_other_role_ends_a_run():
    messages = [assistant_calling("a", "b"), result("rb", tool_call_id="c2"), "junk",
                result("ra", tool_call_id="c1")]
    assert rendered_tools(messages) == [tool_line("b", 1, "rb"), tool_line("a", 2, "ra")]
    messages[2] = {"role": "developer", "content": "d"}
    assert rendered_tools(messages) == [tool_line("b", 1, "rb"), tool_line("a", 2, "ra")]


@pytest.mark.parametrize(
    ("message", "matches"),
    [
        (result("r", id="c2"), True),  # id stands in when tool_call_id is absent
        (result("r", tool_call_id=None, id="c2"), False),  # a present null key does not fall back
        (result("r", tool_call_id=2, ), False),
        (result("r"), False),
    ],
)
def test_match_key(message, matches):
    messages = [assistant_calling("a", "b"), message, result("ra", tool_call_id="c1")]
    expected = ([tool_line("a", 1, "ra"), tool_line("b", 2, "r")] if matches
                else [tool_line("a", 1, "r"), tool_line("b", 2, "ra")])
    assert rendered_tools(messages) == expected


def test_ids_compare_as_strings_and_the_first_shared_id_wins():
    messages = [assistant_calling("a", "b", "c", ids=[7, 7, ...]), result("r7", tool_call_id="7", tool="x")]
    assert rendered_tools(messages) == [tool_line("a", 1, "r7")]
    messages = [assistant_calling("a", "b", ids=[..., "k"]), result("rk", tool_call_id="k"),
                result("r?", tool_call_id="None")]
    assert rendered_tools(messages) == [tool_line("a", 1, "rk"), tool_line("b", 2, "r?")]


def test_stable_sort_when_two_results_answer_one_call():
    messages = [assistant_calling("a", "b"), result("2", tool_call_id="c2"), result("1a", tool_call_id="c1"),
                result("1b", tool_call_id="c1")]
    assert rendered_tools(messages) == [tool_line("a", 1, "1a"), tool_line("a", 2, "1b"), tool_line("b", 3, "2")]


def test_a_matched_call_without_a_name_leaves_its_message_unchanged():
    # A missing name cannot render (KeyError 'name'); a null one renders as "None" but renames nothing.
    nameless = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": None}},
                                                    {"id": "c2", "function": {"name": "b"}}]}
    messages = [nameless, result("rb", tool_call_id="c2", name="old"), result("ra", tool_call_id="c1", name="mine")]
    assert [m[8] for m in rendered_tools(messages)] == [["mine", False], ["b", False]]


@pytest.mark.parametrize(
    ("message", "name"),
    [
        (result("r", tool="t", name="n"), "t"),
        (result("r", name="n"), "n"),
        (result("r", tool=None, name="n"), "a"),  # a null tool does not fall back to name
        (result("r", name=None), "a"),
        (result("r", tool=0), "0"),
    ],
)
def test_tool_name_resolution(message, name):
    assert rendered_tools([assistant_calling("a", ids=[...]), message]) == [tool_line(name, 1, "r")]


def test_positional_fallback_needs_enough_calls():
    messages = [assistant_calling("a", ids=[...]), result("1", tool="t"), result("2")]
    assert refusal(messages=messages)[0] == "ValueError"
    messages = [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}, result("1")]
    assert refusal(messages=messages) == ("KeyError", "'name'")


# ---- §3.8 images ----------------------------------------------------------------------------

def test_image_prompt_format():
    assert image_prompt(640, 480) == PROMPT_A
    assert image_prompt(32, 16) == PROMPT_B
    assert MEDIA_PLACEHOLDER == "<|kimi_image_placeholder|>"
    with pytest.raises(ValueError, match="width"):
        image_prompt(0, 1)


def test_placeholders_are_substituted_in_every_rendered_text_in_render_order():
    prompts = [image_prompt(n, n) for n in range(1, 8)]
    ph = MEDIA_PLACEHOLDER
    messages = [
        {"role": "assistant", "reasoning_content": f"r{ph}", "content": [{"type": "image"}],
         "tool_calls": [{"function": {"name": ph, "arguments": {"s": f"{ph}{ph}", "o": [ph]}}},
                        {"function": {"name": "g", "arguments": f"raw{ph}"}}]},
        {"role": "tool", "tool": "t", "content": f"{ph}end"},
    ]
    rendered = render(messages=messages, image_prompts=prompts, add_generation_prompt=False)
    images = [text for text, is_markup in rendered if is_markup and text.startswith("<|media_begin|>")]
    assert images == prompts
    assert [ph, False] in rendered  # the call's tool attribute is not rendered text
    assert rendered[rendered.index([prompts[0], True]) - 1] == ["r", False]
    assert rendered[rendered.index([prompts[5], True]) - 1] == ["raw", False]
    assert rendered[rendered.index([prompts[6], True]) + 1] == ["end", False]
    assert rendered[rendered.index([prompts[4], True]) - 1] == ["[\"", False]


def test_placeholders_in_declarations_and_attributes_are_not_substituted():
    ph = MEDIA_PLACEHOLDER
    rendered = render(messages=[user("u", name=ph), {"role": "system", "tools": [{"d": ph}]}],
                      tools=[{"d": ph}], response_format={"type": "json_schema", "json_schema": {"schema": {"d": ph}}},
                      image_prompts=[])
    assert not any(is_markup and text not in (OPEN, SEP, CLOSE, END_OF_MSG) for text, is_markup in rendered)


def test_thinking_off_drops_reasoning_placeholders_unconsumed():
    messages = [{"role": "assistant", "content": "c", "reasoning_content": MEDIA_PLACEHOLDER}]
    assert [PROMPT_A, True] not in render(messages=messages, thinking=False, image_prompts=[])
    assert refusal(messages=messages, thinking=False, image_prompts=[PROMPT_A]) == (
        "ValueError", "image prompt count 1 != consumed placeholder count 0")


def test_without_prompts_images_are_the_placeholder_marker_and_text_stays_whole():
    content = [{"type": "image"}, {"type": "text", "text": f"a{MEDIA_PLACEHOLDER}b"}, {"type": "image_url"}]
    rendered = render(messages=[user(content)], add_generation_prompt=False)
    assert rendered[7:10] == [[MEDIA_PLACEHOLDER, True], [f"a{MEDIA_PLACEHOLDER}b", False],
                              [MEDIA_PLACEHOLDER, True]]


def test_empty_pieces_around_placeholders_are_dropped():
    rendered = render(messages=[user(MEDIA_PLACEHOLDER * 2)], image_prompts=[PROMPT_A, PROMPT_B],
                      add_generation_prompt=False)
    assert rendered[6:10] == [[SEP, True], [PROMPT_A, True], [PROMPT_B, True], [CLOSE, True]]


def test_running_out_of_prompts():
    for prompts in ([], [PROMPT_A]):
        assert refusal(messages=[user(MEDIA_PLACEHOLDER * 2)], image_prompts=prompts) == (
            "ValueError", "More image placeholders than image prompts.")


# ---- options --------------------------------------------------------------------------------

@pytest.mark.parametrize("choice", ["auto", "Required", {"type": "function"}, None, ["required"]])
def test_tool_choice_renders_only_required_and_none(choice):
    assert render(messages=[user("x")], tool_choice=choice) == render(messages=[user("x")])


def test_tool_choice_is_emitted_without_tools():
    rendered = render(messages=[], tool_choice="none", add_generation_prompt=False)
    assert rendered[11] == [TOOL_CHOICE_NONE, False]


SCHEMA_HEAD = json.loads(r'''"The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data without markdown code blocks (```json) or any additional formatting.\nThe JSON data must match the following schema:\n```json\n"''')


@pytest.mark.parametrize(
    ("response_format", "schema"),
    [
        ("json_schema", "null"),
        ({"type": "json_schema"}, "null"),
        ({"type": "json_schema", "json_schema": None}, "null"),
        ({"type": "json_schema", "json_schema": {"schema": None, "json_schema": {"a": 1}}}, "null"),
        ({"type": "json_schema", "json_schema": {"json_schema": {"b": 1, "a": 1}}}, '{"a":1,"b":1}'),
        ({"type": "json_schema", "json_schema": {"name": "x", "strict": True}}, '{"name":"x","strict":true}'),
        ({"type": "json_schema", "json_schema": "loose"}, '"loose"'),
        ({"type": "json_schema", "json_schema": [{"b": 1, "a": 2}]}, '[{"a":2,"b":1}]'),
    ],
)
def test_json_schema_selection(response_format, schema):
    rendered = render(messages=[], response_format=response_format, add_generation_prompt=False)
    assert rendered[11] == [SCHEMA_HEAD + schema + "\n```", False]


@pytest.mark.parametrize("response_format", ["json_object", {"type": "json_object", "json_schema": {}}])
def test_json_object_format(response_format):
    rendered = render(messages=[], response_format=response_format, add_generation_prompt=False)
    assert rendered[11] == [JSON_OBJECT_BODY, False]


@pytest.mark.parametrize("response_format", ["text", {"type": "text"}, {"json_schema": {"a": 1}}, {}, "JSON_OBJECT"])
def test_other_response_formats_render_nothing(response_format):
    assert render(messages=[], response_format=response_format) == render(messages=[])


@pytest.mark.parametrize("effort", ["low", "high", "max"])
def test_effort_renders_only_with_thinking(effort):
    rendered = render(messages=[], thinking_effort=effort)
    assert rendered[11][0].endswith(f"`thinking_effort={effort}`.")
    assert render(messages=[], thinking_effort=effort, thinking=False) == render(messages=[], thinking=False)


@pytest.mark.parametrize("effort", ["MAX", "", "none", 3, True])
def test_bad_effort_is_an_assertion(effort):
    assert refusal(messages=[], thinking_effort=effort) == (
        "AssertionError", f"Unsupported thinking_effort={effort!r}; supported values are ['high', 'low', 'max']."
    )


# ---- errors and their precedence ------------------------------------------------------------

def test_natural_python_errors_keep_python_text():
    assert refusal(messages=[{"content": "x"}]) == ("KeyError", "'role'")
    assert refusal(messages=[user([{"text": "x"}])]) == ("KeyError", "'type'")
    assert refusal(messages=[user([{"type": "text"}])]) == ("KeyError", "'text'")
    assert refusal(messages=[{"role": "assistant", "tool_calls": [{"function": {}}]}]) == ("KeyError", "'name'")
    assert refusal(messages=[user(5)]) == python_error(lambda: iter(5))
    part = "part"
    assert refusal(messages=[user([part])]) == python_error(lambda: part["type"])
    assert refusal(messages=[], thinking_effort=["max"]) == python_error(lambda: ["max"] in {"max"})


def test_error_precedence():
    bad_args = {"role": "mystery", "tool_calls": [{"function": {"name": "f", "arguments": "[]"}}]}
    no_role = {"content": "x"}
    image = user([{"type": "image"}])
    # 1. arguments anywhere (any role, even later) beat the effort, the messages and the prompts.
    assert refusal(messages=[no_role, image, bad_args], thinking_effort="medium", image_prompts=[]) == (
        "ValueError", "Kimi K3 tool call arguments must be a JSON object.")
    # 2. the effort beats the messages.
    assert refusal(messages=[no_role], thinking_effort="medium")[0] == "AssertionError"
    # 3. messages in render order.
    assert refusal(messages=[image, no_role], image_prompts=[]) == (
        "ValueError", "More image placeholders than image prompts.")
    assert refusal(messages=[no_role, image], image_prompts=[]) == ("KeyError", "'role'")
    # 4. leftover prompts come last.
    assert refusal(messages=[no_role], image_prompts=[PROMPT_A]) == ("KeyError", "'role'")


# ---- properties -----------------------------------------------------------------------------

TEXT = st.lists(st.sampled_from(["a", " ", "\n", '"', "&", "é", OPEN, SEP, END_OF_MSG, MEDIA_PLACEHOLDER]),
                max_size=4).map("".join)
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                       lambda inner: st.lists(inner, max_size=2) | st.dictionaries(TEXT, inner, max_size=2),
                       max_leaves=4)
PART = st.one_of(st.builds(lambda t: {"type": "text", "text": t}, TEXT), st.just({"type": "image_url"}))
CONTENT = st.one_of(st.none(), TEXT, st.lists(PART, max_size=3))
CALL = st.builds(lambda name, args, raw: {"id": name, "function": {"name": name, "arguments": raw or args}},
                 TEXT, st.dictionaries(TEXT, JSONISH, max_size=3), st.sampled_from(["", "{", "{}", " "]))
MESSAGE = st.one_of(
    st.builds(lambda r, c, n: {"role": r, "content": c, "name": n}, st.sampled_from(["user", "system"]), CONTENT, TEXT),
    st.builds(lambda c, r, calls: {"role": "assistant", "content": c, "reasoning_content": r, "tool_calls": calls},
              CONTENT, st.none() | TEXT, st.lists(CALL, max_size=2)),
    st.builds(lambda c, t, i: {"role": "tool", "content": c, "tool": t, "tool_call_id": i}, CONTENT, TEXT, TEXT),
    st.builds(lambda tools: {"role": "system", "tools": tools}, st.lists(JSONISH, max_size=2)),
)
STRUCTURE = {OPEN, SEP, CLOSE, END_OF_MSG}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(MESSAGE, max_size=5), thinking=st.booleans(), with_images=st.booleans(),
       gen=st.booleans())
def test_no_empty_segments_and_markup_is_only_structure_or_images(messages, thinking, with_images, gen):
    before = copy.deepcopy(messages)
    prompts = None
    if with_images:
        many = [image_prompt(n, 1) for n in range(1, 2001)]
        try:
            render_segments(messages, thinking=thinking, image_prompts=many)
        except XTMLError as err:
            consumed = int(re.fullmatch(r"image prompt count \d+ != consumed placeholder count (\d+)",
                                        str(err)).group(1))
            prompts = many[:consumed]
        else:
            raise AssertionError("2000 prompts cannot all be consumed by 5 short messages")
    segments = render_segments(messages, thinking=thinking, image_prompts=prompts, add_generation_prompt=gen)
    assert messages == before
    allowed = STRUCTURE | (set(prompts) if prompts is not None else {MEDIA_PLACEHOLDER})
    for segment in segments:
        assert isinstance(segment, Segment) and isinstance(segment.text, str)
        assert segment.text, "an empty segment"
        if segment.markup:
            assert segment.text in allowed
    assert not segments or segments[0] == Segment(OPEN, True)
    opens = sum(s == Segment(OPEN, True) for s in segments)
    closes = sum(s == Segment(CLOSE, True) for s in segments)
    assert opens == closes + (2 if gen else 0)
