"""``--prefix-interval N`` (docs/HTTP.md §9): tokens between the prefix-cache states stored
inside a long prompt. It reaches whichever engine serves (libwaste's options, the fake
engine), reads ``WASTE_PREFIX_INTERVAL``, and is refused by name where it cannot apply."""

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
