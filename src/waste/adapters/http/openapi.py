"""The OpenAPI 3.1 document (``openapi.json`` beside this module) and its HTML rendering.

``GET /openapi.json`` serves the document; ``GET /docs`` serves a self-contained page rendered
from it here (no script, no stylesheet or font from elsewhere: the server may have no
internet, and neither may its users). Both answer without the API key, like ``/health``.
"""

from __future__ import annotations

import functools
import html
import json
import re
from importlib import resources

from quart import Response

import waste

_METHODS = ("get", "post", "put", "patch", "delete", "head", "options")


@functools.cache
def document() -> dict:
    """The document, with ``info.version`` set to this package's version."""
    text = resources.files(__package__).joinpath("openapi.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    doc["info"]["version"] = waste.__version__
    return doc


@functools.cache
def document_json() -> str:
    return json.dumps(document(), ensure_ascii=False, separators=(",", ":"))


# -- HTML --------------------------------------------------------------------------------------

def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _text(value: object) -> str:
    """Escaped prose, with the document's `code` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(value))


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type_text(schema: dict) -> str:
    """A one-line summary of a schema: its type(s), a reference as a link, enums, const."""
    if not isinstance(schema, dict):
        return ""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f'<a href="#schema-{_e(name)}">{_e(name)}</a>'
    parts = []
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts.append(" | ".join(_type_text(s) for s in schema[key]))
    if "const" in schema:
        parts.append(f"<code>{_e(json.dumps(schema['const']))}</code>")
    kind = schema.get("type")
    if kind is not None and "const" not in schema:
        kinds = kind if isinstance(kind, list) else [kind]
        text = " | ".join(_e(k) for k in kinds)
        if "array" in kinds and isinstance(schema.get("items"), dict):
            text += f" of {_type_text(schema['items'])}"
        parts.append(text)
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"<code>{_e(json.dumps(v))}</code>" for v in schema["enum"]))
    bounds = [f"{k} {schema[k]}" for k in ("minimum", "exclusiveMinimum", "maximum", "minLength",
                                              "minItems", "maxItems", "pattern") if k in schema]
    if bounds:
        parts.append("(" + _e(", ".join(bounds)) + ")")
    return " ".join(parts) or "any"


def _schema_table(schema: dict) -> str:
    props = schema.get("properties") or {}
    if not props:
        return ""
    required = set(schema.get("required") or ())
    rows = "".join(
        f"<tr><td><code>{_e(name)}</code>{' <b>required</b>' if name in required else ''}</td>"
        f"<td>{_type_text(sub)}</td><td>{_text(sub.get('description', '')) if isinstance(sub, dict) else ''}</td></tr>"
        for name, sub in props.items())
    return f"<table><tr><th>field</th><th>type</th><th>notes</th></tr>{rows}</table>"


def _content(content: dict) -> str:
    return "".join(f"<div><code>{_e(media)}</code>: {_type_text(entry.get('schema', {}))}</div>"
                   for media, entry in (content or {}).items())


def _operation(doc: dict, path: str, method: str, op: dict) -> str:
    anchor = _e(op.get("operationId", f"{method}-{path}"))
    out = [f'<section class="op" id="op-{anchor}"><h3><span class="m">{_e(method.upper())}</span> '
           f"<code>{_e(path)}</code> — {_e(op.get('summary', ''))}</h3>"]
    if op.get("description"):
        out.append(f"<p>{_text(op['description'])}</p>")
    security = op.get("security", doc.get("security"))
    out.append("<p>No key needed.</p>" if security == [] else
               "<p>Key: <code>Authorization: Bearer &lt;key&gt;</code> or <code>X-Api-Key</code>, "
               "when the server runs with <code>--api-key</code>.</p>")
    for param in op.get("parameters", ()):
        out.append(f"<p>Path parameter <code>{_e(param['name'])}</code>: {_text(param.get('description', ''))}</p>")
    body = op.get("requestBody")
    if body:
        out.append(f"<h4>Request body</h4><p>{_text(body.get('description', ''))}</p>{_content(body.get('content'))}")
        for media in (body.get("content") or {}).values():
            for name, example in (media.get("examples") or {}).items():
                out.append(f"<p>Example <i>{_e(name)}</i>:</p>"
                           f"<pre>{_e(json.dumps(example.get('value'), indent=1, ensure_ascii=False))}</pre>")
    out.append("<h4>Responses</h4><table><tr><th>status</th><th>meaning</th><th>body</th><th>headers</th></tr>")
    for status, resp in op.get("responses", {}).items():
        if "$ref" in resp:
            resp = doc["components"]["responses"][_ref_name(resp["$ref"])]
        headers = ", ".join(f"<code>{_e(h)}</code>" for h in (resp.get("headers") or {}))
        out.append(f"<tr><td>{_e(status)}</td><td>{_text(resp.get('description', ''))}</td>"
                   f"<td>{_content(resp.get('content'))}</td><td>{headers}</td></tr>")
    out.append("</table></section>")
    return "".join(out)


_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em;color:#222}
code,pre{font-family:ui-monospace,monospace;background:#f3f3f3;padding:0 .2em}
pre{padding:.5em;overflow-x:auto}
table{border-collapse:collapse;margin:.5em 0 1em;width:100%}
td,th{border:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#f7f7f7}.m{display:inline-block;min-width:3.5em;color:#fff;background:#456;
padding:0 .3em;border-radius:3px;font-size:.85em}.op{border-top:1px solid #ccc;margin-top:1.5em}
nav li{margin:.1em 0}
"""


@functools.cache
def docs_html() -> str:
    """The document as one HTML page: an index, every operation, every schema."""
    doc = document()
    info = doc["info"]
    index, ops = [], []
    for path, item in doc["paths"].items():
        for method in _METHODS:
            if method in item:
                op = item[method]
                anchor = _e(op.get("operationId", f"{method}-{path}"))
                index.append(f'<li><a href="#op-{anchor}">{_e(method.upper())} {_e(path)}</a> — '
                             f"{_e(op.get('summary', ''))}</li>")
                ops.append(_operation(doc, path, method, op))
    schemas = []
    for name, schema in doc["components"]["schemas"].items():
        schemas.append(f'<section id="schema-{_e(name)}"><h3>{_e(name)}</h3>'
                       f"<p>{_text(schema.get('description', ''))}</p>"
                       f"<p>{_type_text({k: v for k, v in schema.items() if k != 'properties'})}</p>"
                       f"{_schema_table(schema)}</section>")
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(info['title'])} {_e(info['version'])} — HTTP API</title><style>{_STYLE}</style></head>"
            f"<body><h1>{_e(info['title'])} {_e(info['version'])} — HTTP API</h1>"
            f"<p>{_text(info.get('description', ''))}</p>"
            f'<p>Machine-readable: <a href="/openapi.json">/openapi.json</a> (OpenAPI {_e(doc["openapi"])}).</p>'
            f"<nav><h2>Routes</h2><ul>{''.join(index)}</ul></nav>"
            f"<h2>Operations</h2>{''.join(ops)}<h2>Schemas</h2>{''.join(schemas)}</body></html>")


# -- views -------------------------------------------------------------------------------------

async def openapi_json(state) -> Response:
    return Response(document_json(), 200, content_type="application/json")


async def docs_page(state) -> Response:
    return Response(docs_html(), 200, content_type="text/html; charset=utf-8")
