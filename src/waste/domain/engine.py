"""The Engine port: everything the server needs from an inference engine, and nothing more.

Adapters implement it: ``waste.adapters.fake.FakeEngine`` (scripted, for tests and client
developers) and ``waste.adapters.native.NativeEngine`` (libwaste through cffi). Which calls
block, which may run from any thread, and what each raises is stated per method below.
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
E_CANCELLED = -7
E_UNSUPPORTED = -6


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
    # Reading ahead (engine.md §5): reader threads, lookahead guesses and how many the router
    # confirmed, bytes of unconfirmed guesses, the deepest read queue reached, and the seconds
    # at least one read was in flight. Zero for an engine that does not read ahead.
    io_threads: int = 0
    lookahead: int = 0
    guesses: int = 0
    guess_hits: int = 0
    wasted_bytes: int = 0
    io_queue_depth_max: int = 0
    disk_busy_s: float = 0.0


# Returns True to stop generation (the client left, or a stop string matched).
TokenCallback = Callable[[TokenEvent], bool]


class Vocabulary(Protocol):
    """The slice of a tokenizer that chat-format resolution needs."""

    def tokenize_markup(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens recognised anywhere, longest match first.

        Blocking. Raises EngineError: E_UNSUPPORTED when the container has no tokenizer
        (its only cause here), E_ARG on text that is not valid UTF-8, E_BUSY when another
        call runs on the same context, E_STATE once closed.
        """
        ...

    @property
    def n_base_vocab(self) -> int:
        """Ids at or above this are special tokens. Quick, any thread; never raises."""
        ...


class Tokenizer(Vocabulary, Protocol):
    """Tokenization without generation: what prompt building and /tokenize use.

    The native adapter backs it with a second, tokenizer-only context so it answers while
    the engine generates; the fake is its own tokenizer. Every call is blocking: the host
    makes them in a worker thread, one at a time (its tokenizer limiter). Cancellation
    cannot interrupt a call; a cancelled caller waits for it to return.
    """

    def tokenize(self, text: str) -> list[int]:
        """Plain tokenization: special texts are never recognised; every id < n_base_vocab.

        Raises EngineError: E_UNSUPPORTED (no tokenizer), E_ARG (invalid UTF-8), E_BUSY,
        E_STATE (closed).
        """
        ...

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """Raw bytes of ``ids``, specials written as their text.

        Raises EngineError: E_ARG (an id outside the vocabulary), E_UNSUPPORTED (no
        tokenizer), E_BUSY, E_STATE (closed).
        """
        ...

    def close(self) -> None:
        """Release the context. Idempotent; never raises."""
        ...


class Engine(Tokenizer, Protocol):
    """An inference engine holding one model and one conversation state.

    Threads (engine.md §2, host contract): ``model_info``, ``n_base_vocab``, ``statistics``
    and ``abort`` are quick and safe from any thread at any time, also during ``generate``.
    Every other call is blocking and the context is not thread-safe: the host makes those
    calls from its engine worker, in a thread, one at a time (a concurrent call raises
    E_BUSY). Inside ``on_token`` only ``statistics`` and ``abort`` may be called.

    Cancellation: a Trio cancellation never interrupts a call (the host's threads are not
    abandoned, so nothing outlives the engine). Work stops early only through ``generate``'s
    callback returning True (at the next token) or ``abort`` (at the next token or prefill
    chunk).
    """

    def model_info(self) -> ModelInfo:
        """The loaded model's shape, read once at open. Quick, any thread; never raises."""
        ...

    def chat_template(self) -> str | None:
        """The container's chat.json text, or None when it has none.

        Blocking (reads a file). Raises EngineError: E_IO (unreadable), E_FORMAT (not UTF-8).
        """
        ...

    def reset(self) -> None:
        """Back to position 0: recurrent state, KV, image queue, abort flag and poison cleared.

        Blocking but quick. Raises EngineError: E_BUSY when another call is running on this
        context, E_STATE once closed.
        """
        ...

    def generate(
        self, prompt: Sequence[int], params: SamplingParams, on_token: TokenCallback
    ) -> GenerationResult:
        """Prefill ``prompt`` then sample until a stop id, ``max_tokens``, a full context, or
        ``on_token`` returning True (``stop_reason`` ``callback``).

        Blocking. Raises EngineError: E_ARG (empty prompt, bad id or parameter), E_CTX when
        the prompt does not fit (nothing evaluated), E_CANCELLED after ``abort`` (the state
        stays consistent), E_IO / E_FORMAT / E_NOMEM / E_BUDGET on failure (the state is then
        poisoned until ``reset``), E_BUSY, E_STATE (poisoned or closed). An exception raised
        by ``on_token`` stops generation and is re-raised from here.
        """
        ...

    def abort(self) -> None:
        """Ask the running call to stop at its next token or prefill chunk (E_CANCELLED).

        Quick, any thread, any time; never raises. The flag is sticky until a call honours
        it or ``reset`` clears it, so the host resets before every generation.
        """
        ...

    def add_image(self, rgb: bytes, width: int, height: int) -> int:
        """Queue an RGB8 image; returns how many positions its placeholder expands into.

        Blocking. Raises EngineError: E_UNSUPPORTED without a vision tower, E_ARG on bad
        pixels, E_BUSY, E_STATE.
        """
        ...

    def expand_images(self, ids: Sequence[int]) -> list[int]:
        """Replace each media placeholder id with its positions, in queue order.

        Blocking. Raises EngineError: E_ARG when the placeholder count differs from the
        queue, E_BUSY, E_STATE.
        """
        ...

    def statistics(self) -> EngineStats:
        """Cumulative statistics since open (after close: the final values).

        Quick, any thread, also during ``generate``. Raises EngineError only when the engine
        cannot read its own counters (libwaste's get_stats failing).
        """
        ...

    def save_usage(self) -> None:
        """Write the expert hotlist where the engine was opened to keep it (``--usage``);
        does nothing when it was opened without one.

        Blocking. Raises EngineError: E_IO (the file cannot be written), E_BUSY, E_STATE.
        """
        ...

    def close(self) -> None:
        """Abort a running call, wait for it, then release the model. Idempotent.

        Blocking. Raises EngineError: E_BUSY when called from inside ``on_token``.
        """
        ...
