"""The --vllm flags (README "Scaling out"): one engine, remote-only flags only with --vllm,
libwaste-only flags refused there, and the concurrency each engine gets."""

from __future__ import annotations

import pytest

from waste.app.settings import DEFAULT_REMOTE_CONCURRENCY, UsageError, concurrency, load_settings


def test_vllm_flags_and_defaults():
    s = load_settings(["--vllm", "http://127.0.0.1:8001/", "--vllm-api-key", "k",
                       "--vllm-model", "m", "--max-concurrency", "8", "--api-key", "ours"], {})
    assert (s.vllm, s.vllm_api_key, s.vllm_model, s.api_key) == ("http://127.0.0.1:8001", "k", "m", "ours")
    assert concurrency(s) == 8 and s.served_model_id == "m"
    default = load_settings(["--vllm", "http://h:1"], {"WASTE_VLLM_MODEL": "x"})
    assert concurrency(default) == DEFAULT_REMOTE_CONCURRENCY and default.served_model_id == "x"
    assert concurrency(load_settings(["--fake-engine"], {})) == 1


@pytest.mark.parametrize("argv, words", [
    (["--vllm", "ftp://h"], "not an http(s) URL"),
    (["--vllm", "http://h", "model.waste"], "give no MODEL"),
    (["--vllm", "http://h", "--fake-engine"], "give no MODEL and no --fake-engine"),
    (["--fake-engine", "--max-concurrency", "4"], "--max-concurrency needs --vllm"),
    (["m.waste", "--vllm-api-key", "k"], "--vllm-api-key needs --vllm"),
    (["m.waste", "--chat-format", "c.json"], "--chat-format needs --vllm"),
    (["--vllm", "http://h", "--budget", "4G"], "--budget applies to libwaste"),
    (["--vllm", "http://h", "--max-concurrency", "0"], "--max-concurrency: 0 is out of range"),
])
def test_refusals_name_the_flag(argv, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_settings(argv, {})


def test_asgi_needs_the_model_id():
    with pytest.raises(UsageError, match="WASTE_VLLM_MODEL"):
        load_settings(None, {"WASTE_VLLM": "http://h"}, asgi=True)
