"""JSON as the K3 renderer writes it: canonical declarations and tool-call arguments.

Declarations (tools, schemas) are deep-sorted and compact; arguments keep their written order
and Python's default separators (docs/XTML.md §3.5, §3.9). Both follow Python ``json`` exactly,
because the reference encoder is Python: ``NaN``, big integers and float spelling included.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from waste.domain.errors import XTMLError

ARGUMENTS_NOT_OBJECT = "Kimi K3 tool call arguments must be a JSON object."
ARGUMENTS_BAD_TYPE = "Kimi K3 tool call arguments must be a dict or a JSON object string."


@attrs.frozen
class RawArguments:
    """Arguments that did not parse as JSON: rendered verbatim in a ``json`` element."""

    text: str


def canonical_json(value: Any) -> str:
    """Serialise a declaration: keys sorted by code point at every depth, compact, non-ASCII kept.

    Args:
        value: the tools list, a lazy ``tools`` list, or a response-format schema.

    Returns:
        The JSON text, e.g. ``[{"function":{"name":"f"},"type":"function"}]``.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def normalise_arguments(arguments: Any) -> dict[Any, Any] | RawArguments:
    """Turn a call's ``arguments`` into the object to render, or a raw string to keep verbatim.

    Args:
        arguments: None, a dict, or a string as the client sent it.

    Returns:
        A dict (the object case; a parsed string keeps its written key order, and a duplicate
        key keeps its first position and last value, as ``json.loads`` does), or
        ``RawArguments`` when the string is not JSON at all.

    Raises:
        XTMLError: ``ValueError`` when the string is JSON but not an object; ``TypeError`` when
            ``arguments`` is neither None, a dict nor a string.
    """
    if arguments is None:
        return {}
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        raise XTMLError("TypeError", ARGUMENTS_BAD_TYPE)
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return RawArguments(arguments)
    if not isinstance(parsed, dict):
        raise XTMLError("ValueError", ARGUMENTS_NOT_OBJECT)
    return parsed


def argument_type(value: Any) -> str:
    """The ``type`` attribute of an argument element (bool is tested before number)."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    return "array"


def argument_text(value: Any) -> str:
    """The body of an argument element: a string raw, anything else as Python ``json.dumps``.

    The default separators (``", "``, ``": "``) and ``ensure_ascii=False`` are deliberate:
    they are what the model saw in training, so ``1e2`` prints ``100.0`` and ``NaN`` stays.
    """
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
