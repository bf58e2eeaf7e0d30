"""OpenAI request bodies → frozen, validated requests (docs/HTTP.md §2; docs/XTML.md §5 server mapping).

`parse_chat_request` and `parse_completion_request` check fields in the spec's table order and
raise `InvalidRequest` for the first failure. Unknown fields are ignored whatever their type.
"""

from __future__ import annotations

from typing import Any

import attrs

from waste.domain.errors import InvalidRequest
from waste.domain.requests.fields import (
    INVALID_TYPE,
    INVALID_VALUE,
    UNSUPPORTED,
    MAX_TOP_LOGPROBS,
    image_kind,
    is_integer,
    local_image_path,
    missing,
    optional_bool,
    optional_object,
    parse_function_name,
    parse_include_usage,
    parse_choice_count,
    parse_only_one,
    parse_priority,
    parse_seed,
    parse_stop,
    parse_temperature,
    parse_token_cap,
    parse_top_k,
    parse_top_logprobs,
    parse_penalties,
    parse_logit_bias,
    parse_top_p,
    shorten,
    wrong_type,
)
from waste.domain.requests.json_body import parse_json_body
from waste.domain.requests.messages import ImagePart, parse_messages
from waste.domain.requests.thinking import ThinkingChoice, parse_thinking, resolve_thinking

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "ImagePart",
    "ThinkingChoice",
    "image_kind",
    "local_image_path",
    "parse_chat_request",
    "parse_completion_request",
    "parse_json_body",
    "resolve_thinking",
]

TOOL_CHOICES = ("auto", "none", "required")
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


@attrs.frozen(kw_only=True)
class GenerationFields:
    """The sampling, stopping and streaming fields both completion routes share."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    n: int = 1  # choices, generated one after another from the one prompt
    priority: int = 0  # the queue's order: lower runs sooner (docs/HTTP.md §2.1)


@attrs.frozen(kw_only=True)
class ChatRequest(GenerationFields):
    """A validated `/v1/chat/completions` request, normalised for the renderers.

    Attributes:
        messages: OpenAI-shaped dicts: `developer` folded into `system`; content a str, None
            (assistant only) or a list of `{"type":"text","text"}` and
            `{"type":"image_url","image_url":{"url"}}` parts; `name`, assistant
            `reasoning_content`/`reasoning`/`tool_calls` (arguments as the client sent them:
            string or object), tool `tool_call_id`. Nothing else.
        tools: the tool objects exactly as given, or None for absent, null or `[]`.
        tool_choice: None, "auto", "none" or "required"; a named function gives "required"
            (docs/XTML.md §5) and sets `tool_choice_function`.
        tool_choice_function: the function a named `tool_choice` names (declared in `tools`).
        response_format: None for absent or `{"type":"text"}`; else `{"type"}` plus
            `json_schema` when the client sent one.
        temperature, top_p, top_k: with the spec defaults 1.0, 1.0 and 0 applied.
        seed: reduced mod 2**64, or None (the server draws one).
        max_tokens: `max_completion_tokens` if given, else `max_tokens`, else None.
        stop: the stop strings, possibly empty.
        stream: SSE requested.
        include_usage: `stream_options.include_usage`, and only when streaming.
        logprobs: sampled-token logprobs requested.
        thinking: what the request asked; apply the server default with `resolve_thinking`.
        image_parts: every image part in message order, for decoding after the format checks.
    """

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | None = None
    tool_choice_function: str | None = None
    response_format: dict[str, Any] | None = None
    thinking: ThinkingChoice = ThinkingChoice()
    image_parts: tuple[ImagePart, ...] = ()


@attrs.frozen(kw_only=True)
class CompletionRequest(GenerationFields):
    """A validated `/v1/completions` request (docs/HTTP.md §2.6); fields as in `ChatRequest`."""

    prompt: str


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    """Validate a decoded chat body in docs/HTTP.md §2.2 table order.

    Args:
        body: the object `parse_json_body` returned.

    Returns:
        The validated, normalised request.

    Raises:
        InvalidRequest: the first failing field, with its path and code.
    """
    messages, image_parts = parse_messages(body.get("messages"))
    tools = parse_tools(body.get("tools"))
    tool_choice, tool_choice_function = parse_tool_choice(body.get("tool_choice"), tools)
    response_format = parse_response_format(body.get("response_format"))
    temperature = parse_temperature(body)
    top_p = parse_top_p(body)
    top_k = parse_top_k(body)
    seed = parse_seed(body)
    priority = parse_priority(body)
    completion_cap = parse_token_cap(body, "max_completion_tokens")
    legacy_cap = parse_token_cap(body, "max_tokens")  # checked even when the other wins
    stop = parse_stop(body)
    n = parse_choice_count(body)
    stream = optional_bool(body, "stream") or False
    logprobs = optional_bool(body, "logprobs") or False
    include_usage = parse_include_usage(body, stream=stream)
    top_logprobs = parse_top_logprobs(body, logprobs=logprobs)
    presence, frequency, repetition, min_p = parse_penalties(body)
    logit_bias = parse_logit_bias(body)
    thinking = parse_thinking(body)
    _refuse_legacy_functions(body)
    return ChatRequest(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        tool_choice_function=tool_choice_function,
        response_format=response_format,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        priority=priority,
        n=n,
        max_tokens=completion_cap if completion_cap is not None else legacy_cap,
        stop=stop,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        min_p=min_p,
        logit_bias=logit_bias,
        thinking=thinking,
        image_parts=image_parts,
    )


def _refuse_legacy_functions(body: dict[str, Any]) -> None:
    """`functions` / `function_call`, OpenAI's deprecated tool fields: refused, never ignored."""
    for key in ("functions", "function_call"):
        if body.get(key) is not None:
            raise InvalidRequest(
                f"{key} is not supported (it is OpenAI's deprecated form): use tools and tool_choice.",
                key,
                UNSUPPORTED,
            )


def parse_tools(value: object) -> tuple[dict[str, Any], ...] | None:
    """`tools`: function tools, passed through whole; None for absent, null or `[]`."""
    if value is None:
        return None
    if type(value) is not list:
        raise wrong_type("tools", "an array of tools", value)
    for i, tool in enumerate(value):
        path = f"tools[{i}]"
        if type(tool) is not dict:
            raise wrong_type(path, "an object (a tool)", tool)
        kind = tool.get("type")
        if kind is None:
            raise missing(f"{path}.type", 'a tool needs "type": "function"')
        if type(kind) is not str:
            raise wrong_type(f"{path}.type", "a string", kind)
        if kind != "function":
            raise InvalidRequest(
                f"{path}.type must be function, not {shorten(kind)}.", f"{path}.type", INVALID_VALUE
            )
        function = tool.get("function")
        if function is None:
            raise missing(f"{path}.function", "a function tool needs a function object")
        parse_function_name(function, path, "a function needs a name")
        description = function.get("description")
        if description is not None and type(description) is not str:
            raise wrong_type(f"{path}.function.description", "a string", description)
        optional_object(function, "parameters", f"{path}.function.parameters")
    return tuple(value) or None


def parse_tool_choice(value: object, tools: tuple[dict[str, Any], ...] | None) -> tuple[str | None, str | None]:
    """`tool_choice` as (choice, function name); every error's param is `tool_choice`.

    A named function becomes ("required", name): docs/XTML.md §5 renders it as `required` plus a
    message naming the function, and the name must be declared in `tools`.
    """
    if value is None:
        return None, None
    if type(value) is str:
        if value not in TOOL_CHOICES:
            raise InvalidRequest(
                f"tool_choice must be auto, none, required or a function object, not {shorten(value)}.",
                "tool_choice",
                INVALID_VALUE,
            )
        return value, None
    if type(value) is not dict:
        raise wrong_type("tool_choice", "a string or an object", value)
    function = value.get("function")
    if value.get("type") != "function" or type(function) is not dict or type(function.get("name")) is not str:
        raise InvalidRequest(
            'tool_choice must be auto, none, required or {"type":"function","function":{"name":...}}.',
            "tool_choice",
            INVALID_VALUE,
        )
    name = function["name"]
    declared = {tool["function"]["name"] for tool in tools or ()}
    if name not in declared:
        raise InvalidRequest(
            f"tool_choice names the function {shorten(name)}, which tools does not declare.",
            "tool_choice",
            INVALID_VALUE,
        )
    return "required", name


def parse_response_format(value: object) -> dict[str, Any] | None:
    """`response_format`: None for absent or `text`; else `{"type"}` (+ `json_schema`)."""
    if value is None:
        return None
    if type(value) is not dict:
        raise wrong_type("response_format", "an object", value)
    kind = value.get("type")
    if kind is None:
        raise missing("response_format.type", "text, json_object or json_schema")
    if type(kind) is not str:
        raise wrong_type("response_format.type", "a string", kind)
    if kind not in RESPONSE_FORMAT_TYPES:
        raise InvalidRequest(
            f"response_format.type must be text, json_object or json_schema, not {shorten(kind)}.",
            "response_format.type",
            INVALID_VALUE,
        )
    schema = optional_object(value, "json_schema", "response_format.json_schema")
    if kind == "text":
        return None
    if kind == "json_schema" and schema is not None:
        # Checked here: only an object schema reaches the grammar compiler (a boolean made it raise).
        optional_object(schema, "schema", "response_format.json_schema.schema")
        return {"type": kind, "json_schema": schema}
    return {"type": kind}


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    """Validate a decoded `/v1/completions` body (docs/HTTP.md §2.6).

    Checks `prompt`, then the shared fields in chat order, then `logprobs`, `echo`, `suffix`
    and `best_of`. Fields chat has but §2.6 does not list (`max_completion_tokens`) are ignored.

    Raises:
        InvalidRequest: the first failing field, with its path and code.
    """
    prompt = _parse_prompt(body.get("prompt"))
    temperature = parse_temperature(body)
    top_p = parse_top_p(body)
    top_k = parse_top_k(body)
    seed = parse_seed(body)
    priority = parse_priority(body)
    max_tokens = parse_token_cap(body, "max_tokens")
    stop = parse_stop(body)
    n = parse_choice_count(body)
    stream = optional_bool(body, "stream") or False
    include_usage = parse_include_usage(body, stream=stream)
    top_logprobs = _parse_completion_logprobs(body.get("logprobs"))
    logprobs = top_logprobs is not None
    presence, frequency, repetition, min_p = parse_penalties(body)
    logit_bias = parse_logit_bias(body)
    if optional_bool(body, "echo"):
        raise InvalidRequest(
            "echo=true is not supported: the prompt is never repeated; send echo=false.", "echo", UNSUPPORTED
        )
    suffix = body.get("suffix")
    if suffix is not None:
        if type(suffix) is not str:
            raise wrong_type("suffix", "a string or null", suffix)
        raise InvalidRequest(
            "suffix is not supported (no insertion mode); leave it out or send null.", "suffix", UNSUPPORTED
        )
    parse_only_one(body, "best_of")
    return CompletionRequest(
        prompt=prompt,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        priority=priority,
        n=n,
        max_tokens=max_tokens,
        stop=stop,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        min_p=min_p,
        logit_bias=logit_bias,
    )


def _parse_prompt(value: object) -> str:
    """`prompt`: a string or a one-string list; token arrays are `invalid_type`."""
    if value is None:
        raise missing("prompt", "a string")
    if type(value) is list:
        if not value:
            raise InvalidRequest("prompt must not be an empty array.", "prompt", INVALID_VALUE)
        if all(type(item) is str for item in value):
            if len(value) > 1:
                raise InvalidRequest(
                    f"prompt holds {len(value)} strings; one prompt per request is supported.",
                    "prompt",
                    UNSUPPORTED,
                )
            value = value[0]
        else:
            raise InvalidRequest(
                "prompt must be a string (or an array of one string); token arrays are not accepted.",
                "prompt",
                INVALID_TYPE,
            )
    if type(value) is not str:
        raise wrong_type("prompt", "a string", value)
    if not value:
        # No BOS is added on this route, so an empty prompt leaves the engine nothing to continue.
        raise InvalidRequest("prompt must not be empty.", "prompt", INVALID_VALUE)
    return value


def _parse_completion_logprobs(value: object) -> int | None:
    """Completions `logprobs`: None (absent), or an integer 0-20: the sampled token's logprob,
    plus that many alternatives per token in `top_logprobs`."""
    if value is None:
        return None
    if not is_integer(value):
        raise wrong_type("logprobs", "an integer", value)
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, not {shorten(value)}.",
                             "logprobs", INVALID_VALUE)
    return value