"""The engines the HTTP contract runs against: the scripted fake, and libwaste on a synthetic
container (the same contract test runs against both).

``RecordingEngine`` wraps either adapter. It records what the server asked of the engine
(prompts, stop reasons, tokens delivered), like the fake's own record, and can pause
a generation inside its token callback so a test orders events without sleeping.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, AsyncIterator, Callable, Iterator

import attrs
import trio

from tests.contract.serving import fake, running, state_of
from tests.contract.vllm_server import SERVED_ID
from waste.app import Settings, engine_opener

ENGINE_KINDS = ("fake", "native", "vllm")
WAIT_LIMIT_S = 20.0  # a safety net for a contract that is broken, never a synchronisation


@attrs.define
class Record:
    prompts: list[list[int]] = attrs.field(factory=list)  # as sent: image placeholders unexpanded
    stop_reasons: list[str] = attrs.field(factory=list)  # or "E_…" when generate raised
    generated: list[int] = attrs.field(factory=list)  # tokens delivered, per generate call
    replies: list[list[int]] = attrs.field(factory=list)  # the delivered ids, per generate call
    params: list[Any] = attrs.field(factory=list)  # the SamplingParams, per generate call


class RecordingEngine:
    """An Engine adapter that records what it was asked; every call is the inner engine's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.record = Record()
        self._pause_at: int | None = None
        self.paused = threading.Event()  # set while a generation waits at the pause
        self.generating = threading.Event()  # set once a generate call has begun
        self._resume = threading.Event()
        self._lock = threading.Lock()
        # Concurrent generations (a remote engine): the first ``_parties`` wait at token
        # ``_meet_at`` until all of them got there, so a test knows they ran at once.
        self._meet_at: int | None = None
        self._parties = 0
        self._arrived = 0
        self._met = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def pause_at(self, index: int) -> None:
        """The next generation waits before delivering token ``index`` until ``resume()``."""
        self._resume.clear()
        self.paused.clear()
        self._pause_at = index

    def meet_at(self, index: int, parties: int) -> None:
        """The next ``parties`` generations each wait before delivering token ``index``
        until all of them have got there (a broken barrier fails the wait: they never ran
        at once)."""
        with self._lock:
            self._parties, self._arrived, self._met = parties, 0, threading.Event()
            self._meet_at = index

    def _meet(self) -> None:
        with self._lock:
            self._arrived += 1
            if self._arrived > self._parties:
                return  # the meeting is over: later generations pass
            met = self._met
            if self._arrived == self._parties:
                met.set()
        assert met.wait(WAIT_LIMIT_S), "the generations never ran at once"

    def resume(self) -> None:
        self._pause_at = None
        self._resume.set()

    def generate(self, prompt, params, on_token: Callable, *, is_cancelled=None, **more):
        with self._lock:  # several calls at once on a remote engine: each keeps its slot
            slot = len(self.record.prompts)
            self.record.prompts.append(list(prompt.ids))
            self.record.generated.append(0)
            self.record.replies.append([])
            self.record.params.append(params)
        self.generating.set()

        def counted(event) -> bool:
            if self._pause_at is not None and event.index == self._pause_at:
                self.paused.set()
                self._resume.wait(WAIT_LIMIT_S)
            if self._meet_at is not None and event.index == self._meet_at:
                self._meet()
            self.record.generated[slot] += 1
            self.record.replies[slot].append(event.token)
            return on_token(event)

        try:
            result = self.inner.generate(prompt, params, counted, is_cancelled=is_cancelled,
                                         **more)
        except Exception as exc:
            self.record.stop_reasons.append(getattr(exc, "code", type(exc).__name__))
            raise
        self.record.stop_reasons.append(result.stop_reason)
        return result

    @property
    def n_base_vocab(self) -> int:
        return self.inner.n_base_vocab

    def text(self, ids: list[int]) -> str:
        """A prompt as text (specials spelled out), to look for what a request sent."""
        return self.inner.detokenize(ids).decode("utf-8", "replace")


@attrs.define
class Served:
    """One running server: its URL, app and engine kind."""

    base: str
    app: Any
    kind: str

    @property
    def service(self):
        return state_of(self.app).service

    @property
    def engine(self) -> RecordingEngine:
        """The recording engine the server runs (once it has loaded)."""
        return self.service.engine

    def wait_for(self, predicate: Callable[[Any], bool]) -> None:
        """Block until ``predicate(service)`` holds, woken by the service's own state changes."""
        service = self.service

        async def wait() -> None:
            with trio.fail_after(WAIT_LIMIT_S):
                await service.wait_until(predicate)

        trio.from_thread.run(wait, trio_token=service.trio_token)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's Trio thread (to call the service's synchronous methods)."""
        return trio.from_thread.run_sync(fn, trio_token=self.service.trio_token)


# Small caps keep the native engine's answers short; the fake's replies end by themselves.
# The prefix cache needs room beyond the tiny container's automatic budget (1.5 MB).
NATIVE_SETTINGS = {"ctx": 512, "usage": "", "max_tokens": 16, "budget": 8 << 20,
                   "prefix_cache": 4 << 20}


# vLLM serves the tiny Qwen2 (tests.contract.vllm_server). The shared contract runs one
# generation at a time, as on libwaste (its queue tests assume one running);
# test_vllm.py serves several at once.
VLLM_SETTINGS = {"max_tokens": 16, "max_concurrency": 1}


@contextlib.contextmanager
def serve(kind: str, request, *, script: dict | None = None, wait_ready: bool = True,
          **settings: Any) -> Iterator[Served]:
    """Serve ``kind`` ("fake" with ``script``, or "native" on the session container)."""
    if kind == "fake":
        engine = RecordingEngine(fake(script, ctx_tokens=settings.get("ctx", 0),
                                      prefix_cache=settings.get("prefix_cache")))
        config = Settings(fake_engine="builtin", **settings)

        @contextlib.asynccontextmanager
        async def opener() -> AsyncIterator[Any]:
            yield engine, engine.inner
    elif kind == "vllm":
        server = request.getfixturevalue("vllm_server")
        config = Settings(vllm=server.base, vllm_model=SERVED_ID,
                          **{**VLLM_SETTINGS, **settings})
        open_remote = engine_opener(config)

        @contextlib.asynccontextmanager
        async def opener() -> AsyncIterator[Any]:
            async with open_remote() as (inner, tokenizer):
                yield RecordingEngine(inner), tokenizer
    else:
        container = request.getfixturevalue("native_container")
        config = Settings(model=str(container), **{**NATIVE_SETTINGS, **settings})
        open_native = engine_opener(config)

        @contextlib.asynccontextmanager
        async def opener() -> AsyncIterator[Any]:
            async with open_native() as (inner, tokenizer):
                yield RecordingEngine(inner), tokenizer

    with running(opener, config, wait_ready=wait_ready) as (base, app):
        yield Served(base, app, kind)
