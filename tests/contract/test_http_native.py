"""What only the real engine has: its identity on the wire, the CLI's --plan and exit codes on
a real container, and a container converted without tokenizer files (and the fake scripted
to match it).

The rest of the HTTP contract runs against libwaste too: every test parametrized with
``engine_kind`` (test_http_routes, test_http_generation, test_http_concurrency).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.contract.serving import fake, running, state_of
from waste.domain.ports import Prompt, SamplingParams
from waste.app import Settings, engine_opener


@pytest.fixture(scope="module")
def served(native, native_container):
    settings = Settings(model=str(native_container), ctx=512, usage="", max_tokens=24)
    with running(engine_opener(settings), settings) as (base, app):
        yield base, app


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[0], timeout=60) as c:
        yield c


def chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_health_and_models_report_the_real_engine(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["chat_format"] == "xtml"
    assert health["fake_engine"] is False and "libwaste" in health["engine"].lower()
    model = client.get("/v1/models").json()["data"][0]
    assert model["id"] == "synthetic"
    waste = model["waste"]
    assert waste["arch"] == "kimi_linear" and waste["ctx_tokens"] == 512
    assert waste["n_layers"] == 4 and waste["top_k"] == 2 and waste["params_total"] > 0


def test_completions_never_show_the_end_marker(client):
    body = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 8,
                                                  "temperature": 0}).json()
    assert body["usage"]["completion_tokens"] <= 8
    assert "<|end_of_msg|>" not in body["choices"][0]["text"]


def test_the_hotlist_is_saved_at_shutdown(native, native_container, tmp_path):
    usage = tmp_path / "usage.waste"
    settings = Settings(model=str(native_container), ctx=512, usage=str(usage), max_tokens=4)
    with running(engine_opener(settings), settings) as (base, app):
        assert httpx.post(base + "/v1/chat/completions", json=chat("warm"), timeout=60).status_code == 200
        assert not usage.exists()
    assert usage.stat().st_size > 0  # written by the engine worker, after the last request


def test_cli_plan_and_version(native_container):
    plan = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan"],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "floor" in plan.stdout and "slots" in plan.stdout
    tiny = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan",
                           "--budget", "1K"], capture_output=True, text=True, timeout=60)
    assert tiny.returncode == 1 and "floor" in tiny.stderr
    # The prefix cache's share (docs/ENGINE.md §2): a default share of the budget, an explicit
    # size, one too small for an entry (off, and why), one that leaves the engine no floor.
    assert "prefix_cache_bytes" in plan.stdout and "engine_budget_bytes" in plan.stdout
    sized = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan",
                            "--budget", "8M", "--prefix-cache", "2M"],
                           capture_output=True, text=True, timeout=60)
    assert sized.returncode == 0 and f"prefix_cache_bytes: {2 << 20}\n" in sized.stdout
    assert f"engine_budget_bytes: {6 << 20}\n" in sized.stdout
    small = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan",
                            "--budget", "8M", "--prefix-cache", "1K"],
                           capture_output=True, text=True, timeout=60)
    assert "prefix_cache_bytes: 0 (off: 1024 bytes cannot hold one entry" in small.stdout
    over = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan",
                           "--budget", "8M", "--prefix-cache", "8M"],
                          capture_output=True, text=True, timeout=60)
    assert over.returncode == 1 and "--prefix-cache" in over.stderr and "floor" in over.stderr
    version = subprocess.run([sys.executable, "-m", "waste", "--version"], capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0 and "libwaste" in version.stdout


def test_cli_exits_1_when_the_container_cannot_open(tmp_path):
    broken = tmp_path / "broken.waste"
    broken.mkdir()
    (broken / "manifest.json").write_text('{"format_version": 999}')
    run = subprocess.run([sys.executable, "-m", "waste", str(broken), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "format_version" in run.stderr


# -- a container without a tokenizer ----------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizerless_container(native, native_container, tmp_path_factory) -> Path:
    """The synthetic container converted as from a checkpoint without tokenizer files
    (as tests/engine/test_robustness.py::test_container_without_tokenizer_opens does)."""
    out = tmp_path_factory.mktemp("native") / "no-tokenizer.waste"
    shutil.copytree(native_container, out)
    (out / "tokenizer.tiktoken").unlink()
    (out / "specials.json").unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"] = None
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _check_no_tokenizer(base: str) -> None:
    with httpx.Client(base_url=base, timeout=30) as c:
        health = c.get("/health")
        assert health.status_code == 200 and health.json()["chat_format"] is None
        model = c.get("/v1/models")
        assert model.status_code == 200
        assert "no tokenizer" in model.json()["data"][0]["waste"]["chat_format"]["error"]
        r = c.post("/v1/chat/completions", json=chat("x"))
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "unsupported_chat_format"
        assert "no tokenizer" in err["message"]
        for path, body, param in (("/v1/completions", {"prompt": "x"}, "prompt"),
                                  ("/tokenize", {"content": "x"}, "content"),
                                  ("/detokenize", {"tokens": [1]}, "tokens")):
            r = c.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            err = r.json()["error"]
            assert (err["code"], err["param"]) == ("invalid_value", param)
            assert "no tokenizer" in err["message"]
        assert c.get("/metrics").status_code == 200


def test_a_container_without_a_tokenizer_serves_clear_400s(tokenizerless_container):
    settings = Settings(model=str(tokenizerless_container), ctx=256, usage="")
    with running(engine_opener(settings), settings) as (base, app):
        assert state_of(app).service.load_error is None
        _check_no_tokenizer(base)


def test_the_fake_without_a_tokenizer_answers_the_same():
    with running(fake({"tokenizer": False}), Settings(fake_engine="builtin")) as (base, app):
        _check_no_tokenizer(base)


def test_open_logs_the_warm_up_before_and_after(native, native_container, tmp_path, caplog):
    """The server says what waste_open is about to read and, after it, how many expert
    slots it warmed from the hotlist (issue 11: long work shows progress)."""
    usage = tmp_path / "usage.waste"
    options = native.NativeOptions(ctx_tokens=512, usage_path=str(usage))
    engine, tokenizer = native.open_native(native_container, options)
    engine.generate(Prompt(ids=tuple(range(3, 40))), SamplingParams(
        temperature=0, top_p=1, top_k=0, seed=1, max_tokens=4, stop_ids=()), lambda e: False)
    engine.save_usage()
    engine.close()
    tokenizer.close()
    caplog.clear()
    with caplog.at_level("INFO", logger="waste"):
        engine, tokenizer = native.open_native(native_container, options)
        engine.close()
        tokenizer.close()
    text = caplog.text
    entries = (usage.stat().st_size - 24) // 16
    assert f"warming the expert cache from {usage} ({entries} hotlist entries)" in text
    assert "expert slots warmed" in text
    assert entries > 0


def test_logit_bias_and_penalties_reach_the_sampler(client):
    target = 300  # an ordinary byte-level id of the synthetic vocabulary
    body = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 6, "temperature": 1,
                                                  "seed": 4, "logit_bias": {str(target): 100}}).json()
    plain = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 6, "temperature": 1,
                                                   "seed": 4}).json()
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["text"] != plain["choices"][0]["text"]
    penalised = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 6, "temperature": 1,
                                                       "seed": 4, "logit_bias": {str(target): 100},
                                                       "frequency_penalty": 2, "presence_penalty": 2,
                                                       "repetition_penalty": 3.0, "min_p": 0.2})
    assert penalised.status_code == 200


def test_a_logit_bias_id_outside_the_vocabulary_is_a_400(client):
    vocab = client.get("/v1/models").json()["data"][0]["waste"]["vocab"]
    response = client.post("/v1/chat/completions", json=chat("hi", logit_bias={str(vocab): 5}))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == f"logit_bias.{vocab}"


def test_reading_ahead_is_reported_in_waste_and_metrics(native, native_container):
    """--io-threads and --lookahead reach libwaste; their statistics (guesses, hits of
    guesses, wasted bytes, queue depth, disk-busy time) reach the ``waste`` object and
    /metrics, and --plan prints both flags and the policy."""
    from waste.adapters.native import NativeOptions, plan_memory

    floor = plan_memory(native_container, NativeOptions(ctx_tokens=512, usage_path="")).floor_bytes
    settings = Settings(model=str(native_container), ctx=512, usage="", max_tokens=16,
                        budget=floor, io_threads=2, lookahead=True)
    with running(engine_opener(settings), settings) as (base, app):
        r = httpx.post(base + "/v1/chat/completions", json=chat("read ahead", temperature=0), timeout=60)
        assert r.status_code == 200, r.text
        since = r.json()["waste"]["since_start"]
        assert since["io_threads"] == 2 and since["lookahead"] == 1
        assert since["experts_missed"] > 0 and since["lookahead_guesses"] > 0
        assert 0 <= since["lookahead_hits"] <= since["lookahead_guesses"]
        assert since["lookahead_accuracy"] == since["lookahead_hits"] / since["lookahead_guesses"]
        assert 1 <= since["io_queue_depth_max"] and since["disk_busy_s"] > 0
        # per request (issue 12 item 2): the first request made every guess so far; the
        # second request's counters are the growth of since_start across it
        first = r.json()["waste"]
        assert first["lookahead_guesses"] == since["lookahead_guesses"] > 0
        assert first["lookahead_hits"] == since["lookahead_hits"]
        assert first["lookahead_wasted_bytes"] <= since["lookahead_wasted_bytes"]
        assert first["lookahead_accuracy"] == first["lookahead_hits"] / first["lookahead_guesses"]
        assert since["activations"] == "q8"  # the server's default (docs/ENGINE.md §4.3)
        r2 = httpx.post(base + "/v1/chat/completions", json=chat("read ahead again", temperature=0), timeout=60)
        assert r2.status_code == 200, r2.text
        second, since2 = r2.json()["waste"], r2.json()["waste"]["since_start"]
        for key in ("lookahead_guesses", "lookahead_hits", "lookahead_wasted_bytes"):
            assert second[key] == since2[key] - since[key], key
        assert second["lookahead_guesses"] > 0
        since = since2
        metrics = httpx.get(base + "/metrics", timeout=10).text
        assert f"waste_lookahead_guesses_total {since['lookahead_guesses']}" in metrics
        for name in ("waste_lookahead_hits_total", "waste_lookahead_wasted_bytes_total",
                     "waste_io_queue_depth_max", "waste_disk_busy_seconds_total"):
            assert f"\n{name} " in metrics
    plan = subprocess.run([sys.executable, "-m", "waste", str(native_container), "--plan", "--io-threads", "4",
                           "--lookahead", "--cache", "lru", "--activations", "f32"],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "activations: f32 (exact f32: the reference)" in plan.stdout
    assert "io_threads: 4 (up to 4 record reads in flight)" in plan.stdout
    assert "lookahead: on" in plan.stdout and "cache_policy: lru" in plan.stdout


def test_top_logprobs_through_the_openai_sdk(served):
    import openai

    client = openai.OpenAI(base_url=served[0] + "/v1", api_key="unused")
    reply = client.chat.completions.create(model="synthetic", messages=[{"role": "user", "content": "Count"}],
                                           temperature=0, max_tokens=12, logprobs=True, top_logprobs=5,
                                           extra_body={"thinking": False})
    entries = reply.choices[0].logprobs.content
    assert entries
    for entry in entries:
        assert len(entry.top_logprobs) == 5
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert entry.logprob == values[0]  # greedy draws the most likely
        assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in entry.top_logprobs)
    # completions: logprobs=N gives N alternatives per token
    done = client.completions.create(model="synthetic", prompt="Once upon", max_tokens=6, temperature=0,
                                     logprobs=3)
    lp = done.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) and all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert all(max(t.values()) == v for t, v in zip(lp.top_logprobs, lp.token_logprobs))


def test_n_choices_through_the_openai_sdk(served):
    """n=3 with top_logprobs on the real engine: three choices with their own index, seed
    (seed + index) and logprobs; choices 1 and 2 restore the prompt from the prefix cache."""
    import openai

    client = openai.OpenAI(base_url=served[0] + "/v1", api_key="unused")
    ask = dict(model="synthetic", messages=[{"role": "user", "content": "Count with me"}], max_tokens=8,
               temperature=1.0, seed=40, logprobs=True, top_logprobs=3, extra_body={"thinking": False})
    def cache() -> dict:
        probe = client.completions.create(model="synthetic", prompt="probe", max_tokens=1)
        return probe.model_extra["waste"]["since_start"]["prefix_cache"]

    before = cache()
    reply = client.chat.completions.create(n=3, **ask)
    after = reply.model_extra["waste"]["since_start"]["prefix_cache"]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    # choices 1 and 2 restored the prompt (all but its last token) from the prefix cache
    assert after["hits"] - before["hits"] >= 2
    assert after["reused_tokens"] - before["reused_tokens"] >= 2 * (reply.usage.prompt_tokens - 1)
    used = 0
    for index, choice in enumerate(reply.choices):
        single = client.chat.completions.create(**dict(ask, seed=40 + index))
        used += single.usage.completion_tokens
        alone = single.choices[0]
        assert choice.message.content == alone.message.content
        assert choice.finish_reason == alone.finish_reason
        assert [e.token for e in choice.logprobs.content] == [e.token for e in alone.logprobs.content]
        assert all(len(e.top_logprobs) == 3 for e in choice.logprobs.content)
    assert reply.usage.completion_tokens == used
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens
    done = client.completions.create(model="synthetic", prompt="Once upon", max_tokens=5, n=2, seed=3,
                                     logprobs=2)
    assert [c.index for c in done.choices] == [0, 1]
    assert all(len(c.logprobs.tokens) == len(c.logprobs.top_logprobs) for c in done.choices)
