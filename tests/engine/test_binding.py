"""What the binding itself adds on top of the C API (waste.adapters.native): str → UTF-8 with
lone surrogates refused before C, ``eval`` for tools, and closed-context refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.native import open_ctx
from waste.adapters.native import NativeEngine, NativeOptions, NativeTokenizer
from waste.domain.ports import EngineError

OPTIONS = NativeOptions(usage_path="")


@pytest.fixture()
def engine(synthetic_f32):
    with NativeEngine.open(synthetic_f32, OPTIONS) as engine:
        yield engine


@pytest.mark.parametrize("text,index,code", [("\ud800", 0, "D800"), ("ab\udcffc", 2, "DCFF"),
                                             ("🙂x\udbff", 2, "DBFF")])
@pytest.mark.parametrize("call", ["tokenize", "tokenize_markup", "special_id"])
def test_lone_surrogate_is_e_arg_naming_its_index(engine, synthetic_f32, call, text, index, code):
    tokenizer = NativeTokenizer.open(synthetic_f32, OPTIONS)
    try:
        for target in (engine, tokenizer):
            with pytest.raises(EngineError) as info:
                getattr(target, call)(text)
            assert info.value.code == "E_ARG"
            assert info.value.detail == f"text[{index}] is U+{code}, a lone surrogate: not valid UTF-8"
    finally:
        tokenizer.close()
    assert engine.detokenize(engine.tokenize("ab🙂c")) == "ab🙂c".encode()   # astral is fine


def test_eval_returns_the_c_logits(engine, synthetic_f32):
    ids = [5, 17, 300, 9]
    with open_ctx(synthetic_f32, usage_path="") as raw:
        expected = raw.eval(ids)
    got = engine.eval(ids)
    assert len(got) == engine.model_info().vocab
    assert np.asarray(got, np.float32).tobytes() == expected.tobytes()
    assert engine.position() == len(ids)
    engine.reset()
    assert engine.position() == 0


@pytest.mark.parametrize("ids,needle", [([], "ids"), ([3, 2**31], "ids[1] must be a token id (an int32)"),
                                        ([3, -1], "ids[1]")])
def test_eval_refuses_bad_ids(engine, ids, needle):
    with pytest.raises(EngineError) as info:
        engine.eval(ids)
    assert info.value.code == "E_ARG" and needle in info.value.detail, info.value.detail
    assert engine.position() == 0


def test_eval_refuses_an_id_past_the_vocabulary(engine):
    vocab = engine.model_info().vocab
    with pytest.raises(EngineError) as info:
        engine.eval([3, vocab])
    assert info.value.code == "E_ARG" and "ids[1]" in info.value.detail, info.value.detail


def test_closed_engine_refuses_with_e_state(synthetic_f32):
    engine = NativeEngine.open(synthetic_f32, OPTIONS)
    engine.eval([3, 4])
    engine.close()
    for call, args in (("reset", ()), ("eval", ([3],)), ("position", ()), ("tokenize", ("hi",))):
        with pytest.raises(EngineError) as info:
            getattr(engine, call)(*args)
        assert info.value.code == "E_STATE" and "closed" in info.value.detail
    assert engine.statistics().bytes_read >= 0          # the final values, no raise
    engine.close()                                      # idempotent
