"""Server settings: every flag of docs/HTTP.md §9, each also read from ``WASTE_<FLAG>``.

Precedence: flag, then environment variable, then default. Bad values are a usage error
(exit 2) naming the flag or variable, never a silent default.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Mapping, Sequence

import attrs


class UsageError(ValueError):
    """A flag or environment variable has a bad value; the message names it."""


# Reader threads when --io-threads is not given: the disk's faster queue depths
# (docs/DECISIONS.md, "The server reads ahead by default").
DEFAULT_IO_THREADS = 4


@attrs.frozen(kw_only=True)
class Settings:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    model_id: str | None = None
    api_key: str | None = None
    budget: int = 0
    ctx: int = 0
    threads: int = 0
    # Reading ahead (docs/ENGINE.md §5): on by default, since a container larger than the
    # budget is what the engine is for; load_settings turns the lookahead off with
    # --io-threads 0 (it needs the readers).
    io_threads: int = DEFAULT_IO_THREADS
    lookahead: bool = True
    activations: str = "q8"  # the server's default; libwaste's own is f32 (docs/ENGINE.md §4.3)
    cpus: str | None = None
    cache: str = "layer"
    direct_io: bool = True
    vision: bool = False
    verify: bool = False
    exclusive_open: bool = False
    usage: str | None = None
    max_tokens: int = 4096
    thinking: bool = True
    allow_local_images: bool = False
    max_queue: int = 64
    prefix_cache: int | None = None  # bytes; None = a share of the budget (docs/ENGINE.md §2)
    # Tokens between the states stored inside a long prompt; 0 = none; None = the engine's
    # default (1024 for libwaste, 256 for the fake engine's short scripted prompts).
    prefix_interval: int | None = None
    cors_origins: tuple[str, ...] = ()
    log_level: str = "info"
    fake_engine: str | None = None
    # A remote engine (README "Scaling out"): vLLM's URL, its own API key (not --api-key,
    # which guards this server), the model id it serves, a chat.json for a vocabulary
    # without the XTML markers, and how many generations run at once.
    vllm: str | None = None
    vllm_api_key: str | None = None
    vllm_model: str | None = None
    chat_format: str | None = None
    max_concurrency: int | None = None  # None: 1 (libwaste, fake), DEFAULT_REMOTE_CONCURRENCY (vLLM)
    plan: bool = False
    version: bool = False
    # Fixed by docs/HTTP.md rather than flags; settings so tests can serve with short ones.
    keepalive_s: float = 10.0  # §4.3: an SSE comment after this long with nothing written
    body_timeout_s: float = 60.0  # §5: a body incomplete after this long is 408
    shutdown_grace_s: float = 10.0  # §6: the running generation's time at shutdown

    @property
    def served_model_id(self) -> str:
        if self.model_id:
            return self.model_id
        if self.vllm:
            return self.vllm_model or "vllm"
        if self.model:
            name = os.path.basename(os.path.normpath(self.model))
            return name[: -len(".waste")] if name.endswith(".waste") else name
        return "fake"


DEFAULT_REMOTE_CONCURRENCY = 16


def concurrency(settings: Settings) -> int:
    """Running generations at once: --max-concurrency for a remote engine, else 1."""
    if settings.vllm:
        return settings.max_concurrency or DEFAULT_REMOTE_CONCURRENCY
    return 1


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def parse_bool(text: str, where: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise UsageError(f"{where}: {text!r} is not a boolean (use 1/true/yes/on or 0/false/no/off)")


def parse_size(text: str, where: str) -> int:
    """``48G``, ``1.5T``, ``512M``, ``0``: K/M/G/T are powers of 1024, decimals allowed."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"{where}: {text!r} is not a size such as 48G, 512M or 0")
    scale = 1024 ** " KMGT".index(match[2].upper() or " ")
    return int(float(match[1]) * scale)


def _parse_int(text: str, where: str, minimum: int = 0, maximum: int | None = None) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise UsageError(f"{where}: {value} is out of range")
    return value


def _check_cpus(text: str, where: str) -> str:
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text):
        raise UsageError(f"{where}: {text!r} is not a CPU list such as 0-5,8")
    return text


# flag name -> (Settings field, parser); booleans listed separately.
_VALUED = {
    "host": ("host", lambda t, w: t),
    "port": ("port", lambda t, w: _parse_int(t, w, 0, 65535)),
    "model-id": ("model_id", lambda t, w: t or None),
    "api-key": ("api_key", lambda t, w: t or None),
    "budget": ("budget", parse_size),
    "prefix-cache": ("prefix_cache", parse_size),
    "prefix-interval": ("prefix_interval", lambda t, w: _parse_int(t, w, 0, 2**32 - 1)),
    "ctx": ("ctx", lambda t, w: _parse_int(t, w)),
    "threads": ("threads", lambda t, w: _parse_int(t, w)),
    "io-threads": ("io_threads", lambda t, w: _parse_int(t, w, 0, 64)),
    "activations": ("activations", lambda t, w: _choice(t, w, ("f32", "q8"))),
    "cpus": ("cpus", _check_cpus),
    "cache": ("cache", lambda t, w: _choice(t, w, ("layer", "lfru", "lru"))),
    "usage": ("usage", lambda t, w: t),
    "max-tokens": ("max_tokens", lambda t, w: _parse_int(t, w, 1)),
    "max-queue": ("max_queue", lambda t, w: _parse_int(t, w, 0)),
    "log-level": ("log_level", lambda t, w: _choice(t.lower(), w, ("debug", "info", "warning", "error"))),
    "vllm": ("vllm", lambda t, w: _check_url(t, w)),
    "vllm-api-key": ("vllm_api_key", lambda t, w: t or None),
    "vllm-model": ("vllm_model", lambda t, w: t or None),
    "chat-format": ("chat_format", lambda t, w: t or None),
    "max-concurrency": ("max_concurrency", lambda t, w: _parse_int(t, w, 1, 4096)),
}
# flag -> (field, value when the flag is given)
_SWITCHES = {
    "no-direct-io": ("direct_io", False), "vision": ("vision", True),
    "verify": ("verify", True), "exclusive-open": ("exclusive_open", True),
    "no-thinking": ("thinking", False), "allow-local-images": ("allow_local_images", True),
    "plan": ("plan", True), "version": ("version", True), "lookahead": ("lookahead", True),
    "no-lookahead": ("lookahead", False),
}
_NOT_FROM_ASGI_ENV = {"host", "port", "plan", "version"}


def _check_url(text: str, where: str) -> str:
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise UsageError(f"{where}: {text!r} is not an http(s) URL such as http://127.0.0.1:8001")
    return text.rstrip("/")


def _choice(text: str, where: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise UsageError(f"{where}: {text!r} is not one of {', '.join(choices)}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m waste",
        description="Serve a waste container (or the scripted fake engine) over an "
                    "OpenAI-compatible HTTP API. Every flag also reads WASTE_<FLAG>.")
    parser.add_argument("model", nargs="?", help="container directory (MODEL.waste)")
    for flag in _VALUED:
        parser.add_argument(f"--{flag}", dest=flag.replace("-", "_"), default=None)
    for flag in _SWITCHES:
        parser.add_argument(f"--{flag}", dest=flag.replace("-", "_"), action="store_true",
                            default=None)
    parser.add_argument("--cors-origin", dest="cors_origin", action="append", default=None,
                        help="allowed CORS origin (repeatable; * = any)")
    parser.add_argument("--fake-engine", dest="fake_engine", nargs="?", const="builtin",
                        default=None, help="serve the scripted fake engine (optional SCRIPT)")
    return parser


def load_settings(argv: Sequence[str] | None, env: Mapping[str, str], *,
                  asgi: bool = False) -> Settings:
    """Settings from ``argv`` (None for ASGI: environment only) and ``env``.

    Raises:
        UsageError: a bad value, naming the flag or the variable.
    """
    args = vars(build_parser().parse_args(argv)) if argv is not None else {}
    values: dict = {}
    for flag, (field, parse) in _VALUED.items():
        values.update(_one(flag, field, parse, args, env, asgi))
    for flag, (field, on_value) in _SWITCHES.items():
        if args.get(flag.replace("-", "_")):
            values[field] = on_value
        elif not (asgi and flag in _NOT_FROM_ASGI_ENV) and f"WASTE_{_var(flag)}" in env:
            if parse_bool(env[f"WASTE_{_var(flag)}"], f"WASTE_{_var(flag)}"):
                values[field] = on_value
    origins = args.get("cors_origin")
    if origins is None and env.get("WASTE_CORS_ORIGIN"):
        origins = [o.strip() for o in env["WASTE_CORS_ORIGIN"].split(",") if o.strip()]
    values["cors_origins"] = tuple(origins or ())
    fake = args.get("fake_engine") or env.get("WASTE_FAKE_ENGINE") or None
    values["fake_engine"] = fake
    values["model"] = args.get("model") or env.get("WASTE_MODEL") or None
    _check_engine_choice(values, fake, asgi)
    if values["model"] is None and fake is None and not values.get("vllm") \
            and not values.get("version"):
        raise UsageError("MODEL is required (a container directory), or pass --fake-engine "
                         "or --vllm URL")
    _check_threads_fit(values.get("threads", 0), values.get("cpus"))
    _check_lookahead(values)
    return Settings(**values)


# What only libwaste does: meaningless in front of vLLM, so refused there by name.
_NATIVE_ONLY = (("budget", "budget"), ("prefix-cache", "prefix_cache"),
                ("prefix-interval", "prefix_interval"), ("threads", "threads"),
                ("io-threads", "io_threads"), ("cpus", "cpus"), ("cache", "cache"),
                ("usage", "usage"), ("lookahead", "lookahead"), ("no-lookahead", "lookahead"),
                ("no-direct-io", "direct_io"),
                ("verify", "verify"), ("exclusive-open", "exclusive_open"), ("vision", "vision"))


def _given(flag: str, field: str, values: dict) -> bool:
    """Whether ``flag`` set ``field``: a valued flag when the field is set at all, a switch
    when it holds the switch's value (--lookahead and --no-lookahead share one field)."""
    if field not in values:
        return False
    return flag not in _SWITCHES or values[field] == _SWITCHES[flag][1]


def _check_engine_choice(values: dict, fake: str | None, asgi: bool) -> None:
    """One engine; the remote-only flags only with --vllm (a flag that does nothing is an error)."""
    if values.get("vllm"):
        if values["model"] is not None or fake is not None:
            raise UsageError("--vllm serves a remote engine: give no MODEL and no --fake-engine")
        native = [flag for flag, field in _NATIVE_ONLY if _given(flag, field, values)]
        if native:
            raise UsageError(f"--{native[0]} applies to libwaste, not to --vllm (vLLM sizes, "
                             "places and caches the model itself, with its own flags)")
        if asgi and not values.get("vllm_model"):
            raise UsageError("WASTE_VLLM needs WASTE_VLLM_MODEL under an ASGI server (the "
                             "model id cannot be asked of vLLM before serving)")
        return
    for flag in ("vllm-api-key", "vllm-model", "chat-format", "max-concurrency"):
        if values.get(flag.replace("-", "_")) is not None:
            raise UsageError(f"--{flag} needs --vllm (libwaste runs one generation at a time "
                             "and reads its chat format from the container)")


def _check_lookahead(values: dict) -> None:
    """The lookahead's guesses are read by the reader threads: with --io-threads 0 it is off
    unless asked for, and asked for it is a usage error (libwaste would refuse it at open)."""
    if values.get("io_threads", DEFAULT_IO_THREADS) > 0:
        return
    if values.get("lookahead"):
        raise UsageError("--lookahead needs --io-threads >= 1 (its guesses are read by the "
                         "reader threads); give --no-lookahead or a reader count")
    values["lookahead"] = False


def _check_threads_fit(threads: int, cpus: str | None) -> None:
    """--threads must fit --cpus: said before anything binds or loads (libwaste would refuse
    it only once the engine opens, after "listening on" was printed)."""
    if not cpus:
        return
    listed: set[int] = set()
    for part in cpus.split(","):
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise UsageError(f"--cpus: the range {part!r} runs backwards")
        listed.update(range(lo, hi + 1))
    if threads > len(listed):
        raise UsageError(f"--threads {threads} exceeds the {len(listed)} CPUs of --cpus {cpus}")


def _var(flag: str) -> str:
    return flag.upper().replace("-", "_")


def _one(flag, field, parse, args, env, asgi) -> dict:
    given = args.get(flag.replace("-", "_"))
    if given is not None:
        return {field: parse(given, f"--{flag}")}
    if asgi and flag in _NOT_FROM_ASGI_ENV:
        return {}
    name = f"WASTE_{_var(flag)}"
    if name in env:
        return {field: parse(env[name], name)}
    return {}
