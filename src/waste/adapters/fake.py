"""FakeEngine: a deterministic, scriptable engine behind the Engine port (http.md §9.1).

Text tokens are code points (id = code point), specials follow 0x110000, so the plain
tokenizer can never produce a marker id. It records what it was given (prompts, resets,
stop reasons, hotlist saves) so tests can assert on end state instead of mocking our own code.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import attrs

from waste.adapters.fake_reply import plan_reply
from waste.adapters.fake_script import ERROR_STATUSES, FakeScript, ReplyRule
from waste.domain.chatjson.load import chat_json_markers, marker_strings
from waste.domain.ports import (E_CANCELLED, E_UNSUPPORTED, EngineError, EngineStats,
                                 GenerationResult, ModelInfo, SamplingParams, TokenCallback,
                                 TokenEvent)

N_BASE_VOCAB = 0x110000
XTML_SPECIALS = ("<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "<|media_begin|>",
                 "<|media_content|>", "<|media_pad|>", "<|media_end|>",
                 "<|kimi_image_placeholder|>")
K2_TOOL_MARKERS = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                   "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
_BYTES_PER_TOKEN = 4096
# What libwaste answers on a container converted without tokenizer files.
NO_TOKENIZER = ("fake engine: the container has no tokenizer files (tokenizer.tiktoken, "
                "specials.json); use token ids")


@attrs.define
class FakeRecord:
    """End state for tests: what the engine was asked to do."""

    prompts: list[list[int]] = attrs.field(factory=list)
    positions_at_generate: list[int] = attrs.field(factory=list)
    stop_reasons: list[str] = attrs.field(factory=list)  # or "error", "cancelled" (abort)
    generated: list[int] = attrs.field(factory=list)  # tokens delivered, per generate call
    resets: int = 0
    images: list[tuple[int, int]] = attrs.field(factory=list)
    tokens_delivered: int = 0
    usage_saves: int = 0


def special_texts(script: FakeScript) -> list[str]:
    """The fake vocabulary's specials, in id order after the code points."""
    texts = ["[EOS]"]
    if script.format == "xtml":
        texts += XTML_SPECIALS
    elif script.format == "chat.json":
        texts += [m for m in chat_json_markers(script.chat_json) if m not in texts]
        if script.k2_tool_markers:
            texts += [m for m in K2_TOOL_MARKERS if m not in texts]
    return texts


class FakeEngine:
    """The Engine port, scripted. Blocking calls; a concurrent call raises E_BUSY."""

    def __init__(self, script: FakeScript, *, ctx_tokens: int = 0, vision: bool = False) -> None:
        self.script = script
        self.record = FakeRecord()
        self._specials = special_texts(script)
        self._special_ids = {t: N_BASE_VOCAB + i for i, t in enumerate(self._specials)}
        self._by_length = sorted(self._specials, key=len, reverse=True)
        self._ctx = ctx_tokens or 4096
        self._vision = vision
        self._position = 0
        self._images: list[tuple[int, int]] = []
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
        return self._special_ids.get(text)

    def model_info(self) -> ModelInfo:
        placeholder = self._placeholder_id()
        return ModelInfo(
            arch="fake", n_layers=4, n_experts=8, top_k=2, n_shared_experts=1, hidden=64,
            vocab=N_BASE_VOCAB + len(self._specials), n_base_vocab=N_BASE_VOCAB,
            ctx_tokens=self._ctx, ctx_train=self._ctx, params_total=1_000_000,
            params_active=250_000, quant="fake", vision=self._vision, direct_io=True,
            budget_bytes=0, bos_id=None, eos_id=self._special_ids["[EOS]"],
            media_placeholder_id=placeholder, engine_version="fake",
            build_info="fake engine (scripted, http.md §9.1)")

    def chat_template(self) -> str | None:
        if self.script.format != "chat.json":
            return None
        return json.dumps(self.script.chat_json, ensure_ascii=False)

    # -- tokenizer (the public calls fail as libwaste's do without tokenizer files) --------
    def tokenize(self, text: str) -> list[int]:
        self._require_tokenizer()
        return self.text_ids(text)

    def tokenize_markup(self, text: str) -> list[int]:
        self._require_tokenizer()
        return self.markup_ids(text)

    def detokenize(self, ids: Sequence[int]) -> bytes:
        if not self.script.tokenizer:
            raise EngineError(E_UNSUPPORTED, "fake engine: the container has no tokenizer "
                              "files; detokenize is unavailable")
        return "".join(self.token_text(i) for i in ids).encode("utf-8", "surrogatepass")

    def text_ids(self, text: str) -> list[int]:
        """The plain encoding the fake's own replies use (whatever the script's tokenizer)."""
        return [ord(ch) for ch in text]

    def markup_ids(self, text: str) -> list[int]:
        """The markup encoding: specials anywhere, longest match first."""
        ids, i = [], 0
        while i < len(text):
            for special in self._by_length:
                if text.startswith(special, i):
                    ids.append(self._special_ids[special])
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids

    def token_text(self, token: int) -> str:
        if 0 <= token < N_BASE_VOCAB:
            return chr(token)
        index = token - N_BASE_VOCAB
        if 0 <= index < len(self._specials):
            return self._specials[index]
        raise EngineError(-5, f"token id {token} is outside the vocabulary (0..{N_BASE_VOCAB + len(self._specials) - 1})")

    def _require_tokenizer(self) -> None:
        if not self.script.tokenizer:
            raise EngineError(E_UNSUPPORTED, NO_TOKENIZER)

    # -- state ----------------------------------------------------------------------------
    def reset(self) -> None:
        with self._busy_call():
            self._position = 0
            self._images.clear()
            self._abort.clear()
            self.record.resets += 1

    def abort(self) -> None:
        self._abort.set()

    def add_image(self, rgb: bytes, width: int, height: int) -> int:
        with self._busy_call():
            if not self._vision:
                raise EngineError(-6, "fake engine: no vision tower loaded (start with --vision)")
            if len(rgb) != width * height * 3:
                raise EngineError(-5, f"fake engine: {len(rgb)} bytes is not {width}x{height} RGB8")
            self._images.append((width, height))
            self.record.images.append((width, height))
            return self.script.image_positions

    def expand_images(self, ids: Sequence[int]) -> list[int]:
        placeholder = self._placeholder_id()
        count = sum(1 for i in ids if i == placeholder)
        if count != len(self._images):
            raise EngineError(-5, f"fake engine: {count} image placeholders for {len(self._images)} queued images")
        out: list[int] = []
        for i in ids:
            out.extend([i] * self.script.image_positions if i == placeholder else [i])
        return out

    def statistics(self) -> EngineStats:
        with self._stats_lock:
            t = dict(self._totals)
        return EngineStats(tokens_generated=t["tokens"], experts_hit=t["hit"],
                           experts_missed=t["miss"], bytes_read=t["bytes"], direct_io=True,
                           io_note=None, budget_bytes=0, peak_bytes=0)

    def save_usage(self) -> None:
        with self._busy_call():
            self.record.usage_saves += 1

    def close(self) -> None:
        self.closed = True

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], params: SamplingParams,
                 on_token: TokenCallback) -> GenerationResult:
        with self._busy_call():
            return self._generate(list(prompt), params, on_token)

    def _generate(self, prompt: list[int], params: SamplingParams,
                  on_token: TokenCallback) -> GenerationResult:
        if not prompt:
            raise EngineError(-5, "fake engine: empty prompt")
        if self._position + len(prompt) > self._ctx:
            raise EngineError(-11, f"fake engine: {self._position} + {len(prompt)} tokens exceed the context of {self._ctx}")
        self.record.prompts.append(prompt)
        self.record.positions_at_generate.append(self._position)
        self.record.generated.append(0)
        started = time.perf_counter()
        try:
            self._pause(self.script.prefill_delay_s)
            self._position += len(prompt)
            self._images.clear()
            prefill_ms = (time.perf_counter() - started) * 1000
            tokens, rule = plan_reply(self, prompt)
            decode_started = time.perf_counter()
            reason = self._decode(tokens, rule, params, on_token)
        except EngineError as exc:
            self.record.stop_reasons.append("cancelled" if exc.status == E_CANCELLED else "error")
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
        """Wait ``seconds`` (prefill or one token); an abort ends the wait with E_CANCELLED."""
        aborted = self._abort.wait(seconds) if seconds else self._abort.is_set()
        if aborted:
            self._abort.clear()  # honoured: the flag is not sticky past this call
            raise EngineError(E_CANCELLED, "fake engine: aborted")

    def _fail_if_scripted(self, rule: ReplyRule | None, n: int) -> None:
        if rule is not None and rule.error is not None and n == rule.after_tokens:
            raise EngineError(ERROR_STATUSES[rule.error],
                              f"fake engine: scripted {rule.error} failure after {n} tokens")

    def _piece(self, token: int) -> bytes:
        return self.token_text(token).encode("utf-8", "surrogatepass")

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
            return self._special_ids["<|media_pad|>"]
        if self.script.format == "chat.json" and isinstance(self.script.chat_json.get("image"), str):
            markers = marker_strings(self.script.chat_json["image"])
            # The block's placeholder: its middle marker when it is framed, else its only one.
            if markers:
                return self._special_ids.get(markers[len(markers) // 2])
        return None

    @contextmanager
    def _busy_call(self) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise EngineError(-8, "fake engine: concurrent call on one context")
        try:
            yield
        finally:
            self._busy.release()
