"""Tool results for the K3 renderer: the all-or-nothing re-sort and the tool-name resolution.

K3 expects a run of tool results in the order of the calls that asked for them, each naming
its tool (docs/XTML.md §3.7). Clients send them in any order and often without names.
"""

from __future__ import annotations

from typing import Any

from waste.domain.errors import XTMLError

UNRESOLVABLE_TOOL_NAME = (
    "Kimi K3 tool messages need a resolvable tool name: carry `tool`/`name`, "
    "or match a preceding assistant tool_call by order."
)


def call_function(entry: Any) -> Any:
    """The function object of a ``tool_calls`` entry: its ``function`` if present, else itself."""
    return entry["function"] if "function" in entry else entry


def _is_tool_message(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "tool"


def order_tool_results(messages: list[Any]) -> list[Any]:
    """Re-sort each run of tool messages into call order, naming each from its call.

    The caller passes a deep copy: matched messages get their ``tool`` (and ``name``, when
    present) overwritten in place.

    Args:
        messages: the request's messages, already deep-copied.

    Returns:
        A new list with every fully matched run sorted; other runs are left exactly as given.
    """
    ordered = list(messages)
    last_assistant: dict[str, Any] | None = None
    start = 0
    while start < len(ordered):
        message = ordered[start]
        if not _is_tool_message(message):
            if isinstance(message, dict) and message.get("role") == "assistant":
                last_assistant = message
            start += 1
            continue
        end = start
        while end < len(ordered) and _is_tool_message(ordered[end]):
            end += 1
        ordered[start:end] = _order_run(ordered[start:end], last_assistant)
        start = end
    return ordered


def _order_run(run: list[dict[str, Any]], assistant: dict[str, Any] | None) -> list[dict[str, Any]]:
    if assistant is None:
        return run
    calls = assistant.get("tool_calls") or []
    position_of_id: dict[str, int] = {}
    for position, call in enumerate(calls):
        call_id = call.get("id")
        if call_id is not None:
            position_of_id.setdefault(str(call_id), position)  # a shared id: the first call wins
    positions = []
    for message in run:
        key = message["tool_call_id"] if "tool_call_id" in message else message.get("id")
        if key is None or str(key) not in position_of_id:
            return run  # all or nothing: one stranger and the run stays as given
        positions.append(position_of_id[str(key)])
    order = sorted(range(len(run)), key=positions.__getitem__)  # stable
    for k in order:
        name = call_function(calls[positions[k]]).get("name")
        if name is not None:
            run[k]["tool"] = name
            if "name" in run[k]:
                run[k]["name"] = name
    return [run[k] for k in order]


def resolve_tool_name(message: dict[str, Any], index: int, last_assistant: dict[str, Any] | None) -> Any:
    """The ``tool`` attribute of a tool message.

    Args:
        message: the tool message (after the re-sort).
        index: its 1-based position among tool messages since the last assistant message.
        last_assistant: the most recent assistant message rendered before it, if any.

    Returns:
        ``tool`` if the key is present (even when null), else ``name``; when that is null,
        the name of call ``index`` of ``last_assistant``.

    Raises:
        XTMLError: ``ValueError`` when no name can be found; ``KeyError`` ``'name'`` when the
            positional call has no name.
    """
    name = message["tool"] if "tool" in message else message.get("name")
    if name is None and last_assistant is not None:
        calls = last_assistant.get("tool_calls") or []
        if index <= len(calls):
            name = call_function(calls[index - 1])["name"]
    if name is None:
        raise XTMLError("ValueError", UNRESOLVABLE_TOOL_NAME)
    return name
