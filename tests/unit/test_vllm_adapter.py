"""The vLLM adapter's failure mapping, on a scripted HTTP transport (no vLLM needed): every
upstream failure is a named engine error with a clear message, never a hang or a bare 500.
The real server's behaviour is tests/contract/test_vllm.py's."""

from __future__ import annotations

import json

import httpx
import pytest

from waste.adapters.vllm.engine import VllmEngine, VllmOptions
from waste.domain.ports import (Cancelled, ContextFull, EngineUnavailable, InvalidArgument,
                                Prompt, SamplingParams, TokenEvent, Unsupported)

URL = "http://vllm.test"
MODELS = {"data": [{"id": "m", "max_model_len": 64}]}
INFO = {"eos_token": "<|e|>", "added_tokens_decoder": {"10": "<|a|>", "11": "<|e|>"}}


def chunk(ids: list[int], text: str = "", finish: str | None = None, stop=None) -> str:
    choice = {"index": 0, "text": text, "token_ids": ids, "finish_reason": finish,
              "stop_reason": stop, "logprobs": {"token_logprobs": [-0.5] * len(ids),
                                                "top_logprobs": [None] * len(ids)}}
    return "data: " + json.dumps({"choices": [choice]}) + "\n\n"


def engine_on(routes: dict, *, api_key: str | None = None, seen: list | None = None) -> VllmEngine:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        answer = routes.get(request.url.path)
        if answer is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        if callable(answer):
            return answer(request)
        status, body = answer
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(transport=httpx.MockTransport(handle), headers=headers)
    engine = VllmEngine(VllmOptions(url=URL, api_key=api_key), client)
    engine._load()
    return engine


BASE = {"/v1/models": (200, MODELS), "/tokenizer_info": (200, INFO), "/version": (200, {"version": "x"})}


def generate(engine: VllmEngine, ids=(1, 2), **params):
    events: list[TokenEvent] = []

    def on_token(e: TokenEvent) -> bool:
        events.append(e)
        return False

    result = engine.generate(Prompt(ids=tuple(ids)), SamplingParams(**params), on_token)
    return result, events


def test_the_vocabulary_and_context_come_from_vllm():
    seen: list = []
    engine = engine_on(BASE, api_key="k", seen=seen)
    info = engine.model_info()
    assert (info.vocab, info.n_base_vocab, info.ctx_tokens, info.eos_id) == (12, 10, 64, 11)
    assert engine.model == "m" and "vllm x at http://vllm.test serving m" == info.build_info
    assert all(r.headers["authorization"] == "Bearer k" for r in seen)


def test_a_stream_delivers_ids_stops_and_usage():
    body = (chunk([5], "he") + chunk([6, 11], "llo", "stop", 11)
            + 'data: {"choices": [], "usage": {"prompt_tokens": 2}}\n\n' + "data: [DONE]\n\n")
    sent: list = []

    def completions(request):
        sent.append(json.loads(request.content))
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    engine = engine_on({**BASE, "/v1/completions": completions})
    result, events = generate(engine, temperature=0, stop_ids=(11,), seed=2 ** 64 - 1)
    assert [(e.token, e.piece, e.is_stop) for e in events] == [
        (5, b"he", False), (6, b"", False), (11, b"llo", True)]
    assert result.stop_reason == "token" and result.tokens_generated == 3
    assert sent[0]["prompt"] == [1, 2] and sent[0]["stop_token_ids"] == [11]
    assert sent[0]["seed"] == -1 and sent[0]["ignore_eos"] is True


@pytest.mark.parametrize("status, kind, words", [
    (401, EngineUnavailable, "--vllm-api-key"),
    (500, EngineUnavailable, "failed (500"),
    (400, InvalidArgument, "refused the request"),
])
def test_error_answers_are_named(status, kind, words):
    engine = engine_on({**BASE, "/v1/completions": (status, {"error": {"message": "boom"}})})
    with pytest.raises(kind, match="boom") as caught:
        generate(engine)
    assert words in caught.value.detail


def test_a_stream_cut_short_is_an_upstream_error():
    engine = engine_on({**BASE, "/v1/completions": (200, chunk([5], "he"))})
    with pytest.raises(EngineUnavailable, match="without finishing it"):
        generate(engine)


def test_a_malformed_chunk_is_an_upstream_error():
    engine = engine_on({**BASE, "/v1/completions": (200, "data: {not json\n\n")})
    with pytest.raises(EngineUnavailable, match="malformed chunk"):
        generate(engine)


def test_unreachable_and_model_not_served():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(EngineUnavailable, match="cannot be reached"):
        engine_on({"/v1/models": refuse})
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=MODELS)))
    engine = VllmEngine(VllmOptions(url=URL, model="other"), client)
    with pytest.raises(EngineUnavailable, match="does not serve the model 'other'; it serves m"):
        engine._load()


def test_tokenizer_info_off_says_which_flag():
    with pytest.raises(Unsupported, match="--enable-tokenizer-info-endpoint"):
        engine_on({"/v1/models": (200, MODELS)})


def test_what_the_remote_cannot_do_is_refused_before_sending():
    engine = engine_on(BASE)  # no /v1/completions route: nothing may be sent
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        generate(engine, ids=(1, 12))
    with pytest.raises(ContextFull):
        generate(engine, ids=tuple(range(1, 10)) * 8)
    with pytest.raises(Unsupported, match="mask"):
        engine.generate(Prompt(ids=(1,)), SamplingParams(), lambda e: False,
                        mask=lambda i, m: False)
    with pytest.raises(Cancelled):
        engine.generate(Prompt(ids=(1,)), SamplingParams(), lambda e: False,
                        is_cancelled=lambda: True)
