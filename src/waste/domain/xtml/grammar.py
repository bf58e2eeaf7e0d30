"""The XTML reply grammar when tools are declared (docs/DECISIONS.md, tool-call constraints).

After free reasoning, the reply is ``response`` then, when calls are made, a ``tools`` element
whose calls name a declared function and carry its ``parameters`` as argument elements (a
string raw, any other value as JSON; docs/XTML.md §3.5, §6). A schema argument elements cannot
honour property by property is carried whole in a ``json`` element instead.
"""

from __future__ import annotations

from typing import Any, Sequence

from waste.domain.reply.tool_grammar import (Argument, ToolGrammar, ToolSpec, element_arguments,
                                             element_sequence, json_value, literal, object_schema,
                                             reply_rule, schema_list, special)
from waste.domain.xtml.markers import XtmlMarkerIds


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")  # as the renderer's attributes


def xtml_reply_grammar(ids: XtmlMarkerIds, specs: Sequence[ToolSpec], *, mode: str,
                       thinking: bool, answer: tuple[Any, str] | None) -> ToolGrammar:
    """The grammar of a whole K3 reply that may (``auto``) or must (``required``, ``named``)
    call ``specs``' functions. ``answer`` is a response_format's (schema, param), whose JSON
    the content must then be (in ``auto``; forced calls leave the content empty)."""
    o, s, c, e = (special(i) for i in (ids.open, ids.sep, ids.close, ids.end_of_msg))

    def tag(name: str) -> str:
        return f"{c} {literal(name)} {s}"

    lines = []
    if thinking:
        lines.append(f"start: REASONING? {tag('think')} {o} {literal('response')} {s} reply")
    else:
        lines.append("start: reply")
    tools = f"{o} {literal('tools')} {s} calls {tag('tools')}"
    end = f"{tag('message')} {e}"
    lines.append(reply_rule(mode, answer, tools, end, gap=tag("response")))
    call_rules = [f"call_{i}" for i in range(len(specs))]
    lines.append("calls: call_0" if mode == "named" else f"calls: ({' | '.join(call_rules)})+")
    for i, spec in enumerate(specs):
        index = literal("1") if mode == "named" else "INDEX"
        header = f'call tool="{_escape(spec.name)}" index="'
        lines.append(f"call_{i}: {o} {literal(header)} {index} {literal(chr(34))} {s} "
                     f"{_arguments(spec, o, s, c)} {tag('call')}")
    lines += ["TEXT: /(?s:.+)/", "REASONING: /(?s:.+)/", "INDEX: /[1-9][0-9]?/"]
    return ToolGrammar(lark="\n".join(lines) + "\n", schemas=schema_list(specs, answer))


def _arguments(spec: ToolSpec, o: str, s: str, c: str) -> str:
    schema = object_schema(spec)
    arguments = element_arguments(schema)
    if arguments is None:  # docs/XTML.md §3.5's raw case: the whole object in a json element
        header = literal('json type="object"')
        return f"{o} {header} {s} {json_value(schema)} {c} {literal('json')} {s}"

    def element(argument: Argument) -> str:
        header = f'argument key="{_escape(argument.key)}"'
        if argument.type_name is not None:
            header += f' type="{argument.type_name}"'
        return f"{o} {literal(header)} {s} {argument.value} {c} {literal('argument')} {s}"

    return element_sequence(arguments, element)
