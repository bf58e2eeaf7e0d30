"""Image parts end to end (docs/HTTP.md §5, §7; docs/XTML.md §3.8) against a vision-enabled fake.

Images are made with Pillow in memory; the fake records each image's W×H and the exact prompt
ids, so the tests check what reached the engine rather than how the server got there.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import struct
import tempfile
import zlib

import httpx
import pytest
from PIL import Image

from tests.contract.serving import fake, running, state_of
from waste.app import Settings

IMAGE_POSITIONS = 5
GLM = {"prelude": "[gMASK]<sop>",
       "system": ["<|system|>", ""], "user": ["<|user|>", ""], "assistant": ["<|assistant|>", ""],
       "open": "<|assistant|><think>", "stop": "<|user|>",
       "think": ["<think>", "</think>"], "effort": "<|system|>Reasoning Effort: {}",
       "image": "<|begin_of_image|><|image|><|end_of_image|>"}


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (37, 23), mode: str = "RGB",
                **save) -> bytes:
    img = Image.new(mode, size)
    if mode in ("RGB", "RGBA"):
        img.putpixel((0, 0), (200, 10, 10) if mode == "RGB" else (200, 10, 10, 128))
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


PNG_URL = data_url(image_bytes())
URL_PARAM = "messages[0].content[1].image_url.url"  # where ask() puts its first image


def header_only_png(width: int, height: int) -> bytes:
    """A PNG signature and IHDR (1-bit grey) claiming width×height, with no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload)))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def ask(*parts, text: str = "What is this?", **extra) -> dict:
    content = [{"type": "text", "text": text}, *parts]
    return {"messages": [{"role": "user", "content": content}], **extra}


def image_url(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "high"}}


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()["error"]


@pytest.fixture(scope="module")
def served():
    engine = fake({"image_positions": IMAGE_POSITIONS}, vision=True)
    with running(engine, Settings(fake_engine="builtin", vision=True)) as (base, app):
        yield base, app


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[0], timeout=20) as c:
        yield c


@pytest.fixture
def engine(served):
    return state_of(served[1]).service.engine


def post(client, body: dict) -> httpx.Response:
    return client.post("/v1/chat/completions", json=body)


# -- accepted images --------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,mode,mime", [
    ("PNG", "RGB", "image/png"), ("PNG", "RGBA", "image/png"), ("PNG", "P", "image/png"),
    ("PNG", "1", "image/png"), ("JPEG", "RGB", "image/jpeg"), ("JPEG", "L", "image/jpeg"),
    ("GIF", "P", "image/gif"), ("WEBP", "RGB", "image/webp"), ("BMP", "RGB", "image/bmp"),
])
def test_formats_are_decoded_at_original_size(client, engine, fmt, mode, mime):
    raw = image_bytes(fmt, (37, 23), mode)
    before = len(engine.record.images)
    r = post(client, ask(image_url(data_url(raw, mime))))
    assert r.status_code == 200, r.text
    # the fake checks len(rgb) == W*H*3, so a non-RGB mode reaching it would have failed
    assert engine.record.images[before:] == [(37, 23)]


def test_mime_type_is_not_trusted(client, engine):
    before = len(engine.record.images)
    r = post(client, ask(image_url(data_url(image_bytes("JPEG", (9, 4)), "image/png"))))
    assert r.status_code == 200 and engine.record.images[before:] == [(9, 4)]
    r = post(client, ask(image_url("data:;base64," + base64.b64encode(image_bytes()).decode())))
    assert r.status_code == 200


def test_no_exif_rotation(client, engine):
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° CW to display": K3's processor ignores it, so do we
    raw = image_bytes("JPEG", (40, 20), exif=exif.tobytes())
    before = len(engine.record.images)
    assert post(client, ask(image_url(data_url(raw, "image/jpeg")))).status_code == 200
    assert engine.record.images[before:] == [(40, 20)]


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": PNG_URL}},
    {"type": "image_url", "image_url": PNG_URL},
    {"type": "image", "image": PNG_URL},
])
def test_part_shapes(client, engine, part):
    before = len(engine.record.images)
    r = post(client, ask(part))
    assert r.status_code == 200, r.text
    assert engine.record.images[before:] == [(37, 23)]


def test_whitespace_and_missing_padding(client, engine):
    # the first width whose PNG needs base64 padding, so that there is padding to strip
    width = next(w for w in range(11, 60) if len(image_bytes(size=(w, 7))) % 3)
    encoded = base64.b64encode(image_bytes(size=(width, 7))).decode()
    assert encoded.endswith("=")
    spaced = "\n".join(encoded[i:i + 60] for i in range(0, len(encoded), 60)).rstrip("=")
    spaced = spaced[:30] + " \t\r\n " + spaced[30:]
    before = len(engine.record.images)
    r = post(client, ask(image_url("data:image/png;base64," + spaced)))
    assert r.status_code == 200, r.text
    assert engine.record.images[before:] == [(width, 7)]


def test_prompt_carries_image_markup_as_special_ids(client, engine):
    body = {"messages": [{"role": "user", "content": [
        image_url(data_url(image_bytes(size=(64, 48)))),
        {"type": "text", "text": "and"},
        image_url(data_url(image_bytes("JPEG", (5, 3)), "image/jpeg"))]}]}
    r = post(client, body)
    assert r.status_code == 200, r.text
    ids = engine.record.prompts[-1]
    sid = engine.special_id

    def block(w: int, h: int) -> list[int]:
        return ([sid("<|media_begin|>"), *map(ord, f"image {w}x{h}"), sid("<|media_content|>")]
                + [sid("<|media_pad|>")] * IMAGE_POSITIONS + [sid("<|media_end|>")])

    user_turn = ([sid("<|open|>"), *map(ord, 'message role="user"'), sid("<|sep|>")]
                 + block(64, 48) + [*map(ord, "and")] + block(5, 3) + [sid("<|close|>")])
    assert any(ids[i:i + len(user_turn)] == user_turn for i in range(len(ids)))
    assert sid("<|kimi_image_placeholder|>") not in ids
    assert r.json()["usage"]["prompt_tokens"] == len(ids)  # image positions included
    assert r.json()["choices"][0]["message"]["content"] == "Echo: and"


def test_typed_placeholder_with_images_is_a_count_mismatch(client, engine):
    before = len(engine.record.prompts)
    r = post(client, ask(image_url(PNG_URL), text="see <|kimi_image_placeholder|> here"))
    err = error_of(r)
    assert (err["code"], err["param"]) == ("invalid_value", "messages")
    assert len(engine.record.prompts) == before


def test_typed_placeholder_without_images_stays_text(client, engine):
    body = {"messages": [{"role": "user", "content": "see <|kimi_image_placeholder|> here"}]}
    r = post(client, body)
    assert r.status_code == 200, r.text
    ids = engine.record.prompts[-1]
    assert engine.special_id("<|kimi_image_placeholder|>") not in ids
    assert engine.special_id("<|media_pad|>") not in ids
    typed = [ord(c) for c in "<|kimi_image_placeholder|>"]
    assert any(ids[i:i + len(typed)] == typed for i in range(len(ids)))
    content = r.json()["choices"][0]["message"]["content"]
    assert content == "Echo: see <|kimi_image_placeholder|> here"


def test_image_request_streams(client, engine):
    before = len(engine.record.images)
    body = ask(image_url(PNG_URL), stream=True)
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert "data: [DONE]" in r.read().decode()
    assert engine.record.images[before:] == [(37, 23)]


def test_image_context_overflow():
    # Positions are known only once the image is encoded (under the engine lock): a blocking
    # request still gets a JSON 400, a stream the late error event with no [DONE] (§4.3).
    engine = fake({"image_positions": 5000}, vision=True)
    with running(engine, Settings(fake_engine="builtin", vision=True)) as (base, _), \
            httpx.Client(base_url=base, timeout=20) as c:
        err = error_of(post(c, {"messages": [{"role": "user", "content": [image_url(PNG_URL)]}]}))
        assert (err["code"], err["param"]) == ("context_length_exceeded", "messages")
        assert "4096" in err["message"]
        r = post(c, {"messages": [{"role": "user", "content": [image_url(PNG_URL)]}],
                     "stream": True})
        assert r.status_code == 200
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1].startswith("data: {\"error\"") and "data: [DONE]" not in events
        assert json.loads(events[-1][len("data: "):])["error"]["code"] == "context_length_exceeded"
        assert engine.record.prompts == []
        assert post(c, {"messages": [{"role": "user", "content": "next"}]}).status_code == 200


# -- refused sources ---------------------------------------------------------------------------

@pytest.fixture
def listener():
    """A loopback socket nobody should connect to: proof that a URL was not fetched."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def assert_never_contacted(sock: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        conn, _ = sock.accept()
        conn.close()


@pytest.mark.parametrize("scheme", ["http", "https", "HTTP", "HtTpS"])
def test_remote_urls_are_refused_unfetched(client, engine, listener, scheme):
    port = listener.getsockname()[1]
    url = f"{scheme}://127.0.0.1:{port}/cat.png"
    before = len(engine.record.prompts)
    err = error_of(post(client, {"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "t"}, image_url(url)]}]}))
    assert err["code"] == "remote_image_refused"
    assert err["param"] == "messages[1].content[1].image_url.url"
    assert "data:" in err["message"]
    assert_never_contacted(listener)
    assert len(engine.record.prompts) == before


@pytest.mark.parametrize("part,param", [
    ({"type": "image_url", "image_url": "https://example.invalid/a.png"},
     "messages[0].content[1].image_url"),
    ({"type": "image", "image": "http://example.invalid/a.png"}, "messages[0].content[1].image"),
])
def test_remote_refusal_names_each_shape_field(client, part, param):
    err = error_of(post(client, ask(part)))
    assert (err["code"], err["param"]) == ("remote_image_refused", param)


@pytest.mark.parametrize("url", ["/etc/hostname", "file:///etc/hostname",
                                 "file://localhost/etc/hostname"])
def test_local_paths_need_the_flag(client, url):
    err = error_of(post(client, ask(image_url(url))))
    assert (err["code"], err["param"]) == ("local_image_refused", URL_PARAM)
    assert "--allow-local-images" in err["message"]


def test_local_files_with_the_flag(tmp_path):
    path = tmp_path / "pic one.png"
    path.write_bytes(image_bytes(size=(21, 13)))
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    engine = fake(vision=True)
    settings = Settings(fake_engine="builtin", vision=True, allow_local_images=True)
    with running(engine, settings) as (base, _), httpx.Client(base_url=base, timeout=20) as c:
        assert post(c, ask(image_url(str(path)))).status_code == 200
        file_url = "file://" + str(path).replace(" ", "%20")
        assert post(c, ask({"type": "image", "image": file_url})).status_code == 200
        assert engine.record.images == [(21, 13), (21, 13)]
        missing = error_of(post(c, ask(image_url(str(tmp_path / "absent.png")))))
        assert (missing["code"], missing["param"]) == ("invalid_image", URL_PARAM)
        junk = error_of(post(c, ask(image_url(str(tmp_path / "junk.png")))))
        assert junk["code"] == "invalid_image"
        remote = error_of(post(c, ask(image_url("https://example.invalid/x.png"))))
        assert remote["code"] == "remote_image_refused"  # the flag never opens the network
        other_host = error_of(post(c, ask(image_url("file://evil.example/" + str(path)))))
        assert other_host["code"] == "invalid_image"


@pytest.mark.parametrize("url", [
    "data:image/png;base64,!!!not-base64!!!",
    "data:image/png;base64,QUJD=A",  # padding in the middle
    data_url(b"hello, this is not an image at all", "image/png"),
    data_url(image_bytes(), "text/plain"),
    "data:image/png," + "x" * 40,  # not base64 at all
    data_url(image_bytes("TIFF"), "image/tiff"),  # a real image, but not an allowed format
    data_url(image_bytes()[:40], "image/png"),  # truncated
    "ftp://example.invalid/a.png",
    "relative/path.png",
    "",
])
def test_invalid_images(client, engine, url):
    before = len(engine.record.images)
    err = error_of(post(client, ask(image_url(url))))
    assert (err["code"], err["param"]) == ("invalid_image", URL_PARAM)
    assert engine.record.images[before:] == []


def test_bad_image_in_a_stream_request_is_plain_json(client):
    r = post(client, ask(image_url("data:image/png;base64,AAAA"), stream=True))
    assert error_of(r)["code"] == "invalid_image"


def test_nine_images_are_too_many_before_decoding(client, engine):
    before = len(engine.record.images)
    # every one is undecodable: the count is checked first
    err = error_of(post(client, ask(*[image_url("data:image/png;base64,AAAA")] * 9)))
    assert (err["code"], err["param"]) == ("too_many_images", "messages")
    spread = {"messages": [{"role": "user", "content": [image_url(PNG_URL)] * 5},
                           {"role": "assistant", "content": "ok"},
                           {"role": "user", "content": [image_url(PNG_URL)] * 4}]}
    assert error_of(post(client, spread))["code"] == "too_many_images"
    assert engine.record.images[before:] == []


def test_eight_images_are_fine(client, engine):
    before = len(engine.record.images)
    r = post(client, ask(*[image_url(PNG_URL)] * 8))
    assert r.status_code == 200, r.text
    assert engine.record.images[before:] == [(37, 23)] * 8


def test_over_50_megapixels_is_too_large(client):
    err = error_of(post(client, ask(image_url(data_url(header_only_png(10_000, 5_001))))))
    assert (err["code"], err["param"]) == ("image_too_large", URL_PARAM)
    huge = error_of(post(client, ask(image_url(data_url(header_only_png(60_000, 60_000))))))
    assert huge["code"] == "image_too_large"


def test_exactly_50_megapixels_is_not_too_large(client):
    # the same header-only trick at the limit passes the size check, then fails to decode
    err = error_of(post(client, ask(image_url(data_url(header_only_png(10_000, 5_000))))))
    assert err["code"] == "invalid_image"


def test_over_20_mib_encoded_is_too_large(client):
    url = "data:image/png;base64," + "A" * (28 * 1024 * 1024)  # 21 MiB decoded
    err = error_of(post(client, ask(image_url(url))))
    assert (err["code"], err["param"]) == ("image_too_large", URL_PARAM)


# -- where images may appear ------------------------------------------------------------------

@pytest.mark.parametrize("role", ["assistant", "system", "developer", "tool"])
def test_image_outside_a_user_message_is_refused(client, role):
    message = {"role": role, "content": [{"type": "text", "text": "x"}, image_url(PNG_URL)]}
    if role == "tool":
        message["tool_call_id"] = "call_1"
    body = {"messages": [{"role": "user", "content": "hi"}, message,
                         {"role": "user", "content": "again"}]}
    err = error_of(post(client, body))
    assert (err["code"], err["param"]) == ("invalid_value", "messages[1].content[1]")


def test_vision_disabled():
    with running(fake(), Settings(fake_engine="builtin")) as (base, app), \
            httpx.Client(base_url=base, timeout=20) as c:
        body = {"messages": [{"role": "system", "content": "s"},
                             {"role": "user", "content": [{"type": "text", "text": "t"},
                                                          {"type": "image", "image": PNG_URL}]}]}
        err = error_of(post(c, body))
        assert (err["code"], err["param"]) == ("vision_disabled", "messages[1].content[1]")
        assert "--vision" in err["message"]
        # checked before the source: a remote URL is still "vision disabled"
        remote = error_of(post(c, ask(image_url("https://example.invalid/a.png"))))
        assert remote["code"] == "vision_disabled"
        assert state_of(app).service.engine.record.images == []


def test_vision_flag_without_a_tower_is_disabled():
    # --vision set, but the engine loaded no tower: still no images
    with running(fake(vision=False), Settings(fake_engine="builtin", vision=True)) as (base, _), \
            httpx.Client(base_url=base, timeout=20) as c:
        assert error_of(post(c, ask(image_url(PNG_URL))))["code"] == "vision_disabled"


def test_format_without_an_image_block_refuses_images_first():
    no_image = {k: v for k, v in GLM.items() if k != "image"}
    engine = fake({"format": "chat.json", "chat_json": no_image}, vision=True)
    with running(engine, Settings(fake_engine="builtin", vision=True)) as (base, _), \
            httpx.Client(base_url=base, timeout=20) as c:
        err = error_of(post(c, ask(image_url("https://example.invalid/a.png"))))
        assert (err["code"], err["param"]) == ("unsupported_by_format", "messages[0].content[1]")


def test_chat_json_image_block(tmp_path):
    engine = fake({"format": "chat.json", "chat_json": GLM}, vision=True)
    with running(engine, Settings(fake_engine="builtin", vision=True)) as (base, _), \
            httpx.Client(base_url=base, timeout=20) as c:
        r = post(c, ask(image_url(data_url(image_bytes(size=(8, 6))))))
        assert r.status_code == 200, r.text
        assert engine.record.images == [(8, 6)]
        ids = engine.record.prompts[-1]
        assert ids.count(engine.special_id("<|image|>")) == 4  # expanded to the fake's 4 positions


# -- no temporary files --------------------------------------------------------------------------

def test_decoding_writes_no_temporary_file(client, engine, tmp_path, monkeypatch):
    watched = tmp_path / "tmp"
    watched.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(watched))  # the server thread shares the module
    used = []
    for name in ("mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile",
                 "SpooledTemporaryFile", "TemporaryDirectory"):
        original = getattr(tempfile, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            used.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(tempfile, name, spy)
    assert tempfile.gettempdir() == str(watched)
    before = len(engine.record.images)
    urls = [data_url(image_bytes(fmt, (30, 20)), "image/x")
            for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP")]
    r = post(client, ask(*map(image_url, urls)))
    assert r.status_code == 200, r.text
    assert engine.record.images[before:] == [(30, 20)] * 5
    assert os.listdir(watched) == [] and used == []
