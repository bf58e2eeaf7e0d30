"""Routes and the request guards of docs/HTTP.md: order of checks, auth, length, CORS, errors.

``register(app, state)`` wires everything onto a QuartTrio app. Routes never open their own
nurseries; the engine worker lives in the app's nursery.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

import attrs
from quart import Response, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import PathConverter

import waste
from waste.adapters.http import generation, openapi
from waste.adapters.http.errors import ApiError, envelope, to_api_error
from waste.adapters.http.exchange import outcome, release_when_exchange_ends
from waste.adapters.http.metrics import CLIENT_CLOSED, CONTENT_TYPE, OUTCOME, Snapshot
from waste.adapters.http.state import ServerState
from waste.adapters.http.wire import dumps, new_id
from waste.domain.errors import InvalidRequest
from waste.domain.ports import ModelInfo

COMPLETION_ROUTES = ("/v1/chat/completions", "/v1/completions")
KEYLESS_ROUTES = ("/health", "/openapi.json", "/docs")
_CLOSE = (("Connection", "close"),)
_CORS_HEADERS = "Authorization, Content-Type, X-Api-Key"


class AnyPathConverter(PathConverter):
    """werkzeug's ``path`` whose ``.`` also matches line breaks: ``/v1/models/a%0d%0a`` is an
    unknown model like ``/v1/models/x/y``, not an unknown route."""

    regex = r"[^/][\s\S]*?"


def json_response(obj: object, status: int = 200, headers=None) -> Response:
    return Response(dumps(obj), status, headers or {}, content_type="application/json")


def error_response(err: ApiError) -> Response:
    headers = dict(err.headers)
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if err.status in (401, 408, 411, 413):
        headers["Connection"] = "close"
    return json_response(envelope(err), err.status, headers)


def register(app, state: ServerState) -> None:
    config = state.config
    cors = bool(config.cors_origins)
    app.asgi_app = release_when_exchange_ends(_count_when_exchange_ends(app.asgi_app, state))
    state.metrics.snapshot = lambda: _snapshot(state)
    app.url_map.converters["anypath"] = AnyPathConverter
    routes = [
        ("/health", ["GET"], _health),
        ("/v1/models", ["GET"], _models),
        ("/v1/models/<anypath:model_id>", ["GET"], _model),
        ("/v1/chat/completions", ["POST"], generation.chat_completions),
        ("/v1/completions", ["POST"], generation.completions),
        ("/metrics", ["GET"], _metrics),
        ("/tokenize", ["POST"], _tokenize),
        ("/detokenize", ["POST"], _detokenize),
        ("/openapi.json", ["GET"], openapi.openapi_json),
        ("/docs", ["GET"], openapi.docs_page),
    ]
    for rule, methods, view in routes:
        app.add_url_rule(rule, view.__name__, _bind(view, state),
                         methods=methods + (["OPTIONS"] if cors else []),
                         provide_automatic_options=False)

    @app.before_serving
    async def watch_shutdown() -> None:
        app.nursery.start_soon(state.cut_uploads_on_shutdown)

    @app.before_request
    async def guards():
        return _guards(state)

    @app.after_request
    async def finish(response: Response) -> Response:
        return _after(state, response)

    @app.errorhandler(ApiError)
    async def api_error(err: ApiError):
        return error_response(err)

    @app.errorhandler(HTTPException)
    async def http_error(err: HTTPException):
        return error_response(_from_werkzeug(err, config.body_timeout_s))

    @app.errorhandler(Exception)
    async def any_error(err: Exception):
        api = to_api_error(err)
        if api.status == 500 and api.code == "internal_error":
            app.logger.exception("unhandled error", exc_info=err)
        return error_response(api)


def _count_when_exchange_ends(asgi_app, state: ServerState):
    """Count every request once, when its exchange ends: with the status its answer ended
    with (a stream records its own), or 499 when the client left first."""

    async def app(scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        record = scope[OUTCOME] = {"route": "other", "status": None,
                                    "arrived": time.perf_counter()}
        try:
            await asgi_app(scope, receive, send)
        finally:
            state.metrics.count_request(record["route"], record["status"] or CLIENT_CLOSED)

    return app


def _bind(view, state):
    async def bound(**kwargs):
        return await view(state, **kwargs)

    bound.__name__ = view.__name__
    return bound


def _from_werkzeug(err: HTTPException, body_timeout_s: float) -> ApiError:
    code = err.code or 500
    if code == 404:
        return ApiError(404, "unknown_route", f"No route {request.path}.", "not_found_error")
    if code == 405:
        allow = ", ".join(sorted(getattr(err, "valid_methods", None) or []))
        return ApiError(405, "method_not_allowed", f"{request.method} is not allowed on "
                        f"{request.path}.", headers=(("Allow", allow),) if allow else ())
    if code == 413:
        return ApiError(413, "request_too_large", "Request body is over 64 MiB.", headers=_CLOSE)
    if code == 408:
        return ApiError(408, "request_timeout", f"The request body did not arrive within "
                        f"{body_timeout_s:g} s.", headers=_CLOSE)
    if code == 400:
        return ApiError(400, "invalid_json", "The request body must be a JSON object.")
    return ApiError(code, "http_error", err.description or "HTTP error")


def _guards(state: ServerState):
    """docs/HTTP.md §2.1 steps 1–3, run before any view."""
    url_rule = request.url_rule
    if url_rule is not None and "//" not in request.scope["path"]:
        outcome()["route"] = url_rule.rule
    if "//" in request.scope["path"]:
        # Paths match exactly (docs/HTTP.md §1). werkzeug would strip leading slashes and merge
        # (or redirect) the others; no route has an empty segment.
        raise NotFound()
    if request.routing_exception is not None:
        raise request.routing_exception
    config = state.config
    if request.method == "OPTIONS" and config.cors_origins:
        return _preflight(state)
    if request.path not in KEYLESS_ROUTES and config.api_key:
        _check_key(config.api_key)
    if request.method == "POST":
        length = request.headers.get("Content-Length")
        if length is None or "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            raise ApiError(411, "length_required", "POST requests need a Content-Length header "
                           "(chunked uploads are not accepted).", headers=_CLOSE)
        if not length.isdigit() or int(length) > config.max_body_bytes:
            raise ApiError(413, "request_too_large",
                           f"Request body is over {config.max_body_bytes} bytes (64 MiB).",
                           headers=_CLOSE)
    return None


def _raw_header(name: bytes) -> bytes | None:
    # The bytes as sent: Quart's str headers are latin-1 decoded, which a UTF-8 key is not.
    for key, value in request.scope["headers"]:
        if key.lower() == name:
            return value
    return None


def _check_key(key: str) -> None:
    """docs/HTTP.md §8: Bearer (scheme in any case) or x-api-key, compared over UTF-8 bytes."""
    given = _raw_header(b"x-api-key")
    scheme, _, token = (_raw_header(b"authorization") or b"").partition(b" ")
    if scheme.lower() == b"bearer":
        given = token.strip()
    if given is None or not hmac.compare_digest(given, key.encode("utf-8")):
        raise ApiError(401, "invalid_api_key", "Missing or wrong API key (send Authorization: "
                       "Bearer <key>).", "authentication_error", headers=_CLOSE)


def _preflight(state: ServerState) -> Response:
    response = Response("", 204)
    response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
    response.headers["Access-Control-Allow-Headers"] = _CORS_HEADERS
    response.headers["Access-Control-Max-Age"] = "600"
    return response


def _after(state: ServerState, response: Response) -> Response:
    if response.mimetype != "text/event-stream":  # a stream records how it ended itself
        outcome()["status"] = response.status_code
    if request.path in COMPLETION_ROUTES and "x-request-id" not in response.headers:
        response.headers["x-request-id"] = new_id("req-")
    origin = request.headers.get("Origin")
    allowed = state.config.cors_origins
    if origin and allowed and ("*" in allowed or origin in allowed):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers.add("Vary", "Origin")
    return response


# -- simple routes ------------------------------------------------------------------------------

async def _health(state: ServerState) -> Response:
    service = state.service
    if service.load_error is not None:
        return json_response({"status": "failed", "model": state.config.model_id,
                              "engine": None, "error": str(service.load_error)}, 503)
    if service.shutting_down:
        return json_response({"status": "shutting_down", "model": state.config.model_id,
                              "engine": None}, 503, {"Retry-After": "5"})
    if state.info is None:
        return json_response({"status": "loading", "model": state.config.model_id,
                              "engine": None}, 503, {"Retry-After": "5"})
    return json_response({
        "status": "ok", "model": state.config.model_id, "engine": state.info.build_info,
        "uptime_s": round(time.monotonic() - state.started, 3),
        "chat_format": state.chat_format.name,
        "queue_depth": service.queue_depth, "queue": service.queue_depths(),
        "generating": service.running is not None, "running": len(service.active),
        "fake_engine": state.config.fake_engine})


def model_object(state: ServerState, info: ModelInfo) -> dict[str, Any]:
    fmt = state.chat_format
    caps = attrs.asdict(fmt.capabilities)
    stats = state.engine.statistics()
    return {
        "id": state.config.model_id, "object": "model",
        "created": int(state.service.opened_at or time.time()), "owned_by": "waste",
        "waste": {
            "arch": info.arch, "n_layers": info.n_layers, "n_experts": info.n_experts,
            "top_k": info.top_k, "n_shared_experts": info.n_shared_experts,
            "hidden": info.hidden, "vocab": info.vocab, "ctx_tokens": info.ctx_tokens,
            "ctx_train": info.ctx_train, "params_total": info.params_total,
            "params_active": info.params_active, "quant": info.quant, "vision": info.vision,
            "direct_io": stats.direct_io, "budget_bytes": stats.budget_bytes or info.budget_bytes,
            "chat_format": {"kind": fmt.name, **caps, "error": fmt.error},
            "defaults": {"max_tokens": state.config.max_tokens,
                         "thinking": state.config.thinking_default},
            "fake_engine": state.config.fake_engine, "engine": info.build_info,
        },
    }


async def _models(state: ServerState) -> Response:
    info = state.require_loaded()
    return json_response({"object": "list", "data": [model_object(state, info)]})


async def _model(state: ServerState, model_id: str) -> Response:
    info = state.require_loaded()
    if model_id != state.config.model_id:
        raise ApiError(404, "model_not_found", f"The model {model_id!r} does not exist; this "
                       f"server serves {state.config.model_id!r}.", "not_found_error", "model")
    return json_response(model_object(state, info))


async def _metrics(state: ServerState) -> Response:
    return Response(state.metrics.render(), 200, content_type=CONTENT_TYPE)


def _snapshot(state: ServerState) -> Snapshot:
    service = state.service
    stats = state.engine.statistics() if service.loaded else None
    info = {"model": state.config.model_id, "version": waste.__version__,
            "chat_format": state.chat_format.name or "none"}
    return Snapshot(cancelled=service.requests_cancelled, queue_depth=service.queue_depth,
                    running=int(service.running is not None), stats=stats, info=info)


def _bool_field(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if type(value) is not bool:
        raise InvalidRequest(f"{name} must be a boolean", name, "invalid_type")
    return value


async def _tokenize(state: ServerState) -> Response:
    body = await generation.read_json_body(state)
    info = state.require_loaded()
    content = body.get("content")
    if content is None:
        raise InvalidRequest("content is required", "content", "missing_required_parameter")
    if not isinstance(content, str):
        raise InvalidRequest("content must be a string", "content", "invalid_type")
    add_special = _bool_field(body, "add_special")
    parse_special = _bool_field(body, "parse_special")
    with_pieces = _bool_field(body, "with_pieces")
    state.require_tokenizer("content")
    tok = state.tokenizer
    ids = await state.call_tokenizer(tok.tokenize_markup if parse_special else tok.tokenize, content)
    if add_special and info.bos_id is not None:
        ids = [info.bos_id] + ids
    if not with_pieces:
        return json_response({"tokens": ids})
    pieces = []
    for token, raw in zip(ids, await state.call_tokenizer(tok.detokenize_pieces, ids)):
        try:
            piece: object = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        pieces.append({"id": token, "piece": piece})
    return json_response({"tokens": pieces})


async def _detokenize(state: ServerState) -> Response:
    body = await generation.read_json_body(state)
    info = state.require_loaded()
    tokens = body.get("tokens")
    if tokens is None:
        raise InvalidRequest("tokens is required", "tokens", "missing_required_parameter")
    if not isinstance(tokens, list):
        raise InvalidRequest("tokens must be a list of token ids", "tokens", "invalid_type")
    for i, token in enumerate(tokens):
        if type(token) is not int:
            raise InvalidRequest(f"tokens[{i}] must be an integer", f"tokens[{i}]", "invalid_type")
        if not 0 <= token < info.vocab:
            raise InvalidRequest(f"tokens[{i}] = {token} is outside [0, {info.vocab})",
                                 f"tokens[{i}]", "invalid_value")
    state.require_tokenizer("tokens")
    raw = await state.call_tokenizer(state.tokenizer.detokenize, tokens)
    return json_response({"content": raw.decode("utf-8", errors="replace")})


__all__ = ["register", "MethodNotAllowed"]
