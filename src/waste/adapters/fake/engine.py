"""FakeEngine: a deterministic, scriptable engine behind the Engine port (docs/HTTP.md §9.1).

It is its own tokenizer (``FakeVocabulary``) and records what it was given (prompts, resets,
stop reasons, hotlist saves) so tests can assert on end state instead of mocking our own
code. ``open_fake_engine`` owns it for a server's lifetime, as ``open_native_engine`` does.
"""

from __future__ import annotations

import array

import contextlib
import json
import threading
import time
from contextlib import contextmanager
from typing import AsyncIterator, Callable, Iterator, Sequence

import attrs
import trio

from waste.domain.chatjson.load import marker_strings
from waste.domain.prefix_cache import Entry, Key, PrefixCache, checkpoints, image_digest, prompt_key
from waste.domain.ports import (MaskFiller, Cancelled, EngineBusy, EngineStats, GenerationResult,
                                InvalidArgument, ModelInfo, Prompt, PromptImage,
                                SamplingParams, TokenCallback, TokenEvent, Unsupported,
                                fit_to_context)
from waste.domain.xtml.markers import MEDIA_PAD

from waste.adapters.fake.reply import plan_reply
from waste.adapters.fake.script import SCRIPTED_ERRORS, FakeScript, ReplyRule
from waste.adapters.fake.vocabulary import EOS, N_BASE_VOCAB, FakeVocabulary

_BYTES_PER_TOKEN = 4096
# The fake's stored states have a size as libwaste's do: a fixed part (the KDA state) plus a
# part per position (the MLA latents), so LRU by bytes behaves alike.
FAKE_STATE_BYTES = 4096
FAKE_POSITION_BYTES = 64
FAKE_PREFIX_CACHE = 4 * 1024 * 1024  # the default when the server gives no --prefix-cache
# What libwaste answers on a container converted without tokenizer files.
NO_TOKENIZER = ("fake engine: the container has no tokenizer files (tokenizer.tiktoken, "
                "specials.json); use token ids")


@attrs.define
class FakeRecord:
    """End state for tests: what the engine was asked to do."""

    prompts: list[list[int]] = attrs.field(factory=list)  # after image expansion
    positions_at_generate: list[int] = attrs.field(factory=list)
    stop_reasons: list[str] = attrs.field(factory=list)  # or "error", "cancelled" (abort)
    generated: list[int] = attrs.field(factory=list)  # tokens delivered, per generate call
    resets: int = 0
    images: list[tuple[int, int]] = attrs.field(factory=list)
    tokens_delivered: int = 0
    usage_saves: int = 0
    tokenizer_calls: int = 0  # every tokenize/detokenize call (each one a thread hop)
    cached: list[int] = attrs.field(factory=list)  # positions restored, per generate call
    prefilled: list[int] = attrs.field(factory=list)  # positions evaluated by the prefill


# Tokens between stored prefix states when none is asked for: shorter than libwaste's 1024,
# because the scripted prompts are short.
FAKE_PREFIX_INTERVAL = 256


class FakeEngine:
    """The Engine and Tokenizer ports, scripted. Blocking calls; a concurrent call raises
    EngineBusy."""

    def __init__(self, script: FakeScript, *, ctx_tokens: int = 0, vision: bool = False,
                 prefix_cache: int | None = None, prefix_interval: int | None = None) -> None:
        self.script = script
        self.record = FakeRecord()
        self.vocab = FakeVocabulary(script)
        self._ctx = ctx_tokens or 4096
        self._vision = vision
        self._position = 0
        self._busy = threading.Lock()
        self._stats_lock = threading.Lock()
        self._abort = threading.Event()
        self._totals = {"tokens": 0, "hit": 0, "miss": 0, "bytes": 0}
        self.closed = False
        capacity = FAKE_PREFIX_CACHE if prefix_cache is None else prefix_cache
        if capacity and capacity < self.entry_bytes(self._ctx):
            capacity = 0  # too small for one full-context entry: off, as libwaste's adapter
        self.prefix_cache: PrefixCache[int] = PrefixCache(capacity=capacity)
        self.prefix_interval = FAKE_PREFIX_INTERVAL if prefix_interval is None else prefix_interval
        # The entry last stored or restored: the next entry extends it, as libwaste's anchor.
        self._anchor: Entry[int] | None = None
        if script.load_delay_s:
            time.sleep(script.load_delay_s)

    # -- identity -------------------------------------------------------------------------
    @property
    def n_base_vocab(self) -> int:
        return N_BASE_VOCAB

    def special_id(self, text: str) -> int | None:
        return self.vocab.special_id(text)

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            arch="fake", n_layers=4, n_experts=8, top_k=2, n_shared_experts=1, hidden=64,
            vocab=self.vocab.size, n_base_vocab=N_BASE_VOCAB,
            ctx_tokens=self._ctx, ctx_train=self._ctx, params_total=1_000_000,
            params_active=250_000, quant="fake", vision=self._vision, direct_io=True,
            budget_bytes=0, bos_id=None, eos_id=self.vocab.special_id(EOS),
            media_placeholder_id=self._placeholder_id(), engine_version="fake",
            build_info="fake engine (scripted, docs/HTTP.md §9.1)")

    def chat_template(self) -> str | None:
        if self.script.format != "chat.json":
            return None
        return json.dumps(self.script.chat_json, ensure_ascii=False)

    # -- tokenizer (the public calls fail as libwaste's do without tokenizer files) --------
    def tokenize(self, text: str) -> list[int]:
        self.record.tokenizer_calls += 1
        self._require_tokenizer()
        return self.vocab.text_ids(text)

    def tokenize_markup(self, text: str) -> list[int]:
        self.record.tokenizer_calls += 1
        self._require_tokenizer()
        return self.vocab.markup_ids(text)

    def detokenize(self, ids: Sequence[int]) -> bytes:
        self.record.tokenizer_calls += 1
        return self._detokenize(ids)

    def detokenize_pieces(self, ids: Sequence[int]) -> list[bytes]:
        self.record.tokenizer_calls += 1
        return [self._detokenize([i]) for i in ids]

    def _detokenize(self, ids: Sequence[int]) -> bytes:
        if not self.script.tokenizer:
            raise Unsupported("fake engine: the container has no tokenizer files; detokenize "
                              "is unavailable")
        return "".join(self.vocab.token_text(i) for i in ids).encode("utf-8", "surrogatepass")

    def _require_tokenizer(self) -> None:
        if not self.script.tokenizer:
            raise Unsupported(NO_TOKENIZER)

    # -- the port's quick calls -----------------------------------------------------------
    def abort(self) -> None:
        self._abort.set()

    def statistics(self) -> EngineStats:
        with self._stats_lock:
            t = dict(self._totals)
        return EngineStats(tokens_generated=t["tokens"], experts_hit=t["hit"],
                           experts_missed=t["miss"], bytes_read=t["bytes"], direct_io=True,
                           io_note=None, budget_bytes=0, peak_bytes=0,
                           prefix_cache=self.prefix_cache.stats())

    @staticmethod
    def entry_bytes(positions: int) -> int:
        """The size a stored state of ``positions`` positions counts as."""
        return FAKE_STATE_BYTES + FAKE_POSITION_BYTES * positions

    # -- lifetime (the opener's) ----------------------------------------------------------
    def save_usage(self) -> None:
        with self._busy_call():
            self.record.usage_saves += 1

    def close(self) -> None:
        self.closed = True

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompt: Prompt, params: SamplingParams, on_token: TokenCallback, *,
                 is_cancelled: Callable[[], bool] | None = None,
                 mask: MaskFiller | None = None) -> GenerationResult:
        with self._busy_call():
            self._reset()
            if is_cancelled is not None and is_cancelled():
                raise Cancelled("fake engine: cancelled before generation started")
            ids = self._expand_images(list(prompt.ids), prompt.images)
            if not ids:
                raise InvalidArgument("fake engine: empty prompt")
            params = fit_to_context(params, len(ids), self._ctx)
            digests = [image_digest(i.rgb, i.width, i.height) for i in prompt.images]
            key = prompt_key(prompt.ids, self._placeholder_id(), digests,
                             [self.script.image_positions] * len(digests))
            return self._generate(ids, params, on_token, key, mask)

    def _reset(self) -> None:
        self._position = 0
        self._abort.clear()
        self.record.resets += 1

    def _expand_images(self, ids: list[int], images: Sequence[PromptImage]) -> list[int]:
        if not images:
            return ids
        if not self._vision:
            raise Unsupported("fake engine: no vision tower loaded (start with --vision)")
        for image in images:
            if len(image.rgb) != image.width * image.height * 3:
                raise InvalidArgument(f"fake engine: {len(image.rgb)} bytes is not "
                                      f"{image.width}x{image.height} RGB8")
            self.record.images.append((image.width, image.height))
        placeholder = self._placeholder_id()
        count = sum(1 for i in ids if i == placeholder)
        if count != len(images):
            raise InvalidArgument(f"fake engine: {count} image placeholders for {len(images)} "
                                  "queued images")
        out: list[int] = []
        for i in ids:
            out.extend([i] * self.script.image_positions if i == placeholder else [i])
        return out

    def _generate(self, prompt: list[int], params: SamplingParams,
                  on_token: TokenCallback, key: Key,
                  mask: MaskFiller | None = None) -> GenerationResult:
        self.record.prompts.append(prompt)
        self.record.positions_at_generate.append(self._position)
        self.record.generated.append(0)
        started = time.perf_counter()
        cache = self.prefix_cache
        entry = cache.longest_prefix(key, below=len(prompt) - 1) if cache.enabled else None
        cached = entry.length if entry is not None else 0
        self._anchor = entry
        cache.count_reuse(cached)
        self.record.cached.append(cached)
        self.record.prefilled.append(len(prompt) - cached)
        delivered: list[int] = []
        try:
            self._position = cached
            self._pause(self.script.prefill_delay_s)
            for point in checkpoints(cached, len(prompt) - 1, self.prefix_interval):
                self._store(key[:point])
            self._position = len(prompt)
            prefill_ms = (time.perf_counter() - started) * 1000
            tokens, rule = plan_reply(self.vocab, self.script, prompt)
            decode_started = time.perf_counter()

            def collect(event: TokenEvent) -> bool:
                delivered.append(event.token)
                return on_token(event)

            reason = self._decode(tokens, rule, params, collect, mask)
            if delivered:  # the last delivered token is never evaluated, as in libwaste
                self._store(key + tuple(delivered[:-1]))
        except Cancelled:
            self.record.stop_reasons.append("cancelled")
            raise
        except Exception:
            self.record.stop_reasons.append("error")
            raise
        self.record.stop_reasons.append(reason)
        n = self.record.generated[-1]
        return GenerationResult(
            prompt_tokens=len(prompt), tokens_generated=n, stop_reason=reason,
            experts_hit=3 * n, experts_missed=n, bytes_read=_BYTES_PER_TOKEN * n,
            prefill_ms=prefill_ms, decode_ms=(time.perf_counter() - decode_started) * 1000,
            direct_io=True, cached_tokens=cached)

    def _store(self, key: Key) -> None:
        """Store ``key``'s state as the native adapter does: extending the anchor entry
        (counting only its own positions), or whole when the anchor is gone or its chain
        leaves no room."""
        cache = self.prefix_cache
        if not cache.enabled or key in cache:
            return
        parent = self._anchor if self._anchor is not None and cache.holds(self._anchor) else None
        if parent is not None and not cache.make_room(
                self.entry_bytes(len(key) - parent.length), keep=parent):
            parent = None
        start = parent.length if parent is not None else 0
        self._anchor = cache.put(key, len(key), self.entry_bytes(len(key) - start), parent=parent)

    def _masked(self, mask: MaskFiller, n: int, token: int) -> int | None:
        """The scripted token if the mask allows it, else the lowest allowed id (a script has
        no distribution to renormalise); None when the mask stops generation."""
        size = self.vocab.size
        words = array.array("I", [0xFFFFFFFF]) * ((size + 31) // 32)
        if size % 32:
            words[-1] = (1 << (size % 32)) - 1
        if mask(n, memoryview(words)):
            return None
        if (words[token // 32] >> (token % 32)) & 1:
            return token
        for w, bits in enumerate(words):
            if bits:
                return w * 32 + (bits & -bits).bit_length() - 1
        raise InvalidArgument(f"fake engine: the mask allows no token (token {n})")

    def _decode(self, tokens: list[int], rule: ReplyRule | None, params: SamplingParams,
                on_token: TokenCallback, mask: MaskFiller | None = None) -> str:
        """Deliver the scripted tokens; the stop reason. ``record.generated[-1]`` counts them.
        With a mask, a disallowed scripted token becomes the lowest allowed id and the script
        runs on past its end (its last token repeated) until a stop id or max_tokens."""
        stop_ids = set(params.stop_ids)
        if mask is not None and tokens:
            tokens = list(tokens) + [tokens[-1]] * max(0, params.max_tokens - len(tokens))
        for n, token in enumerate(tokens):
            if mask is not None:
                chosen = self._masked(mask, n, token)
                if chosen is None:
                    return "callback"
                token = chosen
            self._fail_if_scripted(rule, n)
            if n >= params.max_tokens:
                return "max_tokens"
            if self._position >= self._ctx:
                return "ctx_full"
            self._pause(self.script.token_delay_s)
            # A script has no distribution: the scripted token is its only alternative.
            top = ((token, self._piece(token), -0.5),) if params.top_logprobs else ()
            event = TokenEvent(index=n, token=token, piece=self._piece(token), logprob=-0.5,
                               is_stop=token in stop_ids, top=top, experts_hit=3, experts_missed=1,
                               bytes_read=_BYTES_PER_TOKEN)
            self._count_token()
            stop = on_token(event)
            if event.is_stop:
                return "token"
            if stop:
                return "callback"
            self._position += 1
        self._fail_if_scripted(rule, len(tokens))
        return "token"

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (prefill or one token); an abort ends the wait with Cancelled."""
        aborted = self._abort.wait(seconds) if seconds else self._abort.is_set()
        if aborted:
            self._abort.clear()  # honoured: the flag is not sticky past this call
            raise Cancelled("fake engine: aborted")

    def _fail_if_scripted(self, rule: ReplyRule | None, n: int) -> None:
        if rule is not None and rule.error is not None and n == rule.after_tokens:
            raise SCRIPTED_ERRORS[rule.error](
                f"fake engine: scripted {rule.error} failure after {n} tokens")

    def _piece(self, token: int) -> bytes:
        return self.vocab.token_text(token).encode("utf-8", "surrogatepass")

    def _count_token(self) -> None:
        self.record.tokens_delivered += 1
        self.record.generated[-1] += 1
        with self._stats_lock:
            self._totals["tokens"] += 1
            self._totals["hit"] += 3
            self._totals["miss"] += 1
            self._totals["bytes"] += _BYTES_PER_TOKEN

    def _placeholder_id(self) -> int | None:
        if self.script.format == "xtml":
            return self.vocab.special_id(MEDIA_PAD)
        image = (self.script.chat_json or {}).get("image")
        if self.script.format == "chat.json" and isinstance(image, str):
            markers = marker_strings(image)
            # The block's placeholder: its middle marker when it is framed, else its only one.
            if markers:
                return self.vocab.special_id(markers[len(markers) // 2])
        return None

    @contextmanager
    def _busy_call(self) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise EngineBusy("fake engine: concurrent call on one context")
        try:
            yield
        finally:
            self._busy.release()


@contextlib.asynccontextmanager
async def open_fake_engine(script: FakeScript, *, ctx_tokens: int = 0, vision: bool = False,
                           prefix_cache: int | None = None, prefix_interval: int | None = None
                           ) -> AsyncIterator[tuple[FakeEngine, FakeEngine]]:
    """Own a ``FakeEngine`` (its own tokenizer) for a server's lifetime, as the native
    opener does: opened in a thread (``load_delay_s`` blocks), waited for even when
    cancelled; on exit the hotlist "save" is recorded and the engine closed."""
    with trio.CancelScope(shield=True):
        engine = await trio.to_thread.run_sync(
            lambda: FakeEngine(script, ctx_tokens=ctx_tokens, vision=vision,
                               prefix_cache=prefix_cache, prefix_interval=prefix_interval))
    try:
        yield engine, engine
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(engine.save_usage)
            engine.close()

