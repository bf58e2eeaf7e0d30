"""``VllmEngine``: the Engine and Tokenizer ports over a vLLM OpenAI server, at the token level.

Generation is ``POST /v1/completions`` with the prompt as token ids, streamed, with
``return_token_ids``: each sampled id reaches ``on_token`` as it arrives. Tokenization is
vLLM's ``/tokenize`` and ``/detokenize`` (the remote vocabulary is the one that counts), and
the special tokens come from ``/tokenizer_info`` (vLLM started with
``--enable-tokenizer-info-endpoint``). Every call is blocking and runs in the caller's worker
thread on one shared ``httpx.Client`` (thread-safe, one connection per stream); several
``generate`` calls may run at once, each abortable on its own (``abort(key)``).

Failures are the ports' engine errors: ``EngineUnavailable`` when vLLM cannot be reached,
times out, breaks a stream or answers 5xx; ``InvalidArgument`` for its 400s (and ids our
side already knows to be out of range); ``Unsupported`` for what a token-level remote engine
cannot do (images, the answer-grammar mask).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

import attrs
import httpx
import trio

from waste.domain.ports import (Cancelled, EngineFormatError, EngineIOError,
                                EngineStats, EngineUnavailable, GenerationResult,
                                InvalidArgument, MaskFiller, ModelInfo, Prompt, SamplingParams,
                                TokenCallback, TokenEvent, Unsupported, fit_to_context)

log = logging.getLogger("waste.vllm")
# httpx logs every request at INFO: one line per token stream and per /tokenize call.
logging.getLogger("httpx").setLevel(logging.WARNING)
TOKEN_PREFIX = "token_id:"  # vLLM's spelling of an id with return_tokens_as_token_ids


@attrs.frozen(kw_only=True)
class VllmOptions:
    """Where vLLM is and how to talk to it (flags ``--vllm``, ``--vllm-api-key``,
    ``--vllm-model``, ``--chat-format``)."""

    url: str
    api_key: str | None = None
    model: str | None = None  # the served model id; None: the only one /v1/models lists
    chat_format: str | None = None  # a chat.json file, for a vocabulary without XTML
    ctx_tokens: int = 0  # caps vLLM's max_model_len when smaller (--ctx); 0: vLLM's
    connect_timeout_s: float = 10.0
    # The longest wait for the next chunk of a stream (vLLM's queue plus a long prefill),
    # and for any other answer.
    read_timeout_s: float = 300.0


@attrs.define(eq=False)
class _Call:
    """One running ``generate``: what ``abort`` needs to stop it from another thread."""

    key: object
    aborted: bool = False
    sock: socket.socket | None = None

    def abort(self) -> None:
        self.aborted = True
        sock = self.sock
        if sock is not None:
            # Wakes the worker blocked in recv (close alone would not); vLLM sees the
            # connection go and aborts the request.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])
    return json.dumps(body)[:300]


class VllmEngine:
    """A model served by vLLM; the engine and its own tokenizer. Use ``open_vllm`` to build."""

    def __init__(self, options: VllmOptions, client: httpx.Client) -> None:
        self.options = options
        self._client = client
        self._base = options.url.rstrip("/")
        self.model = options.model or ""
        self._ctx = 0
        self._specials: dict[int, str] = {}
        self._n_base = 0
        self._vocab = 0
        self._eos: int | None = None
        self._version = ""
        self._chat_json: str | None = None
        self._lock = threading.Lock()
        self._calls: list[_Call] = []
        self._pieces: dict[int, bytes] = {}
        self._totals = {"tokens": 0}
        self._closed = False

    # -- HTTP --------------------------------------------------------------------------
    def _where(self, path: str) -> str:
        return f"vLLM at {self._base}{path}"

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        if self._closed:
            raise EngineUnavailable("the engine is closed")
        try:
            response = self._client.request(method, self._base + path, json=body)
        except httpx.TimeoutException:
            raise EngineUnavailable(f"{self._where(path)} did not answer within "
                                    f"{self.options.read_timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{self._where(path)} cannot be reached ({exc})") from None
        self._check(response, path)
        try:
            return response.json()
        except ValueError:
            raise EngineUnavailable(f"{self._where(path)} answered something that is not "
                                    "JSON") from None

    def _check(self, response: httpx.Response, path: str) -> None:
        status = response.status_code
        if status < 400:
            return
        if not response.is_stream_consumed:
            response.read()
        message = _error_message(response)
        if status == 401 or status == 403:
            raise EngineUnavailable(f"{self._where(path)} refused our key ({status}: {message}); "
                                    "pass vLLM's own key with --vllm-api-key")
        if status == 404 and "model" in message.lower():
            raise EngineUnavailable(f"{self._where(path)} does not serve the model "
                                    f"{self.model!r} ({message})")
        if status == 404:
            raise Unsupported(f"{self._where(path)} has no such route (404)")
        if status == 400 or status == 422:
            raise InvalidArgument(f"{self._where(path)} refused the request: {message}")
        raise EngineUnavailable(f"{self._where(path)} failed ({status}: {message})")

    # -- opening -------------------------------------------------------------------------
    def _load(self) -> None:
        models = self._request("GET", "/v1/models").get("data") or []
        ids = [m.get("id") for m in models if isinstance(m, dict)]
        if not self.model:
            if len(ids) != 1:
                raise EngineUnavailable(f"{self._where('/v1/models')} serves {len(ids)} models "
                                        f"({', '.join(map(str, ids))}); choose one with --vllm-model")
            self.model = str(ids[0])
        card = next((m for m in models if m.get("id") == self.model), None)
        if card is None:
            raise EngineUnavailable(f"{self._where('/v1/models')} does not serve the model "
                                    f"{self.model!r}; it serves {', '.join(map(str, ids)) or 'none'}")
        self._ctx = int(card.get("max_model_len") or 0)
        if self._ctx <= 0:
            raise EngineFormatError(f"{self._where('/v1/models')} gives no max_model_len for "
                                    f"{self.model!r}")
        if self.options.ctx_tokens:
            self._ctx = min(self._ctx, self.options.ctx_tokens)
        try:
            info = self._request("GET", "/tokenizer_info")
        except Unsupported:
            raise Unsupported(f"{self._where('/tokenizer_info')} is off: start vLLM with "
                              "--enable-tokenizer-info-endpoint (waste reads the special "
                              "tokens from it)") from None
        added = info.get("added_tokens_decoder") or {}
        specials: dict[int, str] = {}
        for key, value in added.items():
            text = value.get("content") if isinstance(value, dict) else value
            if isinstance(text, str):
                specials[int(key)] = text
        if not specials:
            raise EngineFormatError(f"{self._where('/tokenizer_info')} lists no special tokens; "
                                    "no chat format can be resolved without them")
        self._specials = specials
        self._n_base = min(specials)
        self._vocab = max(specials) + 1
        eos = info.get("eos_token")
        eos_text = eos.get("content") if isinstance(eos, dict) else eos
        self._eos = next((i for i, t in specials.items() if t == eos_text), None)
        with contextlib.suppress(EngineUnavailable, Unsupported, InvalidArgument):
            self._version = str(self._request("GET", "/version").get("version", ""))
        if self.options.chat_format is not None:
            try:
                with open(self.options.chat_format, encoding="utf-8") as f:
                    self._chat_json = f.read()
            except OSError as exc:
                raise EngineIOError(f"--chat-format {self.options.chat_format}: {exc.strerror}") from None
            except UnicodeDecodeError:
                raise EngineFormatError(f"--chat-format {self.options.chat_format} is not UTF-8") from None

    def close(self) -> None:
        self._closed = True
        self.abort()
        self._client.close()

    # -- Engine ----------------------------------------------------------------------------
    def model_info(self) -> ModelInfo:
        return ModelInfo(
            arch="vllm", n_layers=0, n_experts=0, top_k=0, n_shared_experts=0, hidden=0,
            vocab=self._vocab, n_base_vocab=self._n_base, ctx_tokens=self._ctx,
            ctx_train=self._ctx, params_total=0, params_active=0, quant="remote",
            vision=False, direct_io=False, budget_bytes=0, bos_id=None, eos_id=self._eos,
            engine_version=self._version,
            build_info=f"vllm {self._version} at {self._base} serving {self.model}")

    def chat_template(self) -> str | None:
        return self._chat_json

    def statistics(self) -> EngineStats:
        return EngineStats(tokens_generated=self._totals["tokens"], experts_hit=0,
                           experts_missed=0, bytes_read=0, direct_io=False,
                           io_note="the experts live in the remote engine", budget_bytes=0,
                           peak_bytes=0)

    def abort(self, key: object = None) -> None:
        """Stop the running ``generate`` started with ``key`` (None: every one). Any thread."""
        with self._lock:
            calls = [c for c in self._calls if key is None or c.key is key]
        for call in calls:
            call.abort()

    def _body(self, ids: list[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": ids, "stream": True, "return_token_ids": True,
            "max_tokens": params.max_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1,
            # Our seeds are unsigned 64-bit, vLLM's signed: the same 64 bits.
            "min_p": params.min_p,
            "seed": params.seed - (1 << 64) if params.seed >= 1 << 63 else params.seed,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "repetition_penalty": params.repetition_penalty,
            # Only our stop ids end a reply (the chat format chose them), and specials
            # are text like any other piece: the reply reader works on ids.
            "stop_token_ids": list(params.stop_ids), "ignore_eos": True,
            "skip_special_tokens": False, "spaces_between_special_tokens": False,
            "logprobs": params.top_logprobs, "return_tokens_as_token_ids": True,
            "stream_options": {"include_usage": True},
        }
        if params.logit_bias:
            body["logit_bias"] = {str(i): b for i, b in params.logit_bias}
        return body

    def generate(self, prompt: Prompt, params: SamplingParams, on_token: TokenCallback, *,
                 is_cancelled: Callable[[], bool] | None = None,
                 mask: MaskFiller | None = None, key: object = None) -> GenerationResult:
        if mask is not None:
            raise Unsupported("a response_format grammar needs the engine to apply our token "
                              "mask; vLLM is driven with token ids only")
        if prompt.images:
            raise Unsupported("images: vLLM is driven with token ids only")
        ids = list(prompt.ids)
        if not ids:
            raise InvalidArgument("the prompt is empty")
        bad = next((i for i in ids if not 0 <= i < self._vocab), None)
        if bad is not None:
            raise InvalidArgument(f"token id {bad} is outside the vocabulary (0..{self._vocab - 1})")
        params = fit_to_context(params, len(ids), self._ctx)
        call = _Call(key)
        with self._lock:
            self._calls.append(call)
        try:
            if is_cancelled is not None and is_cancelled():
                raise Cancelled("cancelled before the request was sent")
            return self._stream(call, ids, params, on_token)
        finally:
            with self._lock:
                self._calls.remove(call)

    def _stream(self, call: _Call, ids: list[int], params: SamplingParams,
                on_token: TokenCallback) -> GenerationResult:
        path = "/v1/completions"
        started = time.perf_counter()
        first_at: float | None = None
        index = 0
        stop_reason = "max_tokens"
        prompt_tokens, cached = len(ids), 0
        complete = False  # vLLM's [DONE] arrived
        try:
            with self._client.stream("POST", self._base + path,
                                     json=self._body(ids, params)) as response:
                stream = response.extensions.get("network_stream")
                call.sock = stream.get_extra_info("socket") if stream is not None else None
                if call.aborted:
                    raise Cancelled("aborted while vLLM was starting the stream")
                self._check(response, path)
                for data in _events(response.iter_lines()):
                    if data == "[DONE]":
                        complete = True
                        break
                    chunk = json.loads(data)
                    usage = chunk.get("usage")
                    if usage:
                        prompt_tokens = int(usage.get("prompt_tokens") or prompt_tokens)
                        details = usage.get("prompt_tokens_details") or {}
                        cached = int(details.get("cached_tokens") or 0)
                    for choice in chunk.get("choices") or ():
                        if first_at is None:
                            first_at = time.perf_counter()
                        done, index = self._deliver(choice, index, params, on_token)
                        if done is not None:
                            stop_reason = done
                    if stop_reason == "callback":
                        break  # leaving the with closes the stream: vLLM aborts it
                    if call.aborted:
                        raise Cancelled("aborted")
                if not complete and stop_reason != "callback":
                    if call.aborted:
                        raise Cancelled("aborted")
                    raise EngineUnavailable(f"{self._where(path)} ended the stream after "
                                            f"{index} token(s) without finishing it")
        except (httpx.TransportError, httpx.StreamError) as exc:
            if call.aborted:
                raise Cancelled("aborted") from None
            if isinstance(exc, httpx.TimeoutException):
                raise EngineUnavailable(f"{self._where(path)} sent nothing for "
                                        f"{self.options.read_timeout_s:g} s") from None
            if isinstance(exc, httpx.ConnectError):
                raise EngineUnavailable(f"{self._where(path)} cannot be reached ({exc})") from None
            raise EngineUnavailable(f"{self._where(path)} broke the stream after {index} "
                                    f"token(s) ({exc or type(exc).__name__})") from None
        except ValueError as exc:  # a chunk that is not the JSON vLLM sends
            raise EngineUnavailable(f"{self._where(path)} sent a malformed chunk ({exc})") from None
        ended = time.perf_counter()
        with self._lock:
            self._totals["tokens"] += index
        prefill_ms = ((first_at or ended) - started) * 1000
        return GenerationResult(prompt_tokens=prompt_tokens, tokens_generated=index,
                                stop_reason=stop_reason, experts_hit=0, experts_missed=0,
                                bytes_read=0, prefill_ms=prefill_ms,
                                decode_ms=(ended - (first_at or ended)) * 1000,
                                direct_io=False, cached_tokens=cached)

    def _deliver(self, choice: dict, index: int, params: SamplingParams,
                 on_token: TokenCallback) -> tuple[str | None, int]:
        """Hand one chunk's tokens to ``on_token``; (the stop reason if it ended, next index)."""
        tokens = choice.get("token_ids") or []
        text = (choice.get("text") or "").encode("utf-8")
        logprobs = choice.get("logprobs") or {}
        chosen = logprobs.get("token_logprobs") or []
        tops = logprobs.get("top_logprobs") or []
        finish = choice.get("finish_reason")
        stop_id = choice.get("stop_reason") if finish == "stop" else None
        for n, token in enumerate(tokens):
            last = n == len(tokens) - 1
            top: tuple[tuple[int, bytes, float], ...] = ()
            if params.top_logprobs and n < len(tops) and tops[n]:
                ranked = sorted(((_token_id(k), v) for k, v in tops[n].items()),
                                key=lambda kv: -kv[1])[:params.top_logprobs]
                top = tuple((i, self.piece(i), lp) for i, lp in ranked)
            event = TokenEvent(index=index, token=int(token), piece=text if last else b"",
                               logprob=float(chosen[n]) if n < len(chosen) and chosen[n] is not None
                               else 0.0,
                               is_stop=last and stop_id is not None and token == stop_id,
                               top=top)
            index += 1
            if on_token(event):
                return "callback", index
        if finish == "stop":
            return "token", index
        if finish == "length":
            return "max_tokens", index
        if finish is not None:
            raise EngineUnavailable(f"vLLM ended the reply with finish_reason {finish!r}")
        return None, index

    # -- Tokenizer -------------------------------------------------------------------------
    @property
    def n_base_vocab(self) -> int:
        return self._n_base

    def _tokenize(self, text: str) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return [int(i) for i in self._request("POST", "/tokenize", body)["tokens"]]

    def tokenize_markup(self, text: str) -> list[int]:
        _check_text(text)
        return self._tokenize(text) if text else []

    def tokenize(self, text: str) -> list[int]:
        """Plain text: a special's spelling inside it is broken before its last character
        and the pieces are tokenized apart, so text never becomes markup (docs/DECISIONS.md)."""
        _check_text(text)
        if not text:
            return []
        ids = self._tokenize(text)
        if all(i < self._n_base for i in ids):
            return ids
        out: list[int] = []
        for part in self._split_specials(text):
            part_ids = self._tokenize(part) if part else []
            if any(i >= self._n_base for i in part_ids):
                raise InvalidArgument("the remote tokenizer turned plain text into a special "
                                      "token even after it was split")
            out += part_ids
        return out

    def _split_specials(self, text: str) -> list[str]:
        spellings = sorted({t for t in self._specials.values() if len(t) > 1}, key=len, reverse=True)
        parts, start, i = [], 0, 0
        while i < len(text):
            hit = next((s for s in spellings if text.startswith(s, i)), None)
            if hit is None:
                i += 1
                continue
            cut = i + len(hit) - 1
            parts.append(text[start:cut])
            start = i = cut
        parts.append(text[start:])
        return parts

    def detokenize(self, ids: Sequence[int]) -> bytes:
        ids = list(ids)
        bad = next((i for i in ids if not 0 <= i < self._vocab), None)
        if bad is not None:
            raise InvalidArgument(f"token id {bad} is outside the vocabulary (0..{self._vocab - 1})")
        if not ids:
            return b""
        text = self._request("POST", "/detokenize", {"model": self.model, "tokens": ids})["prompt"]
        return str(text).encode("utf-8")

    def detokenize_pieces(self, ids: Sequence[int]) -> list[bytes]:
        return [self.piece(i) for i in ids]

    def piece(self, token: int) -> bytes:
        """One id's text as vLLM decodes it (cached; a partial UTF-8 sequence is U+FFFD)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self.detokenize([token])
            self._pieces[token] = cached
        return cached


def _token_id(text: str) -> int:
    if not text.startswith(TOKEN_PREFIX):
        raise EngineUnavailable(f"vLLM named a token {text!r}, not {TOKEN_PREFIX}N")
    return int(text[len(TOKEN_PREFIX):])


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("the text is not valid UTF-8 (a lone surrogate)") from None


def _events(lines: Iterator[str]) -> Iterator[str]:
    """The ``data:`` payloads of a server-sent event stream."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


def open_vllm(options: VllmOptions) -> VllmEngine:
    """Connect to vLLM and read what the server needs (blocking).

    Raises:
        EngineUnavailable: vLLM cannot be reached, refuses the key, or does not serve the
            model; Unsupported: its /tokenizer_info is off; EngineIOError/EngineFormatError:
            the --chat-format file cannot be read.
    """
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    timeout = httpx.Timeout(options.read_timeout_s, connect=options.connect_timeout_s)
    client = httpx.Client(headers=headers, timeout=timeout,
                          limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
    engine = VllmEngine(options, client)
    try:
        engine._load()
    except BaseException:
        client.close()
        raise
    log.info("vLLM %s at %s serves %s (context %d, vocabulary %d, %d specials)",
             engine._version, engine._base, engine.model, engine._ctx, engine._vocab,
             len(engine._specials))
    return engine


@contextlib.asynccontextmanager
async def open_vllm_engine(options: VllmOptions) -> AsyncIterator[tuple[VllmEngine, VllmEngine]]:
    """Own the connection for a server's lifetime; the engine is its own tokenizer."""
    engine = await trio.to_thread.run_sync(open_vllm, options)
    try:
        yield engine, engine
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(engine.close)


def discover_model(options: VllmOptions) -> str:
    """The id of the only model vLLM serves (blocking), for a server started without
    ``--vllm-model``. Raises EngineUnavailable (unreachable, none or several)."""
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    timeout = httpx.Timeout(options.read_timeout_s, connect=options.connect_timeout_s)
    with httpx.Client(headers=headers, timeout=timeout) as client:
        engine = VllmEngine(options, client)
        models = engine._request("GET", "/v1/models").get("data") or []
    ids = [str(m.get("id")) for m in models if isinstance(m, dict)]
    if len(ids) != 1:
        raise EngineUnavailable(f"vLLM at {options.url} serves {len(ids)} models "
                                f"({', '.join(ids) or 'none'}); choose one with --vllm-model")
    return ids[0]
