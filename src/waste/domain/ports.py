"""The ports: what the server needs from an engine, a tokenizer and an image decoder.

Adapters implement them: ``waste.adapters.fake`` (scripted, for tests and client developers)
and ``waste.adapters.native`` (libwaste through cffi); ``waste.adapters.images`` decodes
images. Which calls block, which may run from any thread, and what each raises is stated per
method. Engine failures are the ``EngineError`` family defined here, beside the ports.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, Sequence

import attrs

from waste.domain.reply.constraint import TokenMatcher
from waste.domain.prefix_cache import PrefixCacheStats
from waste.domain.requests.messages import ImagePart

# -- engine errors ----------------------------------------------------------------------------


class EngineError(Exception):
    """An engine call failed. ``code`` names the kind (libwaste's status name, docs/ENGINE.md
    §1), ``detail`` says exactly what failed (file, tensor, field, expert)."""

    code: ClassVar[str] = "E_ENGINE"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.code}: {detail}")
        self.detail = detail


class EngineIOError(EngineError):
    """A file could not be read or written (the container, the hotlist, chat.json)."""

    code = "E_IO"


class EngineFormatError(EngineError):
    """A file is not what it claims to be (a bad manifest, tensor, rank file, non-UTF-8)."""

    code = "E_FORMAT"


class BudgetExceeded(EngineError):
    """The memory budget cannot hold what the call needs."""

    code = "E_BUDGET"


class EngineOutOfMemory(EngineError):
    """An allocation failed."""

    code = "E_NOMEM"


class InvalidArgument(EngineError):
    """An argument is out of range: an id outside the vocabulary, invalid UTF-8, bad pixels."""

    code = "E_ARG"


class Unsupported(EngineError):
    """The engine cannot do this: no tokenizer, no vision tower, an unknown option."""

    code = "E_UNSUPPORTED"


class Cancelled(EngineError):
    """The call stopped early because ``abort`` was called (the state stays consistent)."""

    code = "E_CANCELLED"


class EngineBusy(EngineError):
    """Another call is running on the same context (calls must be serialised)."""

    code = "E_BUSY"


class InvalidState(EngineError):
    """The context is closed, or poisoned by an earlier failure."""

    code = "E_STATE"


class BufferTooSmall(EngineError):
    """An output buffer was too small (adapters retry with the size asked for)."""

    code = "E_SPACE"


class EngineUnavailable(EngineError):
    """A remote engine cannot be reached, timed out, broke a stream or answered an error."""

    code = "E_UPSTREAM"


class ContextFull(EngineError):
    """The prompt does not fit the context; nothing was evaluated.

    ``prompt_tokens`` and ``ctx_tokens`` are set when the engine knows them (the prompt's
    length after image expansion), so the caller can say it as a request error.
    """

    code = "E_CTX"

    def __init__(self, detail: str, *, prompt_tokens: int | None = None,
                 ctx_tokens: int | None = None) -> None:
        super().__init__(detail)
        self.prompt_tokens = prompt_tokens
        self.ctx_tokens = ctx_tokens


# -- values -----------------------------------------------------------------------------------


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
    #: Logit processing (docs/ENGINE.md §2 Logit processing); the defaults change nothing.
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    #: how many alternatives each TokenEvent carries in ``top`` (0-20)
    top_logprobs: int = 0


@attrs.frozen(kw_only=True)
class PromptImage:
    """One decoded image: RGB8 pixels, row-major, ``width * height * 3`` bytes."""

    rgb: bytes
    width: int
    height: int


@attrs.frozen(kw_only=True)
class Prompt:
    """What a reply is generated for: token ids, and the images their placeholders stand for
    (one ``media_placeholder_id`` per image, in order)."""

    ids: tuple[int, ...]
    images: tuple[PromptImage, ...] = ()


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
    #: the ``SamplingParams.top_logprobs`` most likely ids, descending: (id, its raw bytes
    #: (not necessarily UTF-8 on their own), logprob); the same logprob space as ``logprob``
    top: tuple[tuple[int, bytes, float], ...] = ()
    experts_hit: int = 0
    experts_missed: int = 0
    bytes_read: int = 0


#: The allowed-token mask (docs/ENGINE.md §2 Logit processing): called before each token
#: with its 0-based index and the vocab-sized bitset (uint32 words, bit ``id % 32`` of word
#: ``id // 32``; every id allowed on entry); it clears the forbidden ids' bits and returns
#: True to stop before the token. Runs on the engine's thread, between tokens.
MaskFiller = Callable[[int, memoryview], bool]


class GrammarCompiler(Protocol):
    """Compiles a response_format's JSON schema into token matchers (docs/DECISIONS.md,
    constrained answers); ``waste.adapters.grammar`` implements it with llguidance."""

    def json_schema(self, schema: dict[str, Any] | None,
                    param: str) -> Callable[[tuple[int, ...]], TokenMatcher]:
        """A factory of matchers (given the answer's close ids) for ``schema``; None is any
        JSON object. Blocking. Raises InvalidRequest naming the schema path of a feature the
        compiler cannot enforce (``param`` extended by that path)."""
        ...

    def lark(self, grammar: str, schemas: Sequence[tuple[Any, str]]) -> Callable[[], TokenMatcher]:
        """A factory of matchers for a whole-reply grammar in llguidance's Lark dialect
        (``waste.domain.reply.tool_grammar``; it ends with its own end marker). Blocking.
        Raises InvalidRequest naming the path (each schema's ``param`` extended) of a feature
        the compiler cannot enforce in ``schemas``, the JSON schemas the grammar embeds."""
        ...


@attrs.frozen(kw_only=True)
class GenerationResult:
    """What one ``generate`` call did. ``stop_reason``: token, max_tokens, ctx_full, callback.

    ``prompt_tokens`` counts the prompt after image expansion; ``cached_tokens`` how many of
    them were restored from the engine's prefix cache instead of evaluated (the prefill
    covered ``prompt_tokens - cached_tokens``).
    """

    prompt_tokens: int
    tokens_generated: int
    stop_reason: str
    experts_hit: int
    experts_missed: int
    bytes_read: int
    prefill_ms: float
    decode_ms: float
    direct_io: bool
    cached_tokens: int = 0
    # Router lookahead during this call (docs/ENGINE.md §5): guesses issued, guesses the
    # router confirmed, bytes of guesses found unused.
    guesses: int = 0
    guess_hits: int = 0
    wasted_bytes: int = 0


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
    # Reading ahead (docs/ENGINE.md §5): reader threads, lookahead guesses and how many the
    # router confirmed, bytes of unconfirmed guesses, the deepest read queue reached, and the
    # seconds at least one read was in flight. Zero for an engine that does not read ahead.
    io_threads: int = 0
    lookahead: int = 0
    guesses: int = 0
    guess_hits: int = 0
    wasted_bytes: int = 0
    io_queue_depth_max: int = 0
    disk_busy_s: float = 0.0
    activations: str = "f32"  # the matvec activations (docs/ENGINE.md §4.3): "f32" or "q8"
    prefix_cache: PrefixCacheStats = attrs.field(factory=PrefixCacheStats)


# Returns True to stop generation (the client left, or a stop string matched).
TokenCallback = Callable[[TokenEvent], bool]


def fit_to_context(params: SamplingParams, prompt_tokens: int,
                   ctx_tokens: int) -> SamplingParams:
    """``params`` with ``max_tokens`` cut to the room a ``prompt_tokens`` prompt leaves.

    Raises:
        ContextFull: the prompt alone fills the context (with both numbers).
    """
    if prompt_tokens >= ctx_tokens:
        raise ContextFull(f"the prompt is {prompt_tokens} tokens; the context holds "
                          f"{ctx_tokens}", prompt_tokens=prompt_tokens, ctx_tokens=ctx_tokens)
    room = ctx_tokens - prompt_tokens
    return attrs.evolve(params, max_tokens=room) if params.max_tokens > room else params


# -- the ports --------------------------------------------------------------------------------


class Vocabulary(Protocol):
    """The slice of a tokenizer that chat-format resolution needs."""

    def tokenize_markup(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens recognised anywhere, longest match first.

        Blocking. Raises Unsupported when the container has no tokenizer, InvalidArgument
        on text that is not valid UTF-8, EngineBusy when another call runs on the same
        context, InvalidState once closed.
        """
        ...

    @property
    def n_base_vocab(self) -> int:
        """Ids at or above this are special tokens. Quick, any thread; never raises."""
        ...


class Tokenizer(Vocabulary, Protocol):
    """Tokenization without generation: what prompt building and /tokenize use.

    The native adapter backs it with a second, tokenizer-only context so it answers while
    the engine generates; the fake is its own tokenizer. Every call is blocking: the service
    makes them in a worker thread, one at a time (its tokenizer limiter). Cancellation
    cannot interrupt a call; a cancelled caller waits for it to return.
    """

    def tokenize(self, text: str) -> list[int]:
        """Plain tokenization: special texts are never recognised; every id < n_base_vocab.

        Raises Unsupported (no tokenizer), InvalidArgument (invalid UTF-8), EngineBusy,
        InvalidState (closed).
        """
        ...

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """Raw bytes of ``ids``, specials written as their text.

        Raises InvalidArgument (an id outside the vocabulary), Unsupported (no tokenizer),
        EngineBusy, InvalidState (closed).
        """
        ...

    def detokenize_pieces(self, ids: Sequence[int]) -> list[bytes]:
        """The raw bytes of each id on its own, in one call (one worker-thread hop for a
        whole /tokenize reply). Raises as ``detokenize``."""
        ...


class Engine(Protocol):
    """An inference engine holding one model: it generates replies to prompts.

    Opening, closing, saving the expert hotlist, resetting state between prompts and
    queueing images are the adapter's business (its ``open_*`` async context manager).

    Threads (docs/ENGINE.md §2, host contract): ``model_info``, ``statistics`` and ``abort``
    are quick and safe from any thread at any time, also during ``generate``. The other
    calls are blocking and one at a time: the service makes them from its engine worker,
    in a thread (a concurrent call raises EngineBusy). Inside ``on_token`` only
    ``statistics`` and ``abort`` may be called.

    Cancellation: a Trio cancellation never interrupts a call (the service's threads are
    not abandoned, so nothing outlives the engine). Work stops early only through
    ``generate``'s callbacks (``is_cancelled`` before prefill, ``on_token`` returning True
    at the next token) or ``abort`` (at the next token or prefill chunk).
    """

    def model_info(self) -> ModelInfo:
        """The loaded model's shape, read once at open. Quick, any thread; never raises."""
        ...

    def chat_template(self) -> str | None:
        """The container's chat.json text, or None when it has none.

        Blocking (reads a file). Raises EngineIOError (unreadable), EngineFormatError (not
        UTF-8).
        """
        ...

    def generate(self, prompt: Prompt, params: SamplingParams, on_token: TokenCallback, *,
                 is_cancelled: Callable[[], bool] | None = None,
                 mask: MaskFiller | None = None) -> GenerationResult:
        """Generate a reply to ``prompt`` from a fresh state: expand its images, restore the
        longest prefix of it the engine's prefix cache holds (``cached_tokens``), prefill the
        rest, then sample until a stop id, ``max_tokens`` (cut to the room the prompt
        leaves), a full context, or ``on_token`` returning True (``stop_reason`` ``callback``).

        Prefix cache (docs/ENGINE.md §2): states are stored at the end of the prompt (its
        last token excluded: one token is always evaluated), at regular intervals inside a
        long prompt and at the end of the generation (prompt + reply but its last token), so
        the next turn of a conversation prefills only its new tokens. A restored prefix plus
        the rest gives logits byte-identical to one fresh prefill. Every call starts from
        the same stored states, so a caller wanting several replies to one prompt (n > 1)
        simply calls ``generate`` again: from the second call on, only the prompt's last
        token is evaluated.

        ``mask`` (when given) restricts each token to the ids it leaves allowed; ``params``
        carries the logit processing (bias, penalties, min_p) and ``top_logprobs``.

        ``is_cancelled`` is asked once the state is fresh, before any work: True ends the
        call with Cancelled (an ``abort`` that came before the call started is not lost).

        Blocking. Raises InvalidArgument (empty prompt, bad id or parameter, a placeholder
        count that differs from the images), Unsupported (images without a vision tower),
        ContextFull (the prompt does not fit; nothing evaluated), Cancelled (``abort`` or
        ``is_cancelled``), EngineIOError / EngineFormatError / EngineOutOfMemory /
        BudgetExceeded on failure, EngineBusy, InvalidState (closed). An exception raised by
        ``on_token`` stops generation and is re-raised from here.
        """
        ...

    def abort(self) -> None:
        """Ask the running ``generate`` to stop at its next token or prefill chunk (Cancelled).

        Quick, any thread, any time; never raises. Without a running call it does nothing
        lasting: the next ``generate`` starts from a fresh state.
        """
        ...

    def statistics(self) -> EngineStats:
        """Cumulative statistics since open (after close: the final values).

        Quick, any thread, also during ``generate``. Raises EngineError only when the engine
        cannot read its own counters.
        """
        ...


class ConcurrentEngine(Engine, Protocol):
    """An engine that runs several ``generate`` calls at once (a remote batching server):
    the service admits up to ``--max-concurrency`` of them, each in its own worker thread.

    ``generate`` takes a ``key`` (any object, one per call) and ``abort(key)`` stops only the
    call started with it; ``abort()`` without a key stops every running call.
    """

    def generate(self, prompt: Prompt, params: SamplingParams, on_token: TokenCallback, *,
                 is_cancelled: Callable[[], bool] | None = None,
                 mask: MaskFiller | None = None, key: object = None) -> GenerationResult:
        ...

    def abort(self, key: object = None) -> None:
        ...


class ImageDecoder(Protocol):
    """Image parts of a request to pixels (docs/HTTP.md §7's policy)."""

    def __call__(self, parts: Sequence[ImagePart], *, vision: bool,
                 allow_local: bool) -> list[PromptImage]:
        """Decode every part, in order. Blocking (CPU-bound): run it in a worker thread.

        Raises:
            InvalidRequest: with the docs/HTTP.md §5 code and the part's param.
        """
        ...
