"""The OpenAPI 3.1 document (``GET /openapi.json``, rendered at ``GET /docs``) describes what
the server does: schemathesis generates requests from it for every operation and checks each
response against it — no 5xx, every status code, content type, header and body documented —
against the fake engine on a real socket (docs/HTTP.md; README "API documents")."""

from __future__ import annotations

import contextlib
import re
import threading
from collections import Counter

import httpx
import pytest
import trio

from tests.contract.serving import fake, running
from waste.adapters.http import openapi
from waste.app import Settings
from waste.domain.ports import EngineFormatError

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is a test dependency (pip install -e '.[test]')")
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.engine import events, from_schema  # noqa: E402

ROUTES = {("/health", "get"), ("/v1/models", "get"), ("/v1/models/{model_id}", "get"),
          ("/v1/chat/completions", "post"), ("/v1/completions", "post"), ("/metrics", "get"),
          ("/tokenize", "post"), ("/detokenize", "post"), ("/openapi.json", "get"), ("/docs", "get")}
# schemathesis' stateless checks. negative_data_rejection: a request that breaks the document
# must get a 4xx (so the document is as strict as the server, not looser).
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "negative_data_rejection")
# Bounded and deterministic: the coverage phase (boundary values, wrong types, unsupported
# methods) plus MAX_EXAMPLES fuzzed requests per operation, positive and negative.
MAX_EXAMPLES = 50
# The check is conformance, not speed: a loaded machine must not turn a slow answer into a
# failure (schemathesis's default read timeout is 10 s).
CONFIG = {
    "seed": 1,
    "request-timeout": 60,
    "generation": {"max-examples": MAX_EXAMPLES, "mode": "all", "deterministic": True, "database": "none"},
    "phases": {"stateful": {"enabled": False}},
    "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
}


@pytest.fixture(scope="module")
def server():
    with running(fake(), Settings(fake_engine="builtin")) as (base, app):
        yield base


def schemathesis_run(base: str, config: dict) -> tuple[list[str], dict[str, Counter]]:
    """One schemathesis run over every operation: (failures, responses per operation)."""
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", config=SchemathesisConfig.from_dict(config))
    failures: list[str] = []
    seen: dict[str, Counter] = {}
    for event in from_schema(schema).execute():
        if isinstance(event, (events.FatalError, events.NonFatalError)):
            failures.append(f"schemathesis error: {event}")
        if not isinstance(event, events.ScenarioFinished):
            continue
        counter = seen.setdefault(event.label or "?", Counter())
        for interaction in event.recorder.interactions.values():
            if interaction.response is not None:
                media = (interaction.response.headers.get("content-type") or ["-"])[0].split(";")[0]
                counter[(interaction.response.status_code, media)] += 1
        for nodes in event.recorder.checks.values():
            for node in nodes:
                if node.failure_info is not None:
                    failures.append(f"{event.label}: {node.name}: {node.failure_info.failure}\n"
                                    f"{node.failure_info.code_sample}")
    return failures, seen


@pytest.fixture(scope="module")
def run(server):
    return schemathesis_run(server, CONFIG)


def test_server_conforms_to_its_document(run):
    failures, seen = run
    for label, counter in sorted(seen.items()):
        print(label, dict(counter))
    assert not failures, "\n\n".join(dict.fromkeys(failures))


def test_the_run_reached_every_operation_and_answer_kind(run):
    _, seen = run
    operations = {label.split(" ", 1)[1]: counter for label, counter in seen.items()}
    assert set(operations) >= {path for path, _ in ROUTES} - {"/openapi.json"}
    for path in ("/v1/chat/completions", "/v1/completions"):
        kinds = set(operations[path])
        assert {(200, "application/json"), (200, "text/event-stream"), (400, "application/json")} <= kinds, kinds
    for path in ("/tokenize", "/detokenize"):
        assert {(200, "application/json"), (400, "application/json")} <= set(operations[path])
    assert (404, "application/json") in operations["/v1/models/{model_id}"]
    assert (405, "application/json") in operations["/health"]


def test_document_covers_every_route_and_is_valid_openapi_3_1(server):
    with httpx.Client(base_url=server, timeout=30) as client:
        r = client.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert doc == openapi.document()
    assert doc["openapi"] == "3.1.0"
    import waste
    assert doc["info"]["version"] == waste.__version__
    served = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert served == ROUTES
    # The app's own route table: every rule it serves is documented, with its methods.
    with running(fake(), Settings(fake_engine="builtin")) as (base, app):
        rules = {(re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
                 for rule in app.url_map.iter_rules() if rule.endpoint != "static"
                 for method in rule.methods if method not in ("HEAD", "OPTIONS")}
    assert rules == ROUTES
    # Valid against the OpenAPI 3.1 meta-schema (the one schemathesis ships), and every
    # component a valid JSON Schema 2020-12.
    from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR
    OPENAPI_31_VALIDATOR.validate(doc)
    import jsonschema_rs
    for sub in doc["components"]["schemas"].values():
        jsonschema_rs.Draft202012Validator({**sub, "components": doc["components"]})


def test_with_an_api_key_every_refusal_is_documented_too():
    """A server started with --api-key: schemathesis sends no key, so every keyed route answers
    401 (with WWW-Authenticate, and x-request-id on the completion routes) as documented."""
    config = dict(CONFIG, generation=dict(CONFIG["generation"], **{"max-examples": 5}))
    with running(fake(), Settings(fake_engine="builtin", api_key="sekret")) as (base, app):
        failures, seen = schemathesis_run(base, config)
    assert not failures, "\n\n".join(dict.fromkeys(failures))
    statuses = {label: {status for status, _ in counter} for label, counter in seen.items()}
    # 405 (a wrong method) is decided before the key (docs/HTTP.md §2.1).
    assert statuses["POST /v1/chat/completions"] == {401, 405}
    assert statuses["GET /metrics"] == {401, 405}
    assert 200 in statuses["GET /health"] and 200 in statuses["GET /docs"]


def test_the_native_engine_answers_as_documented(request):
    """The same checks against libwaste on the synthetic container (real tokenizer, real
    generation, the engine's own statistics), with fewer examples: its answers take longer."""
    from tests.contract.conftest import load_native
    from tests.contract.engines import serve

    load_native()
    config = dict(CONFIG, generation=dict(CONFIG["generation"], **{"max-examples": 10}))
    # A small context bounds every answer (a generated max_tokens is clamped to the room left).
    with serve("native", request, ctx=128) as served:
        failures, seen = schemathesis_run(served.base, config)
    assert not failures, "\n\n".join(dict.fromkeys(failures))
    statuses = {label: {status for status, _ in counter} for label, counter in seen.items()}
    assert 200 in statuses["POST /v1/chat/completions"] and 200 in statuses["POST /tokenize"]


@pytest.mark.parametrize("state", ["loading", "failed"])
def test_an_unready_server_answers_as_documented(state):
    """While the engine loads (503 `engine_loading`) and after a failed load (500
    `engine_error`, /health 503 `failed`): a short run with every check but "no 5xx", which
    these states answer by design."""
    gate = threading.Event()

    @contextlib.asynccontextmanager
    async def opener():
        if state == "failed":
            raise EngineFormatError("manifest.json: format_version 999 is not 1")
        engine = await trio.to_thread.run_sync(lambda: gate.wait(60) and fake())
        yield engine, engine

    checks = {name: {"enabled": name != "not_a_server_error"} for name in CHECKS}
    config = dict(CONFIG, generation=dict(CONFIG["generation"], **{"max-examples": 3}),
                  checks={"enabled": False, **checks})
    try:
        with running(opener, Settings(fake_engine="builtin"), wait_ready=state == "failed") as (base, app):
            failures, seen = schemathesis_run(base, config)
            gate.set()
    finally:
        gate.set()
    assert not failures, "\n\n".join(dict.fromkeys(failures))
    expected = 503 if state == "loading" else 500
    statuses = {label: {status for status, _ in counter} for label, counter in seen.items()}
    assert expected in statuses["POST /v1/chat/completions"] and expected in statuses["POST /tokenize"]
    assert 503 in statuses["GET /health"] and 200 in statuses["GET /metrics"]


def test_errors_are_documented_in_the_envelope(server):
    doc = openapi.document()
    envelope = doc["components"]["schemas"]["ErrorResponse"]
    assert envelope["properties"]["error"]["required"] == ["message", "type", "param", "code"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path in ("/health", "/openapi.json", "/docs"):
                continue
            statuses = set(op["responses"])
            assert {"401", "500"} <= statuses, (path, method)
            if method == "post":
                assert {"400", "408", "411", "413"} <= statuses, (path, method)


def test_docs_page_is_self_contained_html(server):
    with httpx.Client(base_url=server, timeout=30) as client:
        r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models/{model_id}", "/tokenize",
                 "/detokenize", "/metrics", "/health"):
        assert f"<code>{path}</code>" in page
    for schema_name in ("ChatCompletionRequest", "ErrorResponse", "Waste"):
        assert f'id="schema-{schema_name}"' in page
    # No script and nothing fetched from elsewhere: every src/href is local or an anchor.
    assert "<script" not in page.lower()
    assert not re.search(r'(src|href)="(https?:)?//', page)


def test_document_and_docs_need_no_key_but_the_api_does():
    with running(fake(), Settings(fake_engine="builtin", api_key="sekret")) as (base, app):
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/openapi.json").status_code == 200
            assert client.get("/docs").status_code == 200
            assert client.get("/v1/models").status_code == 401
