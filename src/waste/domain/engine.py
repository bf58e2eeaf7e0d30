"""The Engine port: everything the server needs from an inference engine, and nothing more.

Adapters implement it: ``waste.adapters.fake.FakeEngine`` (scripted, for tests and client
developers) and ``waste.adapters.native.NativeEngine`` (libwaste through cffi). Every call is
blocking and none is thread-safe: the server calls them from one worker thread, one at a time.
Engine failures are ``EngineError`` values defined here, beside the port.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import attrs

# Status names, as libwaste's waste_status_name() spells them (engine.md §1).
STATUS_NAMES = {
    0: "OK", -1: "E_IO", -2: "E_FORMAT", -3: "E_BUDGET", -4: "E_NOMEM", -5: "E_ARG",
    -6: "E_UNSUPPORTED", -7: "E_CANCELLED", -8: "E_BUSY", -9: "E_STATE", -10: "E_SPACE",
    -11: "E_CTX",
}


class EngineError(Exception):
    """A call into the engine failed. ``status`` is the libwaste status code, ``detail`` its text."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{STATUS_NAMES.get(status, status)}: {detail}")
        self.status = status
        self.detail = detail

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, str(self.status))


@attrs.frozen(kw_only=True)
class ModelInfo:
    """The model's identity and real shape, as reported by /v1/models under ``waste``."""

    arch: str
    n_layers: int
    n_experts: int
    top_k: int
    n_shared_experts: int
    hidden: int
    vocab: int
    n_base_vocab: int
    ctx_tokens: int
    ctx_train: int
    params_total: int
    params_active: int
    quant: str
    vision: bool
    direct_io: bool
    budget_bytes: int
    bos_id: int | None
    eos_id: int | None
    media_placeholder_id: int | None = None
    engine_version: str = ""
    build_info: str = ""


@attrs.frozen(kw_only=True)
class SamplingParams:
    """Per-generation sampling and stopping: temperature 0 is greedy; top_k 0 is off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_tokens: int = 4096
    stop_ids: tuple[int, ...] = ()


@attrs.frozen(kw_only=True)
class TokenEvent:
    """One sampled token, delivered to the ``on_token`` callback as soon as it exists.

    ``piece`` is the token's UTF-8 bytes; an incomplete multi-byte tail is held by the engine
    and released with a later piece, so a piece may be empty. ``is_stop`` marks a stop id.
    """

    index: int
    token: int
    piece: bytes
    logprob: float
    is_stop: bool
    experts_hit: int = 0
    experts_missed: int = 0
    bytes_read: int = 0


@attrs.frozen(kw_only=True)
class GenerationResult:
    """What one ``generate`` call did. ``stop_reason``: token, max_tokens, ctx_full, callback."""

    prompt_tokens: int
    tokens_generated: int
    stop_reason: str
    experts_hit: int
    experts_missed: int
    bytes_read: int
    prefill_ms: float
    decode_ms: float
    direct_io: bool


@attrs.frozen(kw_only=True)
class EngineStats:
    """Cumulative numbers since the engine opened."""

    tokens_generated: int
    experts_hit: int
    experts_missed: int
    bytes_read: int
    direct_io: bool
    io_note: str | None
    budget_bytes: int
    peak_bytes: int


# Returns True to stop generation (the client left, or a stop string matched).
TokenCallback = Callable[[TokenEvent], bool]


class Vocabulary(Protocol):
    """The slice of a tokenizer that chat-format resolution needs."""

    def tokenize_markup(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens recognised anywhere, longest match first."""
        ...

    @property
    def n_base_vocab(self) -> int:
        """Ids at or above this are special tokens."""
        ...


class Tokenizer(Vocabulary, Protocol):
    """Tokenization without generation: what prompt building and /tokenize use.

    The native adapter backs it with a second, tokenizer-only context so it answers while
    the engine generates. Raises EngineError (E_UNSUPPORTED when the container has no
    tokenizer, E_ARG for ids outside the vocabulary).
    """

    def tokenize(self, text: str) -> list[int]:
        """Plain tokenization: special texts are never recognised; every id < n_base_vocab."""
        ...

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """Raw bytes of ``ids``, specials written as their text."""
        ...


class Engine(Vocabulary, Protocol):
    """An inference engine holding one model and one conversation state.

    Blocking and not thread-safe: the host serialises every call on one worker thread.
    Cancellation: the only way to interrupt work is ``generate``'s callback returning True
    (checked between tokens); no call is interruptible from outside, so an adapter running
    this in a thread returns stop from the callback when its caller is cancelled.
    """

    def model_info(self) -> ModelInfo:
        """The loaded model's shape. Never raises."""
        ...

    def chat_template(self) -> str | None:
        """The container's chat.json text, or None when it has none. Raises EngineError (E_IO)."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Plain tokenization: special texts are never recognised; every id < n_base_vocab.

        Raises EngineError (E_UNSUPPORTED when the container has no tokenizer).
        """
        ...

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """Raw bytes of ``ids``, specials written as their text. Raises EngineError (E_ARG)."""
        ...

    def reset(self) -> None:
        """Back to position 0: recurrent state, KV, image queue and poison cleared. Never raises."""
        ...

    def generate(
        self, prompt: Sequence[int], params: SamplingParams, on_token: TokenCallback
    ) -> GenerationResult:
        """Prefill ``prompt`` then sample until a stop id, ``max_tokens``, a full context, or
        ``on_token`` returning True (``stop_reason`` ``callback``).

        Raises EngineError: E_CTX when the prompt does not fit (nothing evaluated), E_IO /
        E_FORMAT / E_NOMEM / E_BUDGET on failure (the state is then poisoned until ``reset``).
        An exception raised by ``on_token`` stops generation and is re-raised from here.
        """
        ...

    def add_image(self, rgb: bytes, width: int, height: int) -> int:
        """Queue an RGB8 image; returns how many positions its placeholder expands into.

        Raises EngineError (E_UNSUPPORTED without a vision tower, E_ARG on bad pixels).
        """
        ...

    def expand_images(self, ids: Sequence[int]) -> list[int]:
        """Replace each media placeholder id with its positions, in queue order.

        Raises EngineError (E_ARG when the placeholder count differs from the queue).
        """
        ...

    def statistics(self) -> EngineStats:
        """Cumulative statistics since open. Safe from any thread; never raises."""
        ...

    def close(self) -> None:
        """Release the model. Idempotent."""
        ...
