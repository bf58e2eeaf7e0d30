"""libwaste's flags that have no twin elsewhere (docs/HTTP.md §9): ``--prefix-interval N``
reaches whichever engine serves (libwaste's options, the fake engine) and reads
``WASTE_PREFIX_INTERVAL``; reading ahead (``--io-threads``, ``--lookahead``/``--no-lookahead``)
is on by default, off with its readers, and refused by name where it cannot apply."""

from __future__ import annotations

import pytest

from waste.adapters.fake.engine import FAKE_PREFIX_INTERVAL
from waste.app.factory import engine_opener
from waste.app.settings import UsageError, load_settings


def test_the_flag_and_its_variable():
    assert load_settings(["--fake-engine"], {}).prefix_interval is None  # the engine's default
    assert load_settings(["--fake-engine", "--prefix-interval", "64"], {}).prefix_interval == 64
    assert load_settings(["--fake-engine"], {"WASTE_PREFIX_INTERVAL": "0"}).prefix_interval == 0
    assert load_settings(["--fake-engine", "--prefix-interval", "8"],
                         {"WASTE_PREFIX_INTERVAL": "9"}).prefix_interval == 8  # flag first


@pytest.mark.parametrize("argv, words", [
    (["--fake-engine", "--prefix-interval", "-1"], "--prefix-interval"),
    (["--fake-engine", "--prefix-interval", "often"], "--prefix-interval"),
    (["--vllm", "http://h", "--vllm-model", "m", "--prefix-interval", "64"],
     "--prefix-interval applies to libwaste"),
])
def test_bad_uses_are_refused_by_name(argv, words):
    with pytest.raises(UsageError, match=words):
        load_settings(argv, {})


@pytest.mark.parametrize("argv, want", [(["--fake-engine", "--prefix-interval", "7"], 7),
                                        (["--fake-engine"], FAKE_PREFIX_INTERVAL)])
async def test_the_fake_engine_stores_at_the_interval(argv, want):
    async with engine_opener(load_settings(argv, {}))() as (engine, _tokenizer):
        assert engine.prefix_interval == want


def test_reading_ahead_is_on_by_default():
    s = load_settings(["m.waste"], {})
    assert (s.io_threads, s.lookahead) == (4, True)
    assert load_settings(["m.waste", "--no-lookahead"], {}).lookahead is False
    assert load_settings(["m.waste"], {"WASTE_NO_LOOKAHEAD": "1"}).lookahead is False
    # no readers, no guesses: the lookahead follows unless asked for
    s = load_settings(["m.waste", "--io-threads", "0"], {})
    assert (s.io_threads, s.lookahead) == (0, False)
    s = load_settings(["m.waste", "--io-threads", "2", "--lookahead"], {})
    assert (s.io_threads, s.lookahead) == (2, True)


@pytest.mark.parametrize("argv, words", [
    (["m.waste", "--io-threads", "0", "--lookahead"], "--lookahead needs --io-threads >= 1"),
    (["--vllm", "http://h", "--vllm-model", "m", "--no-lookahead"], "--no-lookahead applies to libwaste"),
    (["--vllm", "http://h", "--vllm-model", "m", "--lookahead"], "--lookahead applies to libwaste"),
])
def test_reading_ahead_refusals_name_the_flag(argv, words):
    with pytest.raises(UsageError, match=words):
        load_settings(argv, {})
