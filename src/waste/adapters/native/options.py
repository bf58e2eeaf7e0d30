"""Open-time options for libwaste: ``NativeOptions`` mirrors ``waste_cfg`` field for field.

``NativeOptions.from_settings`` reads the server's flags (docs/HTTP.md §9) from any object that
has them as attributes, so the composition root never touches cffi types.
"""

from __future__ import annotations

from typing import Any

import attrs

CACHE_POLICIES = ("layer", "lfru", "lru")
# cfg.kernels: 0 auto, 1 generic, 2 avx2, 3 avx512 (a set the CPU lacks is E_UNSUPPORTED at open).
KERNELS = ("auto", "generic", "avx2", "avx512")
# cfg.activations: "f32" exact (the reference), "q8" int8 per block of 32 for int8/int4/mxfp4
# weights (docs/ENGINE.md §4.3).
ACTIVATIONS = ("f32", "q8")
_U32 = 2**32 - 1
# Tokens between the prefix-cache states stored inside a long prompt (docs/ENGINE.md §2).
DEFAULT_PREFIX_INTERVAL = 1024
_U64 = 2**64 - 1


def _unsigned(limit: int):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise ValueError(f"{attribute.name} must be an integer in 0..{limit}, got {value!r}")
    return check


def _one_of(choices: tuple[str, ...]):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(choices)}, got {value!r}")
    return check


def _optional_size(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _unsigned(_U64)(instance, attribute, value)


def _flag(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name} must be a bool, got {value!r}")


def _optional_text(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or "\0" in value):
        raise ValueError(f"{attribute.name} must be a string without NUL or None, got {value!r}")


@attrs.frozen(kw_only=True)
class NativeOptions:
    """``waste_cfg`` as a value; defaults are the library's (docs/ENGINE.md §2).

    ``ctx_tokens`` 0 means 4096, ``ram_budget_bytes`` 0 the automatic budget, ``n_threads``
    0 one per allowed CPU, ``usage_path`` None ``<container>/usage.waste`` and "" none.
    """

    ctx_tokens: int = attrs.field(default=0, validator=_unsigned(_U32))
    ram_budget_bytes: int = attrs.field(default=0, validator=_unsigned(_U64))
    n_threads: int = attrs.field(default=0, validator=_unsigned(_U32))
    cache_policy: str = attrs.field(default="layer", validator=_one_of(CACHE_POLICIES))
    cpu_list: str | None = attrs.field(default=None, validator=_optional_text)
    direct_io: bool = attrs.field(default=True, validator=_flag)
    verify: bool = attrs.field(default=False, validator=_flag)
    vision: bool = attrs.field(default=False, validator=_flag)
    exclusive_open: bool = attrs.field(default=False, validator=_flag)
    usage_path: str | None = attrs.field(default=None, validator=_optional_text)
    prefill_chunk: int = attrs.field(default=0, validator=_unsigned(_U32))
    io_threads: int = attrs.field(default=0, validator=_unsigned(_U32))
    lookahead: int = attrs.field(default=0, validator=_unsigned(_U32))
    tokenizer_only: bool = attrs.field(default=False, validator=_flag)
    kernels: str = attrs.field(default="auto", validator=_one_of(KERNELS))
    activations: str = attrs.field(default="f32", validator=_one_of(ACTIVATIONS))
    # Not waste_cfg fields: the adapter's prefix cache (docs/ENGINE.md §2 "Prefix cache").
    # Bytes taken out of ram_budget_bytes for stored states; 0 off, None the default share.
    prefix_cache: int | None = attrs.field(default=0, validator=_optional_size)
    # Tokens between the states stored inside a long prompt.
    prefix_interval: int = attrs.field(default=DEFAULT_PREFIX_INTERVAL, validator=_unsigned(_U32))

    @classmethod
    def from_settings(cls, settings: Any) -> "NativeOptions":
        """Options from an object carrying the server's flags as attributes (docs/HTTP.md §9).

        Reads ``budget`` (bytes), ``ctx``, ``threads``, ``cpus`` (str or None), ``cache``
        ("layer"/"lfru"/"lru"), ``direct_io`` (False for --no-direct-io), ``vision``, ``verify``,
        ``usage`` (str or None), ``exclusive_open``, ``io_threads``, ``lookahead`` (bool),
        ``activations`` ("f32"/"q8"), ``prefix_cache`` (bytes, None for the default share of
        the budget) and ``prefix_interval`` (tokens, None for the default). Every one is
        required: a missing attribute raises AttributeError naming it, a bad value ValueError
        naming the option.
        """
        return cls(
            ram_budget_bytes=settings.budget, ctx_tokens=settings.ctx,
            n_threads=settings.threads, cpu_list=settings.cpus, cache_policy=settings.cache,
            direct_io=settings.direct_io, vision=settings.vision,
            verify=settings.verify, usage_path=settings.usage,
            exclusive_open=settings.exclusive_open, io_threads=settings.io_threads,
            lookahead=int(settings.lookahead), activations=settings.activations,
            prefix_cache=settings.prefix_cache,
            prefix_interval=DEFAULT_PREFIX_INTERVAL if settings.prefix_interval is None else settings.prefix_interval)

    @classmethod
    def coerce(cls, options: Any) -> "NativeOptions":
        """``options`` itself when it is NativeOptions, else ``from_settings(options)``."""
        return options if isinstance(options, cls) else cls.from_settings(options)

    def for_tokenizer(self) -> "NativeOptions":
        """The options of a second, tokenizer-only context on the same container.

        It takes no lock and reads no hotlist, so it never contends with the main context.
        """
        return NativeOptions(ctx_tokens=self.ctx_tokens, tokenizer_only=True,
                             usage_path="", exclusive_open=False, direct_io=self.direct_io)
