"""Field checks shared by both completion routes (docs/HTTP.md §0, §2.2, §2.6, §7 sources).

Every check reads one field, treats null as absent, and raises `InvalidRequest` with the
OpenAI-style code and the field's path. An integer is `type(x) is int`: booleans never count,
and json decodes `1.0` and `1e3` as floats, so neither is an integer.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from urllib.parse import unquote, urlsplit

from waste.domain.errors import InvalidRequest
from waste.domain.requests.json_body import describe_json

MISSING = "missing_required_parameter"
INVALID_TYPE = "invalid_type"
INVALID_VALUE = "invalid_value"
UNSUPPORTED = "unsupported_value"

MAX_STOP_STRINGS = 4
MAX_TOP_K = 2**31 - 1
SEED_LOW = -(2**63)
SEED_SPAN = 2**64
MAX_TOP_LOGPROBS = 20


def is_integer(value: object) -> TypeGuard[int]:
    """True for a JSON integer: an int that is not a bool (json gives floats for 1.0 and 1e3)."""
    return type(value) is int


def is_number(value: object) -> bool:
    """True for any JSON number; booleans are not numbers."""
    return type(value) in (int, float)


def wrong_type(param: str, expected: str, value: object) -> InvalidRequest:
    """The `invalid_type` error for `param`, naming what was expected and what came."""
    return InvalidRequest(f"{param} must be {expected}, not {describe_json(value)}.", param, INVALID_TYPE)


def missing(param: str, what: str) -> InvalidRequest:
    """The `missing_required_parameter` error for `param`."""
    return InvalidRequest(f"{param} is required: {what}.", param, MISSING)


def parse_function_name(function: object, path: str, what: str) -> str:
    """The non-empty ``name`` of a tool's or tool call's ``function`` object at ``path``.

    ``what`` completes the missing-name message (e.g. "a function needs a name").
    """
    if type(function) is not dict:
        raise wrong_type(f"{path}.function", "an object", function)
    name = function.get("name")
    param = f"{path}.function.name"
    if name is None:
        raise missing(param, what)
    if type(name) is not str:
        raise wrong_type(param, "a string", name)
    if not name:
        raise InvalidRequest(f"{param} must not be empty.", param, INVALID_VALUE)
    return name


def shorten(value: object, limit: int = 40) -> str:
    """repr() of a client value, cut short so an error message never carries a whole payload."""
    if type(value) is str and len(value) > limit:
        value = value[:limit]  # never repr a whole payload just to cut it
    try:
        text = repr(value)
    except ValueError:  # CPython refuses to print ints over 4300 digits
        return "a very large integer"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def optional_bool(body: dict[str, Any], key: str, param: str | None = None) -> bool | None:
    """A boolean field, or None when absent or null."""
    value = body.get(key)
    if value is not None and type(value) is not bool:
        raise wrong_type(param or key, "a boolean", value)
    return value


def optional_str(body: dict[str, Any], key: str, param: str) -> str | None:
    """A string field, or None when absent or null."""
    value = body.get(key)
    if value is not None and type(value) is not str:
        raise wrong_type(param, "a string", value)
    return value


def optional_object(body: dict[str, Any], key: str, param: str | None = None) -> dict[str, Any] | None:
    """An object field, or None when absent or null."""
    value = body.get(key)
    if value is not None and type(value) is not dict:
        raise wrong_type(param or key, "an object", value)
    return value


def parse_temperature(body: dict[str, Any]) -> float:
    """`temperature`: a number in [0, 2]; default 1, and 0 means greedy."""
    value = body.get("temperature")
    if value is None:
        return 1.0
    if not is_number(value):
        raise wrong_type("temperature", "a number", value)
    if not 0 <= value <= 2:
        raise InvalidRequest(
            f"temperature must be between 0 and 2, not {shorten(value)}.", "temperature", INVALID_VALUE
        )
    return float(value)


def parse_top_p(body: dict[str, Any]) -> float:
    """`top_p`: a number with 0 < p <= 1; default 1."""
    value = body.get("top_p")
    if value is None:
        return 1.0
    if not is_number(value):
        raise wrong_type("top_p", "a number", value)
    if not 0 < value <= 1:
        raise InvalidRequest(
            f"top_p must be greater than 0 and at most 1, not {shorten(value)}.", "top_p", INVALID_VALUE
        )
    return float(value)


def parse_top_k(body: dict[str, Any]) -> int:
    """`top_k`: an integer from 0 to 2**31 - 1; default 0, which turns it off."""
    value = body.get("top_k")
    if value is None:
        return 0
    if not is_integer(value):
        raise wrong_type("top_k", "an integer", value)
    if not 0 <= value <= MAX_TOP_K:
        raise InvalidRequest(
            f"top_k must be between 0 and {MAX_TOP_K}, not {shorten(value)}.", "top_k", INVALID_VALUE
        )
    return value


def parse_seed(body: dict[str, Any]) -> int | None:
    """`seed`: an integer in [-2**63, 2**64), returned reduced mod 2**64; None when absent."""
    value = body.get("seed")
    if value is None:
        return None
    if not is_integer(value):
        raise wrong_type("seed", "an integer", value)
    if not SEED_LOW <= value < SEED_SPAN:
        raise InvalidRequest(
            f"seed must be an integer from -2**63 to 2**64 - 1, not {shorten(value)}.", "seed", INVALID_VALUE
        )
    return value % SEED_SPAN


PRIORITY_LIMIT = 2**63


def parse_priority(body: dict[str, Any]) -> int:
    """`priority` (vLLM's convention): an integer, lower runs sooner; 0 when absent or null."""
    value = body.get("priority")
    if value is None:
        return 0
    if not is_integer(value):
        raise wrong_type("priority", "an integer", value)
    if not -PRIORITY_LIMIT <= value < PRIORITY_LIMIT:
        raise InvalidRequest(
            f"priority must be an integer from -2**63 to 2**63 - 1, not {shorten(value)}.", "priority",
            INVALID_VALUE)
    return value


def parse_token_cap(body: dict[str, Any], key: str) -> int | None:
    """`max_tokens` / `max_completion_tokens`: an integer >= 1, or None when absent.

    No upper bound here: the server clamps to the room left in the context.
    """
    value = body.get(key)
    if value is None:
        return None
    if not is_integer(value):
        raise wrong_type(key, "an integer", value)
    if value < 1:
        raise InvalidRequest(f"{key} must be at least 1, not {shorten(value)}.", key, INVALID_VALUE)
    return value


def parse_stop(body: dict[str, Any]) -> tuple[str, ...]:
    """`stop`: a non-empty string, or a list of 0-4 non-empty strings (`stop[i]`)."""
    value = body.get("stop")
    if value is None:
        return ()
    if type(value) is str:
        if not value:
            raise InvalidRequest("stop must not be an empty string.", "stop", INVALID_VALUE)
        return (value,)
    if type(value) is not list:
        raise wrong_type("stop", "a string or an array of strings", value)
    if len(value) > MAX_STOP_STRINGS:
        raise InvalidRequest(
            f"stop holds at most {MAX_STOP_STRINGS} strings, not {len(value)}.", "stop", INVALID_VALUE
        )
    for i, item in enumerate(value):
        if type(item) is not str:
            raise wrong_type(f"stop[{i}]", "a string", item)
        if not item:
            raise InvalidRequest(f"stop[{i}] must not be an empty string.", f"stop[{i}]", INVALID_VALUE)
    return tuple(value)


def parse_only_one(body: dict[str, Any], key: str) -> None:
    """`best_of`: an integer that must be 1 (no server-side ranking of choices)."""
    value = body.get(key)
    if value is None:
        return
    if not is_integer(value):
        raise wrong_type(key, "an integer", value)
    if value != 1:
        raise InvalidRequest(
            f"{key}={shorten(value)} is not supported: this server returns exactly one choice;"
            f" send {key}=1 or leave it out.",
            key,
            UNSUPPORTED,
        )


MAX_CHOICES = 8


def parse_choice_count(body: dict[str, Any]) -> int:
    """`n`: how many choices to generate, an integer from 1 to 8 (default 1)."""
    value = body.get("n")
    if value is None:
        return 1
    if not is_integer(value):
        raise wrong_type("n", "an integer", value)
    if not 1 <= value <= MAX_CHOICES:
        raise InvalidRequest(f"n must be an integer from 1 to {MAX_CHOICES}, not {shorten(value)}.",
                             "n", INVALID_VALUE)
    return int(value)


def parse_include_usage(body: dict[str, Any], *, stream: bool) -> bool:
    """`stream_options.include_usage`: read and validated only when streaming.

    docs/HTTP.md §2.2 says `stream_options` is ignored unless streaming, so a blocking request's
    `stream_options` is not looked at, whatever its shape.
    """
    if not stream:
        return False
    options = optional_object(body, "stream_options")
    if options is None:
        return False
    include_usage = optional_bool(options, "include_usage", "stream_options.include_usage")
    return bool(include_usage)


def parse_top_logprobs(body: dict[str, Any], *, logprobs: bool) -> int:
    """`top_logprobs`: an integer 0-20 (default 0); >= 1 needs `logprobs: true` (OpenAI's rule)."""
    value = body.get("top_logprobs")
    if value is None:
        return 0
    if not is_integer(value):
        raise wrong_type("top_logprobs", "an integer", value)
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, not {shorten(value)}.",
            "top_logprobs",
            INVALID_VALUE,
        )
    if value >= 1 and not logprobs:
        raise InvalidRequest("top_logprobs needs logprobs set to true.", "top_logprobs", INVALID_VALUE)
    return value


def image_kind(url: str) -> str:
    """Classify an image URL by source (docs/HTTP.md §7), without decoding or fetching anything.

    Returns:
        "data" for a `data:` URL; "remote" for http(s) in any case; "local" for `file://` with an
        empty host or `localhost`, or an absolute path; "invalid" for anything else.
    """
    scheme, sep, _ = url.partition(":")
    lowered = scheme.lower()
    if sep and lowered == "data":
        return "data"
    if sep and lowered in ("http", "https") and url[len(scheme) + 1 :].startswith("//"):
        return "remote"
    if sep and lowered == "file" and url[len(scheme) + 1 :].startswith("//"):
        try:
            host = urlsplit(url).netloc.lower()
        except ValueError:  # e.g. an unclosed IPv6 bracket
            return "invalid"
        return "local" if host in ("", "localhost") else "invalid"
    if url.startswith("/"):
        return "local"
    return "invalid"


def local_image_path(url: str) -> str:
    """The filesystem path of a URL that `image_kind` calls "local".

    A `file://` URL is percent-decoded (`file:///a%20b.png` is `/a b.png`); a bare absolute path
    is returned unchanged.

    Raises:
        ValueError: the URL is not a local image URL.
    """
    if image_kind(url) != "local":
        raise ValueError("not a local image URL")
    if url.startswith("/"):
        return url
    return unquote(urlsplit(url).path)


def _bounded_number(body: dict[str, Any], key: str, default: float, low: float, high: float,
                    *, open_low: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not is_number(value):
        raise wrong_type(key, "a number", value)
    if not (low < value <= high if open_low else low <= value <= high):
        bound = f"greater than {low:g}" if open_low else f"at least {low:g}"
        raise InvalidRequest(f"{key} must be {bound} and at most {high:g}, not {shorten(value)}.",
                             key, INVALID_VALUE)
    return float(value)


def parse_penalties(body: dict[str, Any]) -> tuple[float, float, float, float]:
    """`presence_penalty` and `frequency_penalty` (OpenAI: numbers in [-2, 2], default 0),
    `repetition_penalty` (vLLM: > 0, at most 10 here, default 1) and `min_p` (vLLM: [0, 1],
    default 0). Returns (presence, frequency, repetition, min_p)."""
    return (_bounded_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            _bounded_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            _bounded_number(body, "repetition_penalty", 1.0, 0.0, 10.0, open_low=True),
            _bounded_number(body, "min_p", 0.0, 0.0, 1.0))


MAX_LOGIT_BIAS = 300


def parse_logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """`logit_bias` (OpenAI): an object from token ids (decimal strings) to numbers in
    [-100, 100], at most 300 entries; returned sorted by id. The ids are checked against the
    vocabulary where it is known (`check_logit_bias_ids`)."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if type(value) is not dict:
        raise wrong_type("logit_bias", "an object mapping token ids to numbers", value)
    if len(value) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"logit_bias has {len(value)} entries; at most {MAX_LOGIT_BIAS} are allowed.",
                             "logit_bias", INVALID_VALUE)
    out: list[tuple[int, float]] = []
    for key, bias in value.items():
        path = f"logit_bias.{key[:40]}"
        if not (key.isascii() and key.isdigit()) or len(key) > 10:
            raise InvalidRequest(f"logit_bias keys must be token ids (non-negative integers), not {shorten(key)}.",
                                 path, INVALID_VALUE)
        if not is_number(bias):
            raise wrong_type(path, "a number", bias)
        if not -100 <= bias <= 100:
            raise InvalidRequest(f"{path} must be between -100 and 100, not {shorten(bias)}.", path, INVALID_VALUE)
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def check_logit_bias_ids(logit_bias: tuple[tuple[int, float], ...], vocab: int) -> None:
    """Every `logit_bias` id must be < vocab (the model's logit rows)."""
    for token, _ in logit_bias:
        if token >= vocab:
            raise InvalidRequest(f"logit_bias.{token}: token id {token} is outside the vocabulary (0..{vocab - 1}).",
                                 f"logit_bias.{token}", INVALID_VALUE)
