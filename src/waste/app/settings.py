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
    io_threads: int = 0
    lookahead: bool = False
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
    cors_origins: tuple[str, ...] = ()
    log_level: str = "info"
    fake_engine: str | None = None
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
        if self.model:
            name = os.path.basename(os.path.normpath(self.model))
            return name[: -len(".waste")] if name.endswith(".waste") else name
        return "fake"


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
}
# flag -> (field, value when the flag is given)
_SWITCHES = {
    "no-direct-io": ("direct_io", False), "vision": ("vision", True),
    "verify": ("verify", True), "exclusive-open": ("exclusive_open", True),
    "no-thinking": ("thinking", False), "allow-local-images": ("allow_local_images", True),
    "plan": ("plan", True), "version": ("version", True), "lookahead": ("lookahead", True),
}
_NOT_FROM_ASGI_ENV = {"host", "port", "plan", "version"}


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
    if values["model"] is None and fake is None and not values.get("version"):
        raise UsageError("MODEL is required (a container directory), or pass --fake-engine")
    _check_threads_fit(values.get("threads", 0), values.get("cpus"))
    return Settings(**values)


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
