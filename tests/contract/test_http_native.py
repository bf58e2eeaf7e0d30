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
