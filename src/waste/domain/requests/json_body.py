"""Request bodies: strict UTF-8 JSON objects (docs/HTTP.md §2.1 step 4, §5 `invalid_json`).

Python's json accepts NaN/Infinity, nests until the interpreter's recursion limit and lets lone
surrogate escapes through; each of those would surface later as a 500, so all are refused here.
"""

from __future__ import annotations

from typing import Any

import json
import re
from collections.abc import Iterable
from itertools import accumulate

from waste.domain.errors import InvalidRequest

#: Deepest nesting a body (or a tool call's argument string) may have; the top-level object is 1.
MAX_NESTING = 512

# A `\uD800`-`\uDFFF` escape: the only way a JSON text yields a str that UTF-8 cannot encode.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


class _ConstantRefused(ValueError):
    """json's `parse_constant` hook met NaN, Infinity or -Infinity."""


def _refuse_constant(name: str) -> None:
    raise _ConstantRefused(name)


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(message, None, code="invalid_json")


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """Parse a request body that must be one UTF-8 JSON object.

    Args:
        raw: the body bytes, exactly as received.

    Returns:
        The decoded object. JSON integers (no fraction, no exponent) are `int`; every other
        number is `float`, so `1.0` and `1e3` are not integers anywhere downstream.

    Raises:
        InvalidRequest: code `invalid_json`, param None, with "JSON" in the message, for an empty
            body, bytes that are not UTF-8, a syntax error, NaN/Infinity, a lone surrogate
            escape, nesting deeper than `MAX_NESTING`, or a top-level value that is not an object.
    """
    if not raw:
        raise _bad("The request body is empty; send a JSON object.")
    if type(raw) is not bytes:
        raw = bytes(raw)  # bytearray / memoryview: one copy, so the byte scans below work
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _bad(f"The request body is not UTF-8 JSON (invalid byte at offset {err.start}).") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise _bad(f"The request body's JSON is nested more than {MAX_NESTING} levels deep.") from None
    except _ConstantRefused as err:
        raise _bad(f"The request body is not valid JSON: {err} is not a JSON number.") from None
    except json.JSONDecodeError as err:
        # err.msg/pos say where, without echoing the body.
        raise _bad(f"The request body is not valid JSON: {err.msg} at character {err.pos}.") from None
    except ValueError:
        # CPython's int-digits cap (4300) raises a bare ValueError from inside the decoder.
        raise _bad("The request body is not valid JSON: a number has too many digits.") from None
    if type(value) is not dict:
        raise _bad(f"The request body must be a JSON object, not {describe_json(value)}.")
    problem = find_decoded_problem(raw, value)
    if problem:
        raise _bad(f"The request body's JSON {problem}.")
    return value


def find_decoded_problem(raw: bytes, value: object) -> str | None:
    """Check what `json.loads` let through: nesting over `MAX_NESTING`, lone surrogates.

    Args:
        raw: the JSON text as UTF-8 bytes.
        value: what `json.loads` made of it.

    Returns:
        None when acceptable, else a phrase ("is nested more than 512 levels deep") that
        completes a sentence about the JSON.
    """
    # Every level of nesting costs a bracket, so a text with few brackets needs no scan.
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING and nesting_depth(raw) > MAX_NESTING:
        return f"is nested more than {MAX_NESTING} levels deep"
    if _SURROGATE_ESCAPE.search(raw) is not None:
        return find_nesting_problem(value, check_surrogates=True)
    return None


_BRACKET_DELTA = tuple({ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}.get(b, 0) for b in range(256))
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STRING = re.compile(rb'"[^"]*"')


def nesting_depth(raw: bytes) -> int:
    """The deepest bracket nesting of a body that json has already accepted, at C speed.

    Walking the decoded value costs as much as decoding it on a body of many small nodes; this
    works on the bytes instead: drop escapes so only delimiter quotes remain, keep quotes and
    brackets, drop quoted runs, then a running sum of +1/-1 gives the depth.
    """
    # Left to right, `\\` pairs first, so that `\\"` (a backslash, then a closing quote) survives.
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", unescaped.translate(None, _NOT_STRUCTURE))
    return max(accumulate(map(_BRACKET_DELTA.__getitem__, brackets)), default=0)


def find_nesting_problem(value: object, *, check_surrogates: bool = False) -> str | None:
    """Walk a decoded JSON value without recursion.

    Args:
        value: a value built by `json.loads`.
        check_surrogates: also look for strings (keys included) holding a lone surrogate.

    Returns:
        None when the value is acceptable, else a phrase such as "is nested more than 512
        levels deep" that completes a sentence about the value.
    """
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is dict:
            if check_surrogates and any(not _encodable(key) for key in node):
                return "holds a lone surrogate escape in a key"
            children: Iterable[object] = node.values()
        elif type(node) is list:
            children = node
        else:
            if check_surrogates and type(node) is str and not _encodable(node):
                return "holds a lone surrogate escape in a string"
            continue
        if depth > MAX_NESTING:
            return f"is nested more than {MAX_NESTING} levels deep"
        for child in children:
            if type(child) in (dict, list) or (check_surrogates and type(child) is str):
                stack.append((child, depth + 1))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def describe_json(value: object) -> str:
    """Name a decoded JSON value's type for an error message ("a string", "null", ...)."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) is int:
        return "an integer"
    if type(value) is float:
        return "a number with a fraction or exponent"
    if type(value) is str:
        return "a string"
    if type(value) is list:
        return "an array"
    if type(value) is dict:
        return "an object"
    return type(value).__name__
