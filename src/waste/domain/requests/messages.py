"""Chat messages: validated one at a time and normalised for the renderers (docs/HTTP.md §2.3, §7).

The output dicts are OpenAI-shaped and hold only what the renderers read: `developer` becomes
`system`, image parts take one shape, and fields a role does not use are dropped.
"""

from __future__ import annotations

from typing import Any

import json

import attrs

from waste.domain.errors import InvalidRequest
from waste.domain.requests.fields import (
    INVALID_VALUE,
    UNSUPPORTED,
    missing,
    parse_function_name,
    optional_str,
    shorten,
    wrong_type,
)
from waste.domain.requests.json_body import find_decoded_problem

ROLES = ("system", "developer", "user", "assistant", "tool")
IMAGE_PART_TYPES = ("image_url", "image")
# Legal OpenAI part types this server does not implement: `unsupported_value`, not `invalid_value`.
UNIMPLEMENTED_PART_TYPES = ("input_audio", "file", "refusal")


@attrs.frozen(kw_only=True)
class ImagePart:
    """One image part, located so the server can decode it and name it in errors.

    Attributes:
        url: the client's URL string, untouched (classify it with `image_kind`).
        param: the path of the URL field, e.g. `messages[0].content[1].image_url.url`.
        message_index: i in `messages[i]`.
        part_index: j in `messages[i].content[j]`.
    """

    url: str
    param: str
    message_index: int
    part_index: int

    @property
    def part_param(self) -> str:
        """The path of the whole part, `messages[i].content[j]` (for `vision_disabled`)."""
        return f"messages[{self.message_index}].content[{self.part_index}]"


def parse_messages(value: object) -> tuple[tuple[dict[str, Any], ...], tuple[ImagePart, ...]]:
    """Validate `messages` and normalise each one.

    Args:
        value: the body's `messages` value (None when absent or null).

    Returns:
        (messages, image_parts): the normalised messages, and every image part in order.

    Raises:
        InvalidRequest: for the first failing message, with the path of the failing field.
    """
    if value is None:
        raise missing("messages", "a non-empty array of messages")
    if type(value) is not list:
        raise wrong_type("messages", "an array of messages", value)
    if not value:
        raise InvalidRequest("messages must not be empty.", "messages", INVALID_VALUE)
    images: list[ImagePart] = []
    messages = tuple(_parse_message(message, i, images) for i, message in enumerate(value))
    return messages, tuple(images)


def _parse_message(message: object, i: int, images: list[ImagePart]) -> dict[str, Any]:
    path = f"messages[{i}]"
    if type(message) is not dict:
        raise wrong_type(path, "an object", message)
    role = message.get("role")
    if role is None:
        raise missing(f"{path}.role", "one of system, developer, user, assistant or tool")
    if type(role) is not str:
        raise wrong_type(f"{path}.role", "a string", role)
    if role not in ROLES:
        raise InvalidRequest(
            f"{path}.role must be system, developer, user, assistant or tool, not {shorten(role)}.",
            f"{path}.role",
            INVALID_VALUE,
        )
    # developer is folded into system (docs/XTML.md §5): the encoder itself would skip it silently.
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}

    content = message.get("content")
    if content is None:
        if role != "assistant":
            what = f"a {role} message needs content (a string or an array of parts)"
            raise missing(f"{path}.content", what)
        out["content"] = None
    elif type(content) is str:
        out["content"] = content
    elif type(content) is list:
        out["content"] = [_parse_part(part, i, j, role, images) for j, part in enumerate(content)]
    else:
        raise wrong_type(f"{path}.content", "a string or an array of content parts", content)

    name = optional_str(message, "name", f"{path}.name")
    if name is not None:
        out["name"] = name
    if role == "assistant":
        for key in ("reasoning_content", "reasoning"):
            text = optional_str(message, key, f"{path}.{key}")
            if text is not None:
                out[key] = text
        calls = message.get("tool_calls")
        if calls is not None:
            out["tool_calls"] = _parse_tool_calls(calls, f"{path}.tool_calls")
    elif role == "tool":
        call_id = optional_str(message, "tool_call_id", f"{path}.tool_call_id")
        if call_id is not None:
            out["tool_call_id"] = call_id
    return out


def _parse_part(part: object, i: int, j: int, role: str, images: list[ImagePart]) -> dict[str, Any]:
    path = f"messages[{i}].content[{j}]"
    if type(part) is not dict:
        raise wrong_type(path, "an object (a content part)", part)
    kind = part.get("type")
    if kind is None:
        raise missing(f"{path}.type", "a content part needs a type (text or image_url)")
    if type(kind) is not str:
        raise wrong_type(f"{path}.type", "a string", kind)
    if kind == "text":
        text = part.get("text")
        if text is None:
            raise missing(f"{path}.text", "a text part needs a string text")
        if type(text) is not str:
            raise wrong_type(f"{path}.text", "a string", text)
        return {"type": "text", "text": text}
    if kind in IMAGE_PART_TYPES:
        if role != "user":
            raise InvalidRequest(
                f"{path} is an image part in a {role} message;"
                " image parts are allowed in user messages only.",
                path,
                INVALID_VALUE,
            )
        url, param = _image_url(part, kind, path)
        images.append(ImagePart(url=url, param=param, message_index=i, part_index=j))
        return {"type": "image_url", "image_url": {"url": url}}
    if kind in UNIMPLEMENTED_PART_TYPES:
        raise InvalidRequest(
            f"{path}.type {kind!r} is not supported: content parts are text or image_url.",
            f"{path}.type",
            UNSUPPORTED,
        )
    raise InvalidRequest(
        f"{path}.type must be text or image_url, not {shorten(kind)}.", f"{path}.type", INVALID_VALUE
    )


def _image_url(part: dict[str, Any], kind: str, path: str) -> tuple[str, str]:
    """The URL of one of the three image part shapes (docs/HTTP.md §7), with its param path."""
    value = part.get(kind)
    if value is None:
        raise missing(f"{path}.{kind}", "an image part needs a URL")
    if type(value) is str:
        return value, f"{path}.{kind}"
    if kind == "image_url" and type(value) is dict:
        url = value.get("url")
        if url is None:
            raise missing(f"{path}.image_url.url", "an image_url part needs a url")
        if type(url) is not str:
            raise wrong_type(f"{path}.image_url.url", "a string", url)
        return url, f"{path}.image_url.url"
    expected = "a URL string or an object with a url" if kind == "image_url" else "a URL string"
    raise wrong_type(f"{path}.{kind}", expected, value)


def _parse_tool_calls(calls: object, path: str) -> list[dict[str, Any]]:
    if type(calls) is not list:
        raise wrong_type(path, "an array of tool calls", calls)
    return [_parse_tool_call(call, f"{path}[{j}]") for j, call in enumerate(calls)]


def _parse_tool_call(call: object, path: str) -> dict[str, Any]:
    if type(call) is not dict:
        raise wrong_type(path, "an object (a tool call)", call)
    out: dict[str, Any] = {}
    call_id = optional_str(call, "id", f"{path}.id")
    if call_id is not None:
        out["id"] = call_id
    kind = optional_str(call, "type", f"{path}.type")
    if kind is not None and kind != "function":
        raise InvalidRequest(
            f"{path}.type must be function, not {shorten(kind)}.", f"{path}.type", INVALID_VALUE
        )
    out["type"] = "function"
    function = call.get("function")
    if function is None:
        # docs/HTTP.md §2.3: a missing `function` is reported on the name it fails to supply.
        raise missing(f"{path}.function.name", "a tool call needs a function name")
    name = parse_function_name(function, path, "a tool call needs a function name")
    fn_out: dict[str, Any] = {"name": name}
    arguments = function.get("arguments")
    if arguments is not None:
        if type(arguments) is str:
            _check_argument_string(arguments, f"{path}.function.arguments")
        elif type(arguments) is not dict:
            raise wrong_type(f"{path}.function.arguments", "a JSON object string or an object", arguments)
        fn_out["arguments"] = arguments
    out["function"] = fn_out
    return out


def _check_argument_string(arguments: str, param: str) -> None:
    """Refuse a string the renderer would choke on; an unparseable one renders raw (docs/XTML.md §3.5).

    The renderer parses with plain `json.loads` (NaN allowed), so the same call decides here.
    """
    if not arguments.strip():
        return  # the renderer reads blank arguments as {}
    try:
        parsed = json.loads(arguments)
    except RecursionError:
        problem = "is nested too deeply"
    except json.JSONDecodeError:
        return  # the raw case
    except ValueError:
        problem = "holds a number with too many digits"  # CPython's int-digits cap
    else:
        if type(parsed) is not dict:
            raise InvalidRequest(
                f"{param} must encode a JSON object, not {_json_kind(parsed)}.", param, INVALID_VALUE
            )
        found = find_decoded_problem(arguments.encode("utf-8", "surrogatepass"), parsed)
        if found is None:
            return
        problem = found
    raise InvalidRequest(f"{param} {problem}.", param, INVALID_VALUE)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) in (int, float):
        return "a number"
    if type(value) is str:
        return "a string"
    return "an array"
