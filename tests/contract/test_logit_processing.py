"""libwaste's logit processing through the binding, against an independent numpy reference
(docs/ENGINE.md §2 Logit processing): logit bias, repetition / frequency / presence penalties,
min_p, top logprobs and the allowed-token mask. The reference recomputes every step from the
raw logits ``waste_eval`` returns for the same ids, with the published formulas (OpenAI's
for the bias and the two penalties, vLLM's for repetition_penalty and min_p)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from waste.domain.ports import InvalidArgument, SamplingParams

pytestmark = pytest.mark.native

PROMPT_TEXT = "<|open|>message role=\"user\"<|sep|>Tell me a story about 3 dogs.<|close|>"


def _prompt(engine) -> list[int]:
    return engine.tokenize_markup(PROMPT_TEXT)


def _run(engine, prompt, params, mask=None):
    events = []
    engine.reset()
    result = engine.generate_ids(prompt, params, lambda e: events.append(e) and False, mask=mask)
    return result, events


def _raw_logits(engine, ids) -> np.ndarray:
    engine.reset()
    return np.asarray(engine.eval(ids), dtype=np.float32)


def _reference(raw: np.ndarray, params: SamplingParams, context: list[int], generated: list[int],
               allowed: set[int] | None = None) -> np.ndarray:
    """The processed logits in float32, step by step as the formulas say."""
    logits = raw.astype(np.float32).copy()
    for token, bias in params.logit_bias:
        logits[token] = np.float32(logits[token] + np.float32(bias))
    counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=len(logits)).astype(np.float32)
    if params.repetition_penalty != 1.0:
        r = np.float32(params.repetition_penalty)
        hit = np.zeros(len(logits), dtype=bool)
        hit[np.asarray(context + generated, dtype=np.int64)] = True
        logits = np.where(hit, np.where(logits > 0, logits / r, logits * r), logits).astype(np.float32)
    logits = (logits - np.float32(params.frequency_penalty) * counts).astype(np.float32)
    logits = (logits - np.float32(params.presence_penalty) * (counts > 0)).astype(np.float32)
    if allowed is not None:
        keep = np.zeros(len(logits), dtype=bool)
        keep[list(allowed)] = True
        logits = np.where(keep, logits, np.float32(-np.inf)).astype(np.float32)
    return logits


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    finite = np.isfinite(x)
    m = x[finite].max()
    return x - m - math.log(np.exp(x[finite] - m).sum())


def _top(logits: np.ndarray, k: int) -> list[tuple[int, float]]:
    lp = _log_softmax(logits)
    order = sorted((i for i in range(len(lp)) if np.isfinite(lp[i])), key=lambda i: (-logits[i], i))[:k]
    return [(i, lp[i]) for i in order]


def _check_against_reference(engine, prompt, params, allowed=None, mask=None):
    _, events = _run(engine, prompt, params, mask)
    generated: list[int] = []
    assert events
    for event in events:
        raw = _raw_logits(engine, prompt + generated)
        want = _reference(raw, params, prompt, generated, allowed)
        lp = _log_softmax(want)
        assert event.logprob == pytest.approx(lp[event.token], abs=1e-4)
        top = _top(want, params.top_logprobs)
        assert [t for t, _, _ in event.top] == [t for t, _ in top]
        for (token, raw, got), (_, exp) in zip(event.top, top):
            assert got == pytest.approx(exp, abs=1e-4)
            assert raw == engine.detokenize([token])
        if params.min_p > 0:  # after temperature, the drawn token's p is >= min_p * the largest
            assert (event.logprob - top[0][1]) / params.temperature >= math.log(params.min_p) - 1e-6
        generated.append(event.token)
    return events


def test_defaults_and_an_all_allowing_mask_change_nothing(native_engine):
    prompt = _prompt(native_engine)
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=12)
    _, plain = _run(native_engine, prompt, params)
    calls = []
    _, masked = _run(native_engine, prompt, params, mask=lambda i, words: calls.append(i) and False)
    assert [(e.token, e.logprob) for e in plain] == [(e.token, e.logprob) for e in masked]
    assert calls == list(range(len(masked)))
    # the reported logprob is the raw log-softmax without processing
    _check_against_reference(native_engine, prompt, SamplingParams(temperature=1.0, seed=11, max_tokens=4,
                                                                   top_logprobs=5))


def test_top_logprobs_match_the_log_softmax(native_engine):
    events = _check_against_reference(native_engine, _prompt(native_engine),
                                      SamplingParams(temperature=0.0, max_tokens=5, top_logprobs=20))
    assert all(len(e.top) == 20 for e in events)
    assert all(e.top[0][0] == e.token for e in events)  # greedy draws the first
    assert all(e.top[0][1] == native_engine.detokenize([e.token]) for e in events)


def test_logit_bias_follows_openai(native_engine):
    prompt = _prompt(native_engine)
    target = native_engine.tokenize("zebra")[0]
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=4, top_logprobs=3,
                            logit_bias=((target, 100.0), (native_engine.tokenize(" the")[0], -100.0)))
    events = _check_against_reference(native_engine, prompt, params)
    assert all(e.token == target for e in events)


@pytest.mark.parametrize("presence,frequency,repetition", [(0.7, 0.0, 1.0), (0.0, 1.3, 1.0),
                                                          (0.0, 0.0, 1.8), (-0.5, 0.4, 0.7)])
def test_penalties_follow_their_formulas(native_engine, presence, frequency, repetition):
    params = SamplingParams(temperature=0.0, max_tokens=8, top_logprobs=4, presence_penalty=presence,
                            frequency_penalty=frequency, repetition_penalty=repetition)
    _check_against_reference(native_engine, _prompt(native_engine), params)


def test_penalties_change_the_reply(native_engine):
    prompt = _prompt(native_engine)
    _, plain = _run(native_engine, prompt, SamplingParams(temperature=0.0, max_tokens=16))
    _, penalised = _run(native_engine, prompt, SamplingParams(temperature=0.0, max_tokens=16,
                                                              frequency_penalty=2.0, presence_penalty=2.0))
    assert [e.token for e in plain] != [e.token for e in penalised]


def test_min_p_keeps_only_likely_tokens(native_engine):
    params = SamplingParams(temperature=1.5, seed=9, max_tokens=16, top_logprobs=1, min_p=0.3)
    _check_against_reference(native_engine, _prompt(native_engine), params)


def test_the_mask_restricts_every_token_and_renormalises(native_engine):
    prompt = _prompt(native_engine)
    allowed = set(native_engine.tokenize("a b c d e f g"))

    def fill(index, words):
        for w in range(len(words)):
            words[w] = 0
        for token in allowed:
            words[token // 32] |= 1 << (token % 32)
        return False

    params = SamplingParams(temperature=1.0, seed=3, max_tokens=10, top_logprobs=len(allowed) + 2)
    events = _check_against_reference(native_engine, prompt, params, allowed=allowed, mask=fill)
    assert {e.token for e in events} <= allowed
    assert all(len(e.top) == len(allowed) for e in events)


def test_a_mask_allowing_nothing_is_e_arg_and_one_that_stops_ends_the_reply(native_engine):
    prompt = _prompt(native_engine)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=10)

    def nothing(index, words):
        for w in range(len(words)):
            words[w] = 0
        return False

    with pytest.raises(InvalidArgument, match="the mask allows no token"):
        _run(native_engine, prompt, params, mask=nothing)
    result, events = _run(native_engine, prompt, params, mask=lambda i, w: i >= 3)
    assert result.stop_reason == "callback" and len(events) == 3


def test_a_mask_exception_is_reraised(native_engine):
    def boom(index, words):
        raise RuntimeError("mask failed")

    with pytest.raises(RuntimeError, match="mask failed"):
        _run(native_engine, _prompt(native_engine), SamplingParams(max_tokens=4), mask=boom)
    _run(native_engine, _prompt(native_engine), SamplingParams(max_tokens=2))  # still usable


@pytest.mark.parametrize("field,value", [("top_logprobs", 21), ("repetition_penalty", 0.0),
                                         ("min_p", 1.5), ("logit_bias", ((10**7, 1.0),))])
def test_bad_processing_parameters_are_e_arg(native_engine, field, value):
    with pytest.raises(InvalidArgument):
        _run(native_engine, _prompt(native_engine), SamplingParams(max_tokens=2, **{field: value}))
