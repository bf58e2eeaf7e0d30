"""FakeEngine: a deterministic, scriptable engine behind the Engine port (docs/HTTP.md §9.1).

It is its own tokenizer (``FakeVocabulary``) and records what it was given (prompts, resets,
stop reasons, hotlist saves) so tests can assert on end state instead of mocking our own
code. ``open_fake_engine`` owns it for a server's lifetime, as ``open_native_engine`` does.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from contextlib import contextmanager
from typing import AsyncIterator, Callable, Iterator, Sequence

import attrs
import trio

from waste.domain.chatjson.load import marker_strings
from waste.domain.ports import (Cancelled, EngineBusy, EngineStats, GenerationResult,
                                InvalidArgument, ModelInfo, Prompt, PromptImage,
                                SamplingParams, TokenCallback, TokenEvent, Unsupported,
                                fit_to_context)
from waste.domain.xtml.markers import MEDIA_PAD

from waste.adapters.fake.reply import plan_reply
from waste.adapters.fake.script import SCRIPTED_ERRORS, FakeScript, ReplyRule
from waste.adapters.fake.vocabulary import EOS, N_BASE_VOCAB, FakeVocabulary

_BYTES_PER_TOKEN = 4096
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


class FakeEngine:
    """The Engine and Tokenizer ports, scripted. Blocking calls; a concurrent call raises
    EngineBusy."""

    def __init__(self, script: FakeScript, *, ctx_tokens: int = 0, vision: bool = False) -> None:
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
        self._require_tokenizer()
        return self.vocab.text_ids(text)

    def tokenize_markup(self, text: str) -> list[int]:
        self._require_tokenizer()
        return self.vocab.markup_ids(text)

    def detokenize(self, ids: Sequence[int]) -> bytes:
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
                           io_note=None, budget_bytes=0, peak_bytes=0)

    # -- lifetime (the opener's) ----------------------------------------------------------
    def save_usage(self) -> None:
        with self._busy_call():
            self.record.usage_saves += 1

    def close(self) -> None:
        self.closed = True

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompt: Prompt, params: SamplingParams, on_token: TokenCallback, *,
                 is_cancelled: Callable[[], bool] | None = None) -> GenerationResult:
        with self._busy_call():
            self._reset()
            if is_cancelled is not None and is_cancelled():
                raise Cancelled("fake engine: cancelled before generation started")
            ids = self._expand_images(list(prompt.ids), prompt.images)
            if not ids:
                raise InvalidArgument("fake engine: empty prompt")
            params = fit_to_context(params, len(ids), self._ctx)
            return self._generate(ids, params, on_token)

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
                  on_token: TokenCallback) -> GenerationResult:
        self.record.prompts.append(prompt)
        self.record.positions_at_generate.append(self._position)
        self.record.generated.append(0)
        started = time.perf_counter()
        try:
            self._pause(self.script.prefill_delay_s)
            self._position += len(prompt)
            prefill_ms = (time.perf_counter() - started) * 1000
            tokens, rule = plan_reply(self.vocab, self.script, prompt)
            decode_started = time.perf_counter()
            reason = self._decode(tokens, rule, params, on_token)
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
            direct_io=True)

    def _decode(self, tokens: list[int], rule: ReplyRule | None, params: SamplingParams,
                on_token: TokenCallback) -> str:
        """Deliver the scripted tokens; the stop reason. ``record.generated[-1]`` counts them."""
        stop_ids = set(params.stop_ids)
        for n, token in enumerate(tokens):
            self._fail_if_scripted(rule, n)
            if n >= params.max_tokens:
                return "max_tokens"
            if self._position >= self._ctx:
                return "ctx_full"
            self._pause(self.script.token_delay_s)
            event = TokenEvent(index=n, token=token, piece=self._piece(token), logprob=-0.5,
                               is_stop=token in stop_ids, experts_hit=3, experts_missed=1,
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
async def open_fake_engine(script: FakeScript, *, ctx_tokens: int = 0, vision: bool = False
                           ) -> AsyncIterator[tuple[FakeEngine, FakeEngine]]:
    """Own a ``FakeEngine`` (its own tokenizer) for a server's lifetime, as the native
    opener does: opened in a thread (``load_delay_s`` blocks), waited for even when
    cancelled; on exit the hotlist "save" is recorded and the engine closed."""
    with trio.CancelScope(shield=True):
        engine = await trio.to_thread.run_sync(
            lambda: FakeEngine(script, ctx_tokens=ctx_tokens, vision=vision))
    try:
        yield engine, engine
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(engine.save_usage)
            engine.close()

